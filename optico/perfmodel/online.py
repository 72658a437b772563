"""The performance model corrected by a job's own measurements.

After every trial the ratios measured/predicted (MFU, peak memory) are re-fitted;
a prediction for an untried strategy is scaled by the ratios of the measured
strategies, weighted by how similar they are — near a measurement the model
follows it, far away it follows the cluster-wide average. A known OOM says memory
was at least the limit there, which lifts the memory ratio of its neighbours.
"""

from __future__ import annotations

import numpy as np

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import Prediction, predict
from optico.strategy import FIELDS, Strategy
from optico.trial import FailureCategory, Trial, TrialStatus
from optico.workload import Workload

# How much a differing field separates two strategies for the correction's weights.
_DISTANCE = {
    "tensor_model_parallel_size": 1.0,
    "pipeline_model_parallel_size": 1.0,
    "context_parallel_size": 1.0,
    "expert_model_parallel_size": 1.0,
    "virtual_pipeline_model_parallel_size": 0.5,
    "micro_batch_size": 0.7,
    "recompute_granularity": 0.7,
    "sequence_parallel": 0.5,
    "use_distributed_optimizer": 0.5,
}
_OTHER_FIELD = 0.2


_WEIGHTS = np.array([_DISTANCE.get(f, _OTHER_FIELD) for f in FIELDS])


def _values(s: Strategy) -> tuple:
    n = s.normalized()
    return tuple(getattr(n, f) for f in FIELDS)


def distance(a: Strategy, b: Strategy) -> float:
    return float(sum(w for w, x, y in zip(_WEIGHTS, _values(a), _values(b)) if x != y))


class JobModel:
    """Predictions for one workload, cached per signature and corrected by observations."""

    def __init__(self, workload: Workload, constants: Constants | None = None):
        self.workload = workload
        self.constants = constants or load_constants()
        self._cache: dict[str, Prediction] = {}
        self._codes: dict[tuple, dict] = {}  # per field: value -> small int, for vectorised distances
        self._vectors: dict[str, np.ndarray] = {}
        self._mfu_obs: tuple[np.ndarray, np.ndarray] = (np.empty((0, len(FIELDS))), np.empty(0))
        self._mem_obs: tuple[np.ndarray, np.ndarray] = (np.empty((0, len(FIELDS))), np.empty(0))
        self._corrected: dict[tuple[str, str], float] = {}

    def base(self, s: Strategy) -> Prediction:
        sig = s.signature()
        if sig not in self._cache:
            self._cache[sig] = predict(self.workload, s, self.constants)
        return self._cache[sig]

    def _vector(self, s: Strategy) -> np.ndarray:
        sig = s.signature()
        if sig not in self._vectors:
            codes = [self._codes.setdefault(f, {}).setdefault(v, len(self._codes[f]))
                     for f, v in zip(FIELDS, _values(s))]
            self._vectors[sig] = np.array(codes)
        return self._vectors[sig]

    def observe(self, trials: list[Trial]) -> None:
        """Re-fits the corrections from every finished trial (idempotent)."""
        mfu, mem = [], []
        limit = self.workload.cluster.spec.memory_gib
        for t in trials:
            base = self.base(t.strategy)
            if t.status == TrialStatus.OK and t.metrics:
                mfu.append((self._vector(t.strategy), t.metrics.mfu / base.mfu))
                if t.metrics.mem_max_gib:
                    mem.append((self._vector(t.strategy), t.metrics.mem_max_gib / base.mem_gib))
            elif t.failure and t.failure.category == FailureCategory.OOM:
                mem.append((self._vector(t.strategy), max(1.0, 1.02 * limit / base.mem_gib)))

        def stack(obs: list) -> tuple[np.ndarray, np.ndarray]:
            if not obs:
                return np.empty((0, len(FIELDS))), np.empty(0)
            return np.stack([v for v, _ in obs]), np.array([r for _, r in obs])

        self._mfu_obs, self._mem_obs = stack(mfu), stack(mem)
        self._corrected = {}

    def _correction(self, s: Strategy, kind: str) -> float:
        vectors, ratios = self._mfu_obs if kind == "mfu" else self._mem_obs
        if not len(ratios):
            return 1.0
        key = (kind, s.signature())
        if key not in self._corrected:
            dist = ((vectors != self._vector(s)) * _WEIGHTS).sum(axis=1)
            weights = np.exp(-2.0 * dist)
            self._corrected[key] = float((weights * ratios).sum() / weights.sum())
        return self._corrected[key]

    def mfu(self, s: Strategy) -> float:
        return self.base(s).mfu * self._correction(s, "mfu")

    def mem_gib(self, s: Strategy) -> float:
        return self.base(s).mem_gib * self._correction(s, "mem")

    @property
    def limit_gib(self) -> float:
        return self.workload.cluster.spec.memory_gib

    def predicted_oom(self, s: Strategy) -> bool:
        """Out of memory with the configured margin: only clear cases are rejected."""
        return self.mem_gib(s) > self.limit_gib * (1 + self.constants.oom_margin)

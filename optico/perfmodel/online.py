"""The performance model corrected by a job's own measurements.

After every trial the ratios measured/predicted (MFU, peak memory) are re-fitted;
a prediction for an untried strategy is scaled by the ratios of the measured
strategies, weighted by how similar they are — near a measurement the model
follows it, far away it follows the cluster-wide average. A known OOM says memory
was at least the limit there, which lifts the memory ratio of its neighbours.
"""

from __future__ import annotations

import math

import numpy as np

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import Prediction, predict
from optico.knobs import BY_NAME
from optico.strategy import FIELDS, Strategy
from optico.trial import FailureCategory, Trial, TrialStatus
from optico.workload import Workload

# How much a differing field separates two strategies for the correction's weights (the knob
# registry's `similarity`: parallel sizes 1, micro-batch and recompute 0.7, ...).
_WEIGHTS = np.array([BY_NAME[f].similarity for f in FIELDS])


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
        self._corrected: dict[str, np.ndarray] = {}
        self._pool_index: dict[str, int] = {}
        self._pool_matrix = np.empty((0, len(FIELDS)))

    def prime(self, pool: list[Strategy]) -> None:
        """Registers the strategies the job will ask about, so corrections are computed for all at once."""
        self._pool_index = {s.signature(): i for i, s in enumerate(pool)}
        self._pool_matrix = np.stack([self._vector(s) for s in pool]) if pool else np.empty((0, len(FIELDS)))
        self._corrected = {}

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

    @staticmethod
    def _weighted(points: np.ndarray, vectors: np.ndarray, ratios: np.ndarray) -> np.ndarray:
        """Similarity-weighted mean of `ratios` for each row of `points`."""
        dist = ((points[:, None, :] != vectors[None, :, :]) * _WEIGHTS).sum(axis=2)
        weights = np.exp(-2.0 * dist)
        return (weights * ratios).sum(axis=1) / weights.sum(axis=1)

    def _correction(self, s: Strategy, kind: str) -> float:
        vectors, ratios = self._mfu_obs if kind == "mfu" else self._mem_obs
        if not len(ratios):
            return 1.0
        sig = s.signature()
        if kind not in self._corrected and self._pool_index:
            self._corrected[kind] = self._weighted(self._pool_matrix, vectors, ratios)  # whole pool at once
        if kind in self._corrected and sig in self._pool_index:
            return float(self._corrected[kind][self._pool_index[sig]])
        return float(self._weighted(self._vector(s)[None, :], vectors, ratios)[0])

    def mfu(self, s: Strategy) -> float:
        return self.base(s).mfu * self._correction(s, "mfu")

    def mem_gib(self, s: Strategy) -> float:
        return self.base(s).mem_gib * self._correction(s, "mem")

    @property
    def limit_gib(self) -> float:
        return self.workload.cluster.spec.memory_gib

    def fit_probability(self, s: Strategy, spread: float = 0.04) -> float:
        """Chance the run fits in memory, taking the prediction as normal with `spread` relative error."""
        mem = self.mem_gib(s)
        return 0.5 * (1.0 + math.erf((self.limit_gib - mem) / (spread * mem * math.sqrt(2.0))))

    def expected_mfu(self, s: Strategy) -> float:
        """MFU weighted by the chance of fitting: a launch that runs out of memory measures nothing."""
        return self.mfu(s) * self.fit_probability(s)

    def predicted_oom(self, s: Strategy) -> bool:
        """Out of memory with the configured margin: only clear cases are rejected."""
        return self.mem_gib(s) > self.limit_gib * (1 + self.constants.oom_margin)

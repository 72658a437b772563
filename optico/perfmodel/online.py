"""The performance model corrected by a job's own measurements.

MFU and peak memory: a Gaussian process on the model's log error over configurations
(`optico.perfmodel.residual.ResidualGP`) is re-fitted after every trial. A prediction for an
untried configuration is the model's, moved by what the trials say about the knob values, knob
pairs and workload it shares with them, and comes with a standard deviation: how far off the model
may still be there. The memory GP also learns errors by component (`MEMORY_COMPONENTS_SD`: an
activation factor, a logits factor, fixed GiB), which move each configuration by its own share of
that component. A known OOM says memory was at least the limit there (a point just above it),
which lifts the memory of the configurations that share its knob values; the chance of fitting reads
the memory posterior's spread, so a configuration near the limit and far from every measurement is
a risk, not a certainty.

`SWITCHES` turns parts off for the benchmark's ablations (`optico bench --ablations`): the online
correction, the guard's memory prediction, and the residual GPs' prior scaled to the job's errors.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, replace
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from scipy.special import erf

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import Prediction, predict
from optico.knobs import BY_NAME
from optico.perfmodel.residual import ResidualGP, ResidualPrior

# The memory model's error (optico perfmodel evaluate: peak memory off by ~14 % median on shared data,
# 3 % on our H100 rows): smaller than MFU's per knob, and measured with little noise.
MEMORY_PRIOR = ResidualPrior(offset=0.08, main=0.05, pair=0.03, config=0.02, noise=0.01)
FIT_NOISE = 0.03  # run-to-run peak-memory spread around the posterior (allocator, fragmentation)
# Beside it, the model's memory may be off by component: activations by a factor (kernels keep tensors
# the model does not count, or free some it does), the loss's logits by a factor, and a fixed amount
# per GPU (CUDA context, NCCL buffers, allocator). Prior standard deviations of (activation factor - 1,
# logits factor - 1, fixed GiB); an error of that kind moves every configuration by its own share
# of that component, which a knob-by-knob correction cannot express.
MEMORY_COMPONENTS_SD = (0.2, 0.2, 2.0)
from optico.strategy import FIELDS, Strategy
from optico.trial import FailureCategory, Trial, TrialStatus
from optico.workload import Workload

# How much a differing field separates two strategies for the correction's weights (the knob
# registry's `similarity`: parallel sizes 1, micro-batch and recompute 0.7, ...).
_WEIGHTS = np.array([BY_NAME[f].similarity for f in FIELDS])


class Belief(NamedTuple):
    """What the job believes about one configuration under the current fit."""

    log_mfu: float  # posterior mean of log MFU (the model's, corrected)
    log_mfu_sd: float  # its standard deviation
    fit: float  # chance the run fits in memory
    mem_gib: float  # expected peak memory (the model's, corrected)
    mem_log_error: float  # posterior mean of log(true memory / model memory)
    mem_log_error_sd: float  # its standard deviation


@dataclass(frozen=True)
class ModelSwitches:
    """Parts of the job model the benchmark's ablations can turn off."""

    online_correction: bool = True  # re-fit to the job's trials (off: the model as calibrated)
    oom_guard: bool = True  # the guard may reject a configuration the model expects not to fit
    adaptive_prior: bool = True  # the residual GPs scale their prior to the job's own errors


SWITCHES = ModelSwitches()


@contextmanager
def switched(**changes: bool) -> Iterator[ModelSwitches]:
    """Runs a block with some of `SWITCHES` changed (the benchmark's ablations)."""
    global SWITCHES
    old = SWITCHES
    SWITCHES = replace(old, **changes)
    try:
        yield SWITCHES
    finally:
        SWITCHES = old


# Predictions are pure (workload, strategy, constants) -> Prediction: shared by the jobs of one
# process (the benchmark runs many jobs on one workload), the last few workloads kept.
_SHARED: OrderedDict[tuple, dict[str, Prediction]] = OrderedDict()
_SHARED_WORKLOADS = 8


def _shared_cache(workload: Workload, constants: Constants) -> dict[str, Prediction]:
    key = (workload.model_dump_json(), constants)
    if key in _SHARED:
        _SHARED.move_to_end(key)
    else:
        _SHARED[key] = {}
        while len(_SHARED) > _SHARED_WORKLOADS:
            _SHARED.popitem(last=False)
    return _SHARED[key]


def _values(s: Strategy) -> tuple:
    n = s.normalized()
    return tuple(getattr(n, f) for f in FIELDS)


def distance(a: Strategy, b: Strategy) -> float:
    return float(sum(w for w, x, y in zip(_WEIGHTS, _values(a), _values(b)) if x != y))


# Predicting a job's whole pool may take at most this long. A legitimate space takes seconds to a
# minute; a 95,000-configuration space of a 1,024-stage model took ~20 minutes before its first trial.
POOL_PREDICT_SECONDS = 300.0


class SpaceTooLarge(ValueError):
    """The search space has more configurations than can be modelled in POOL_PREDICT_SECONDS."""


class JobAbandoned(RuntimeError):
    """The job's run has ended (interrupted, cancelled, its lease lost) while a computation for it was
    still going: the computation stops rather than keep its thread, and so the process, alive."""


class JobModel:
    """Predictions for one workload, cached per signature and corrected by observations."""

    def __init__(self, workload: Workload, constants: Constants | None = None,
                 prior: ResidualPrior | None = None):
        self.workload = workload
        self.constants = constants or load_constants()
        self.prior = prior or ResidualPrior()
        self._cache = _shared_cache(workload, self.constants)
        self._codes: dict[str, dict] = {}  # per field: value -> small int
        self._vectors: dict[str, np.ndarray] = {}
        self._columns = np.arange(len(FIELDS))  # the fields the residual model reads
        self._gp, self._mem_gp = self._residual_models(len(FIELDS))
        self._mfu_measured: dict[str, float] = {}  # signature -> mean measured MFU (OK trials)
        self._measured_strategies: dict[str, Strategy] = {}
        self._largest_measured_gib = 0.0  # the model's memory for the largest configuration measured
        self._now: dict[str, Belief] = {}  # signature -> belief under the current fit
        self._pool_now: np.ndarray | None = None  # the pool's beliefs under the current fit, a row each
        self.fit_id = 0  # changes with every fit: what a caller may cache answers against
        self._observed: tuple | None = None  # what the current fit was made from
        self._pool_index: dict[str, int] = {}
        self._pool: list[Strategy] = []
        self._pool_matrix = np.empty((0, len(FIELDS)))
        self._pool_base: tuple[np.ndarray, ...] | None = None  # the pool's model MFU, memory, memory features
        self._abandoned = threading.Event()

    # -- set-up ---------------------------------------------------------------------------
    def prime(self, pool: list[Strategy]) -> None:
        """Registers the strategies the job will ask about, so corrections are computed for all at
        once; the residual model reads only the fields that vary within the pool."""
        self._pool = list(pool)
        self._pool_index = {s.signature(): i for i, s in enumerate(pool)}
        self._pool_matrix = np.stack([self._vector(s) for s in pool]) if pool else np.empty((0, len(FIELDS)))
        self._pool_base = None
        if len(pool) > 1:
            varying = np.flatnonzero((self._pool_matrix != self._pool_matrix[0]).any(axis=0))
            self._columns = varying if len(varying) else np.arange(len(FIELDS))
        self._gp, self._mem_gp = self._residual_models(len(self._columns))
        self._now, self._pool_now, self._observed = {}, None, None
        self.fit_id += 1

    def _residual_models(self, n_fields: int) -> tuple[ResidualGP, ResidualGP]:
        """Fresh residual GPs (MFU, memory) over `n_fields` knobs."""
        adapt = SWITCHES.adaptive_prior
        return (ResidualGP(n_fields, self.prior, adapt=adapt),
                ResidualGP(n_fields, MEMORY_PRIOR, adapt=adapt, feature_sd=MEMORY_COMPONENTS_SD))

    def _memory_features(self, strategies: list[Strategy]) -> np.ndarray:
        """Per strategy, the share of the model's peak memory that each component of
        MEMORY_COMPONENTS_SD moves: activations / total, logits / total, 1 GiB / total."""
        rows = [(m.activations_gib / m.total_gib, m.logits_gib / m.total_gib, 1.0 / m.total_gib)
                for m in (self.base(s).memory for s in strategies)]
        return np.array(rows, dtype=float).reshape(len(strategies), 3)

    def abandon(self) -> None:
        """The job's run has ended: every later prediction not already made raises JobAbandoned. A
        large space takes minutes to predict in an agent's thread, which Ctrl-C cannot stop and the
        process waits for on its way out (a 95,000-configuration space held `tune` for 10 minutes)."""
        self._abandoned.set()

    def _pool_predictions(self) -> list[Prediction]:
        """The model's prediction for every configuration of the pool, within POOL_PREDICT_SECONDS."""
        started, out = time.monotonic(), []
        for n, s in enumerate(self._pool):
            if n % 256 == 0 and time.monotonic() - started > POOL_PREDICT_SECONDS:
                raise SpaceTooLarge(
                    f"search_space: modelling {n:,} of its {len(self._pool):,} configurations took over "
                    f"{POOL_PREDICT_SECONDS:g} s; tune fewer knobs or list fewer values")
            out.append(self.base(s))
        return out

    def base(self, s: Strategy) -> Prediction:
        sig = s.signature()
        if sig not in self._cache:
            if self._abandoned.is_set():
                raise JobAbandoned("the job's run has ended")
            self._cache[sig] = predict(self.workload, s, self.constants)
        return self._cache[sig]

    def _vector(self, s: Strategy) -> np.ndarray:
        sig = s.signature()
        if sig not in self._vectors:
            codes = [self._codes.setdefault(f, {}).setdefault(v, len(self._codes[f]))
                     for f, v in zip(FIELDS, _values(s))]
            self._vectors[sig] = np.array(codes)
        return self._vectors[sig]

    # -- observations ---------------------------------------------------------------------
    def observe(self, trials: list[Trial]) -> None:
        """Re-fits the corrections from every finished trial (idempotent: the same trials again
        keep the fit, as the agents and the stopping rule each observe once per iteration)."""
        if not SWITCHES.online_correction:
            trials = []
        observed = tuple((t.signature, t.status, t.metrics.mfu if t.metrics else None,
                          t.metrics.mem_max_gib if t.metrics else None,
                          t.failure.category if t.failure else None) for t in trials)
        if observed == self._observed:
            return
        mfu: dict[str, list[float]] = {}
        strategies: dict[str, Strategy] = {}
        mem: dict[str, list[float]] = {}
        limit = self.workload.cluster.spec.memory_gib
        largest = 0.0
        for t in trials:
            base = self.base(t.strategy)
            strategies.setdefault(t.signature, t.strategy)
            if t.status == TrialStatus.OK and t.metrics:
                mfu.setdefault(t.signature, []).append(t.metrics.mfu)
                if t.metrics.mem_max_gib:
                    mem.setdefault(t.signature, []).append(math.log(t.metrics.mem_max_gib / base.mem_gib))
                    largest = max(largest, base.mem_gib)
            elif t.failure and t.failure.category == FailureCategory.OOM:
                mem.setdefault(t.signature, []).append(max(0.0, math.log(1.02 * limit / base.mem_gib)))
        # A configuration measured twice is one point with less noise; the GP sees the mean.
        self._mfu_measured = {sig: float(np.mean(v)) for sig, v in mfu.items()}
        self._measured_strategies = {sig: strategies[sig] for sig in mfu}
        self._gp.fit(*self._points(strategies, {sig: [math.log(self._mfu_measured[sig] /
                                                                 self.base(strategies[sig]).mfu)]
                                                     for sig in mfu}))
        self._mem_gp.fit(*self._points(strategies, mem), self._memory_features([strategies[sig] for sig in mem]))
        self._largest_measured_gib = largest
        self._now, self._pool_now, self._observed = {}, None, observed
        self.fit_id += 1

    def _points(self, strategies: dict[str, Strategy], values: dict[str, list[float]]
                ) -> tuple[np.ndarray, np.ndarray]:
        if not values:
            return np.empty((0, len(self._columns)), dtype=np.int64), np.empty(0)
        X = np.stack([self._vector(strategies[sig])[self._columns] for sig in values])
        return X, np.array([float(np.mean(v)) for v in values.values()])

    @property
    def measured(self) -> dict[str, float]:
        """Signature -> mean measured MFU of the configurations that ran."""
        return dict(self._mfu_measured)

    def incumbent_mfu(self) -> float:
        """The best measured configuration's MFU as the corrected model sees it: the measurement
        smoothed by the residual model, so one lucky run does not set the bar (0 before any run)."""
        return max((self.mfu(s) for s in self._measured_strategies.values()), default=0.0)

    # -- corrections ----------------------------------------------------------------------
    def _beliefs(self, Z: np.ndarray, base_mfu: np.ndarray, base_mem: np.ndarray, mem_features: np.ndarray
                 ) -> list[np.ndarray]:
        """`Belief`'s fields, as arrays, at the configurations `Z` (codes of the residual model's
        columns) whose model MFU and memory are `base_mfu`, `base_mem` (and memory components
        `mem_features`), under the current fit."""
        mean, sd = self._gp.predict(Z)
        mem_mean, mem_sd = self._mem_gp.predict(Z, mem_features)
        # Beyond every configuration measured, a correction may warn but not reassure: memory errors
        # are not one ratio across sizes (fixed overheads, per-layer terms), and a ratio learned on
        # smaller configurations promises larger ones a fit they may not have.
        warn_only = np.where(base_mem > self._largest_measured_gib, np.maximum(mem_mean, 0.0), mem_mean)
        margin = np.log(self.limit_gib / base_mem) - warn_only
        fit = 0.5 * (1.0 + erf(margin / (np.sqrt(mem_sd * mem_sd + FIT_NOISE**2) * math.sqrt(2.0))))
        return [np.log(base_mfu) + mean, sd, fit, base_mem * np.exp(mem_mean), mem_mean, mem_sd]

    def belief(self, s: Strategy) -> Belief:
        """The job's belief about `s` under the current fit. The agents and the guard ask about every
        candidate several times an iteration: the whole pool is answered in one pass after each fit,
        anything outside it one at a time."""
        sig = s.signature()
        found = self._now.get(sig)
        if found is not None:
            return found
        i = self._pool_index.get(sig)
        if i is not None:
            if self._pool_now is None:  # not answered since the last fit
                self._answer_pool()
            # (Another thread may still be filling `_now` from the same rows.)
            return self._now.get(sig) or Belief._make(self._pool_now[i].tolist())
        base = self.base(s)
        arrays = self._beliefs(self._vector(s)[None, self._columns], np.array([base.mfu]), np.array([base.mem_gib]),
                               self._memory_features([s]))
        found = self._now[sig] = Belief._make(float(a[0]) for a in arrays)
        return found

    def _answer_pool(self) -> None:
        """Every pool configuration's belief under the current fit, in one array pass and one conversion."""
        if self._pool_base is None:  # the model's own predictions: the same for the whole job
            bases = self._pool_predictions()
            self._pool_base = (np.array([b.mfu for b in bases]), np.array([b.mem_gib for b in bases]),
                               self._memory_features(self._pool))
        self._pool_now = np.column_stack(self._beliefs(self._pool_matrix[:, self._columns], *self._pool_base))
        rows = self._pool_now.tolist()
        self._now.update({k: Belief._make(rows[j]) for k, j in self._pool_index.items()})

    def log_error(self, s: Strategy) -> tuple[float, float]:
        """Posterior (mean, standard deviation) of log(true MFU / model MFU) at `s`."""
        b = self.belief(s)
        return b.log_mfu - math.log(self.base(s).mfu), b.log_mfu_sd

    def mem_log_error(self, s: Strategy) -> tuple[float, float]:
        """Posterior (mean, standard deviation) of log(true peak memory / model memory) at `s`."""
        b = self.belief(s)
        return b.mem_log_error, b.mem_log_error_sd

    # -- what the agents and the guard ask ------------------------------------------------
    def mfu(self, s: Strategy) -> float:
        """Expected MFU: the model's, corrected by the posterior mean of its log error."""
        return math.exp(self.belief(s).log_mfu)

    def mfu_sd(self, s: Strategy) -> float:
        """Standard deviation of log MFU at `s` (how unsure the corrected model still is)."""
        return self.belief(s).log_mfu_sd

    def mem_gib(self, s: Strategy) -> float:
        """Expected peak memory: the model's, corrected by the posterior mean of its log error."""
        return self.belief(s).mem_gib

    @property
    def limit_gib(self) -> float:
        return self.workload.cluster.spec.memory_gib

    def fit_probability(self, s: Strategy) -> float:
        """Chance the run fits in memory under the memory posterior (plus run-to-run spread); for a
        configuration larger than any measured, the posterior may only raise its memory."""
        return self.belief(s).fit

    def expected_mfu(self, s: Strategy) -> float:
        """MFU weighted by the chance of fitting: a launch that runs out of memory measures nothing."""
        return self.mfu(s) * self.fit_probability(s)

    def predicted_oom(self, s: Strategy) -> bool:
        """Out of memory with the configured margin: only clear cases are rejected."""
        if not SWITCHES.oom_guard:
            return False
        return self.belief(s).mem_gib > self.limit_gib * (1 + self.constants.oom_margin)

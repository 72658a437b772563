"""Baselines a competent user would run instead of OptiCo's agents.

Every baseline gets what OptiCo gets: the landscape's configuration set, its launcher, the same
trial budget, and the tuner-side performance model (`Landscape.job_model()`: the landscape's
calibration — held out for real landscapes — and no knowledge of the landscape's truth). A launch
counts against the budget whatever its outcome; what the model predicts to run out of memory is
filtered for free (never launched), as OptiCo's guard does.

- `model-rank`: the cost model's top configurations in order, no feedback (a cost-model-only search,
  the kind Galvatron or Aceso run).
- `model-greedy`: the argmax of the job model, re-fitted to every measurement (the same online
  correction OptiCo's agents read), behind OptiCo's own guard (duplicates, known failures, implied and
  predicted OOMs).
- `random-fit`: random order over the configurations the model expects to fit.
- `tpe`: Optuna's TPE sampler with every ordered knob (sizes, micro-batch, VPP, recompute level) an
  ordered integer index and flags categorical; starts from OptiCo's first configuration
  (`start_configuration`); a suggestion is mapped to the nearest admissible configuration (valid,
  untried, predicted to fit), so no suggestion is wasted on an invalid combination.
- `tpe-warm`: the same, warm-started with the model's top `WARM_K` configurations after the start.
- `gp-warm`: Optuna's GPSampler (a GP with a mixed Matern/Hamming kernel, log expected improvement)
  with the same warm start, its acquisition maximised exactly over the admissible configurations.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any

import numpy as np

from optico.agents.seeding import start_configuration
from optico.bench.landscapes import Landscape, failure_kind
from optico.bench.tuners import TrialOutcome
from optico.guard import Guard
from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Failure, FailureCategory, Trial, TrialStatus

WARM_K = 5  # the model's top configurations a warm-started baseline launches first
_CATEGORY = {"oom": FailureCategory.OOM, "hang": FailureCategory.HANG, "not_measured": FailureCategory.NOT_MEASURED}


def run_one(landscape: Landscape, launcher: Any, s: Strategy, index: int, key: str) -> tuple[TrialOutcome, Trial]:
    """One launch: the benchmark's record and the trial as OptiCo's model and guard read it."""
    r = asyncio.run(launcher.launch(landscape.workload, s, trial_key=key))
    ok = r.ok and r.metrics is not None
    kind = None if ok else failure_kind(r)
    outcome = TrialOutcome(index=index, signature=s.signature(), config=s.short(), ok=ok,
                           measured_mfu=r.metrics.mfu if ok else None,
                           true_mfu=landscape.true_mfu(s) if ok else None, failure=kind, gpu_seconds=r.gpu_seconds)
    trial = Trial(id=index, job_id=0, index=index, strategy=s, signature=s.signature(),
                  status=TrialStatus.OK if ok else TrialStatus.FAILED, metrics=r.metrics if ok else None,
                  failure=None if ok else Failure(category=_CATEGORY.get(kind or "", FailureCategory.UNKNOWN),
                                                  summary=kind or "error", confidence=90),
                  gpu_seconds=r.gpu_seconds)
    return outcome, trial


def _model(landscape: Landscape) -> JobModel:
    model = landscape.job_model()
    model.prime(landscape.candidates)
    return model


def _guard(landscape: Landscape, model: JobModel) -> Guard:
    return Guard(landscape.workload, landscape.space, model,
                 landscape.candidates if landscape.kind == "replay" else None)


def model_ranking(landscape: Landscape, model: JobModel) -> list[Strategy]:
    """Configurations the model expects to fit, best expected MFU first."""
    fit = [s for s in landscape.candidates if not model.predicted_oom(s)] or list(landscape.candidates)
    return sorted(fit, key=lambda s: -model.expected_mfu(s))


class ModelRank:
    name = "model-rank"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        launcher = landscape.launcher(seed)
        ranked = model_ranking(landscape, _model(landscape))
        return [run_one(landscape, launcher, s, k, f"{self.name}-{k}")[0] for k, s in enumerate(ranked[:budget], 1)]


class ModelGreedy:
    name = "model-greedy"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        launcher = landscape.launcher(seed)
        model = _model(landscape)
        guard = _guard(landscape, model)
        out: list[TrialOutcome] = []
        trials: list[Trial] = []
        while len(out) < budget:
            model.observe(trials)
            admissible = [s for s, v in zip(landscape.candidates, guard.check_all(landscape.candidates, trials))
                          if v.admitted]
            if not admissible:
                break
            best = max(admissible, key=model.expected_mfu)
            outcome, trial = run_one(landscape, launcher, best, len(out) + 1, f"{self.name}-{len(out) + 1}")
            out.append(outcome)
            trials.append(trial)
        return out


class RandomFit:
    name = "random-fit"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        launcher = landscape.launcher(seed)
        model = _model(landscape)
        fit = [s for s in landscape.candidates if not model.predicted_oom(s)] or list(landscape.candidates)
        order = np.random.default_rng(seed).permutation(len(fit))[:budget]
        return [run_one(landscape, launcher, fit[i], k, f"{self.name}-{k}")[0] for k, i in enumerate(order, 1)]


# -- Optuna ----------------------------------------------------------------------------------

def _encoding(landscape: Landscape) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """(Optuna distributions, candidates' codes (N x F), which columns are ordered).

    A knob whose values are sizes or levels (integers, VPP with None first, recompute none <
    selective < full) is an ordered index (IntDistribution); a flag or a dispatcher is categorical."""
    import optuna

    tunables = {f: v for f, v in landscape.space.tunables.items() if len(v) > 1}
    dists: dict[str, Any] = {}
    ordered = []
    for f, values in tunables.items():
        is_ordered = not all(isinstance(v, bool) for v in values) and f != "moe_token_dispatcher_type"
        ordered.append(is_ordered)
        dists[f] = optuna.distributions.IntDistribution(0, len(values) - 1) if is_ordered else \
            optuna.distributions.CategoricalDistribution(list(range(len(values))))
    codes = np.array([[_index(values, getattr(s.normalized(), f)) for f, values in tunables.items()]
                      for s in landscape.candidates])
    return dists, codes, np.array(ordered, dtype=bool)


def _index(values: list[Any], v: Any) -> int:
    if v in values:
        return values.index(v)
    return values.index(None) if v == 1 and None in values else 0  # VPP 1 is "no VPP"


class OptunaSearch:
    """TPE or GP over the encoded space; see the module docstring."""

    def __init__(self, name: str, sampler: str, warm: int = 0):
        self.name, self.sampler, self.warm = name, sampler, warm

    def _make_sampler(self, seed: int, n_startup: int) -> Any:
        import optuna

        if self.sampler == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(n_startup, 5))
        return _candidate_gp_class()(seed=seed, n_startup_trials=max(n_startup, 3), warn_independent_sampling=False)

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.ERROR)
        launcher = landscape.launcher(seed)
        model = _model(landscape)
        guard = _guard(landscape, model)
        dists, codes, ordered = _encoding(landscape)
        names = list(dists)
        span = np.maximum(codes.max(axis=0) - codes.min(axis=0), 1) if len(codes) else np.ones(len(names))
        start = start_configuration(landscape.candidates, model, [])[0]
        first = [start] + [s for s in model_ranking(landscape, model)[: self.warm + 1] if s != start][: self.warm]
        sampler = self._make_sampler(seed, len(first))
        study = optuna.create_study(direction="maximize", sampler=sampler)
        index = {s.signature(): i for i, s in enumerate(landscape.candidates)}
        for s in first:
            study.enqueue_trial({n: int(c) for n, c in zip(names, codes[index[s.signature()]])})
        out: list[TrialOutcome] = []
        trials: list[Trial] = []
        while len(out) < budget:
            admissible = [i for i, v in enumerate(guard.check_all(landscape.candidates, trials)) if v.admitted]
            if not admissible:
                break
            if self.sampler == "gp":
                sampler.candidates = [{n: int(c) for n, c in zip(names, codes[i])} for i in admissible]
            trial = study.ask(dists)
            want = np.array([trial.params[n] for n in names])
            gap = np.where(ordered, np.abs(codes[admissible] - want) / span, codes[admissible] != want).sum(axis=1)
            pick = admissible[int(np.argmin(gap))]  # the nearest admissible configuration
            s = landscape.candidates[pick]
            outcome, t = run_one(landscape, launcher, s, len(out) + 1, f"{self.name}-{len(out) + 1}")
            out.append(outcome)
            trials.append(t)
            value = outcome.measured_mfu if outcome.ok else 0.0
            params = {n: int(c) for n, c in zip(names, codes[pick])}
            if params == trial.params:
                study.tell(trial, value)
            else:  # told as what ran: the suggestion itself was never launched
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
        return out


@lru_cache(maxsize=1)
def _candidate_gp_class() -> type:
    import optuna

    class CandidateGP(optuna.samplers.GPSampler):
        """GPSampler whose acquisition is maximised exactly over `candidates` (parameter dicts)."""

        candidates: list[dict[str, int]] = []

        def _optimize_acqf(self, acqf: Any, best_params: Any) -> np.ndarray:
            if not self.candidates:
                return super()._optimize_acqf(acqf, best_params)
            x = acqf.search_space.get_normalized_params([None] * len(self.candidates), self.candidates)
            return x[int(np.argmax(acqf.eval_acqf_no_grad(x)))]

    return CandidateGP


BASELINES: dict[str, Any] = {
    "model-rank": ModelRank,
    "model-greedy": ModelGreedy,
    "random-fit": RandomFit,
    "tpe": lambda: OptunaSearch("tpe", "tpe"),
    "tpe-warm": lambda: OptunaSearch("tpe-warm", "tpe", warm=WARM_K),
    "gp-warm": lambda: OptunaSearch("gp-warm", "gp", warm=WARM_K),
}

"""The tuners under test, behind one small contract.

`Tuner.run(landscape, budget, seed)` returns the trials it spent, in order, as
`TrialOutcome`s. Every tuner gets the same landscape — the same workload, the same
configuration set (`landscape.candidates`: the space's valid configurations, or what a replay
table measured) and the same launcher (`landscape.launcher(seed)`) — and at most `budget`
launches. A tuner never reads the landscape's truth; only the metrics do.

- `optico`: the product — the LangGraph loop with its agents, guard and job model, driven by
  `optico.runner.run_job` on a throwaway SQLite pool (no warm start from other runs), cold
  (no baseline), with the product's stopping rules (it may stop before the budget).
- `random`: valid configurations in a seeded random order.
- `grid`: valid configurations in the space's enumeration order (domain order).
- `optuna`: Optuna's TPE sampler, a categorical per tunable; Megatron-invalid and
  unmeasurable combinations are never launched — they are told to the study as infeasible
  through TPE's constraints (`Trial.set_constraint`; failed runs too, with objective 0) and
  cost no budget; a repeat of a measured configuration is answered from the earlier run, also
  free. After `MAX_ASKS_PER_LAUNCH` suggestions per launch the rest of the budget goes to
  untried valid configurations in random order.
- `expert`: the landscape's expert configuration, one launch.
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from optico.bench.landscapes import Landscape, failure_kind
from optico.spec import ReasonerSpec
from optico.strategy import Strategy
from optico.trial import TrialStatus


@dataclass(frozen=True)
class TrialOutcome:
    """One launch: what the tuner saw (measured MFU, failure) and what it was worth (true MFU)."""

    index: int
    signature: str
    config: str
    ok: bool
    measured_mfu: float | None
    true_mfu: float | None
    failure: str | None
    gpu_seconds: float


class Tuner(Protocol):
    """Given a landscape, a trial budget and a seed, spends at most `budget` launches."""

    name: str

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        ...


def launch(landscape: Landscape, launcher: Any, s: Strategy, index: int, key: str) -> TrialOutcome:
    """Runs `s` once on the landscape's launcher."""
    r = asyncio.run(launcher.launch(landscape.workload, s, trial_key=key))
    mfu = r.metrics.mfu if r.ok and r.metrics else None
    return TrialOutcome(index=index, signature=s.signature(), config=s.short(), ok=mfu is not None,
                        measured_mfu=mfu, true_mfu=landscape.true_mfu(s) if mfu is not None else None,
                        failure=None if mfu is not None else failure_kind(r), gpu_seconds=r.gpu_seconds)


class RandomTuner:
    name = "random"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        launcher = landscape.launcher(seed)
        order = np.random.default_rng(seed).permutation(len(landscape.candidates))[:budget]
        return [launch(landscape, launcher, landscape.candidates[i], k, f"random-{k}")
                for k, i in enumerate(order, start=1)]


class GridTuner:
    name = "grid"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        launcher = landscape.launcher(seed)
        return [launch(landscape, launcher, s, k, f"grid-{k}")
                for k, s in enumerate(landscape.candidates[:budget], start=1)]


class ExpertTuner:
    name = "expert"

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        if landscape.expert is None:
            return []
        return [launch(landscape, landscape.launcher(seed), landscape.expert, 1, "expert-1")]


class OptunaTuner:
    """TPE over a categorical per tunable (see the module docstring for what costs budget)."""

    name = "optuna"
    # Suggestions TPE may make per launch before the tuner gives up on it and fills the rest of
    # the budget with unmeasured valid configurations in random order.
    MAX_ASKS_PER_LAUNCH = 20

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        launcher = landscape.launcher(seed)
        space = landscape.space
        allowed = {s.signature(): s for s in landscape.candidates}
        budget = min(budget, len(allowed))
        dists = {f: optuna.distributions.CategoricalDistribution(v) for f, v in space.tunables.items()
                 if len(v) > 1}
        # TPE reads the constraint each trial carries (Trial.set_constraint): > 0 is infeasible.
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
        seen: dict[str, TrialOutcome] = {}
        out: list[TrialOutcome] = []
        asks = 0
        while len(out) < budget and asks < self.MAX_ASKS_PER_LAUNCH * budget:
            asks += 1
            trial = study.ask(dists)
            data = {**space.fixed, **{f: v[0] for f, v in space.tunables.items()}, **trial.params}
            try:
                sig = Strategy.model_validate(data).signature()
            except ValueError:
                sig = ""
            if sig not in allowed:  # Megatron would refuse it, or the replay table never measured it
                trial.set_constraint("valid", 1.0)
                study.tell(trial, 0.0)
                continue
            if sig not in seen:
                seen[sig] = launch(landscape, launcher, allowed[sig], len(out) + 1, f"optuna-{len(out) + 1}")
                out.append(seen[sig])
            done = seen[sig]
            trial.set_constraint("valid", 0.0 if done.ok else 1.0)
            study.tell(trial, done.measured_mfu or 0.0)
        rest = [s for s in landscape.candidates if s.signature() not in seen]
        for i in np.random.default_rng(seed).permutation(len(rest))[: budget - len(out)]:
            out.append(launch(landscape, launcher, rest[i], len(out) + 1, f"optuna-fill-{len(out) + 1}"))
        return out


@lru_cache(maxsize=1)
def _empty_pool() -> bytes:
    """A SQLite pool at this optico's schema, migrated once per process: each OptiCo run starts from a
    copy (migrating a fresh database costs ~0.1 s, a tenth of a run)."""
    from optico.pool.store import SqlStore

    with tempfile.TemporaryDirectory(prefix="optico-bench-") as tmp:
        db = Path(tmp) / "pool.db"
        SqlStore(f"sqlite:///{db}").close()
        return db.read_bytes()


# The loop's failure categories in the coarse classes of `failure_kind`.
_KIND = {"oom": "oom", "hang": "hang", "comm_timeout": "hang", "not_measured": "not_measured"}


class OpticoTuner:
    """The product's loop on a throwaway pool; `reasoner` picks the agents' reasoners. `policy` and
    `switches` turn parts off (ablations: `optico.agents.acquisition.Policy`,
    `optico.perfmodel.online.ModelSwitches`); `warm` first runs an earlier job on the same
    workload in the same pool (another noise seed), so the measured job starts warm."""

    def __init__(self, reasoner: ReasonerSpec | None = None, name: str = "optico",
                 policy: dict[str, bool] | None = None, switches: dict[str, bool] | None = None, warm: bool = False):
        self.reasoner = reasoner or ReasonerSpec()
        self.name, self.policy, self.switches, self.warm = name, policy or {}, switches or {}, warm
        self.last_stop_reason: str | None = None  # why the loop stopped, for the run's record

    def run(self, landscape: Landscape, budget: int, seed: int) -> list[TrialOutcome]:
        from optico.agents import acquisition
        from optico.perfmodel import online
        from optico.pool.store import SqlStore
        from optico.runner import run_job

        spec = landscape.job_spec(budget, seed, self.reasoner)
        with tempfile.TemporaryDirectory(prefix="optico-bench-") as tmp, \
                acquisition.switched(**self.policy), online.switched(**self.switches):
            db = Path(tmp) / "pool.db"
            db.write_bytes(_empty_pool())
            url = f"sqlite:///{db}"
            store = SqlStore(url)
            try:
                if self.warm:
                    earlier = landscape.job_spec(budget, seed + 10_000, self.reasoner)
                    run_job(store, url, store.create_job(earlier), launcher=landscape.launcher(seed + 10_000))
                job_id = store.create_job(spec)
                run_job(store, url, job_id, launcher=landscape.launcher(seed))
                trials = store.trials(job_id)
                self.last_stop_reason = store.get_job(job_id).stop_reason
            finally:
                store.close()
        out = []
        for t in trials:
            ok = t.status == TrialStatus.OK and t.metrics is not None
            out.append(TrialOutcome(
                index=t.index, signature=t.signature, config=t.strategy.short(), ok=ok,
                measured_mfu=t.metrics.mfu if ok else None, true_mfu=landscape.true_mfu(t.strategy) if ok else None,
                failure=None if ok else _KIND.get(t.failure.category.value if t.failure else "", "error"),
                gpu_seconds=t.gpu_seconds))
        return out


TUNERS: dict[str, type] = {"optico": OpticoTuner, "random": RandomTuner, "grid": GridTuner, "optuna": OptunaTuner,
                           "expert": ExpertTuner}
# OptiCo with one part off (or, for warm start, on): `optico bench --ablations`.
ABLATIONS: dict[str, dict[str, Any]] = {
    "optico-no-uncertainty": {"policy": {"uncertainty": False}},
    "optico-no-health": {"policy": {"health_rules": False}},
    "optico-no-online": {"switches": {"online_correction": False}},
    "optico-no-guard": {"switches": {"oom_guard": False}},
    "optico-fixed-prior": {"switches": {"adaptive_prior": False}},
    "optico-no-stop": {"policy": {"convergence_stop": False}},
    "optico-warm": {"warm": True},
}


def known_tuners() -> list[str]:
    from optico.bench.baselines import BASELINES

    return [*TUNERS, *BASELINES, *ABLATIONS]


def make_tuner(name: str, reasoner: ReasonerSpec | None = None) -> Tuner:
    """A tuner by name; ValueError names the known ones."""
    from optico.bench.baselines import BASELINES

    if name == "optico":
        return OpticoTuner(reasoner)
    if name in ABLATIONS:
        return OpticoTuner(reasoner, name=name, **ABLATIONS[name])
    if name in BASELINES:
        return BASELINES[name]()
    if name not in TUNERS:
        raise ValueError(f"unknown tuner {name!r}; known: {', '.join(known_tuners())}")
    return TUNERS[name]()

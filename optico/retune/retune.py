"""The retune job of a tick: how it is made, and how its result becomes the schedule's new incumbent.

A retune job is an ordinary job (the workers run it, its trials land in the pool) with
- the schedule's spec and its budget (`max_trials`),
- the incumbent as its baseline, so its first trial re-measures the incumbent under the new framework
  and its report's "improvement over the baseline" is the gain of retuning,
- a warm start from the pool (every job on the workload: earlier failures under the old framework are
  hints to the guard, not refusals — `optico.fingerprint`),
- an Idempotency-Key of the tick (`TickRecord.retune_job_key`), by which a tick whose replica died after
  creating the job adopts it instead of leaving it orphaned (`optico.pool.schedules`).
"""

from __future__ import annotations

from typing import Any

from optico.events import RetuneFinished
from optico.pool.contract import Store
from optico.pool.lifecycle import JobStatus
from optico.pool.records import Incumbent, ScheduleRecord, TickRecord
from optico.report import flag_changes, flag_diff
from optico.rules import violations
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import TrialStatus

# A retune job has ended for the schedule's purpose. INTERRUPTED is not among them: a queue job
# interrupted by a shutdown is resumed by the next worker.
ENDED = (JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.FAILED)


def retune_spec(schedule: ScheduleRecord, tick: TickRecord, *, first: bool) -> JobSpec:
    """The job spec of this tick's retune (see the module docstring)."""
    spec = schedule.spec
    baseline = spec.baseline
    incumbent = schedule.incumbent
    if incumbent is not None and _runnable(spec, incumbent.strategy):
        baseline = incumbent.strategy
    what = "first tune" if first else "retune"
    return spec.model_copy(update={
        "name": f"{schedule.name}: {what} (tick {tick.id})",
        "budget": spec.budget.model_copy(update={"max_trials": schedule.max_trials}),
        "baseline": baseline,
    })


def _runnable(spec: JobSpec, strategy: Strategy) -> bool:
    """The incumbent may be the baseline only if the spec (which may have been edited) still allows it."""
    return not violations(spec.workload, strategy) and spec.search_space.contains(strategy)


def start_retune(store: Store, schedule: ScheduleRecord, tick: TickRecord, *, first: bool, origin: str = "queue") -> int:
    """Creates the retune job (once per tick, whatever happens) and returns its id."""
    return store.create_job(retune_spec(schedule, tick, first=first), origin=origin,
                            idempotency_key=tick.retune_job_key)


def _probe_now(schedule: ScheduleRecord) -> dict[str, str]:
    """The framework now, for a tick that recorded no probe (it broke, or its replica died, after it had
    started its retune job): an incumbent saved with no fingerprint made the next tick see a framework
    change that was none, and re-measure, or retune again with `always_retune`."""
    from optico.retune.probe import ProbeError, probe_framework

    try:
        return probe_framework(schedule.spec)
    except ProbeError:
        return {}


def retune_result(store: Store, schedule: ScheduleRecord, tick: TickRecord) -> tuple[Incumbent | None, dict[str, Any],
                                                                                      RetuneFinished]:
    """(the new incumbent or None to keep the old one, the report's additions, the event) of an ended retune."""
    if tick.retune_job_id is None:
        raise ValueError(f"tick {tick.id} started no retune job")
    job = store.get_job(tick.retune_job_id)
    trials = store.trials(job.id)
    ok = [t for t in trials if t.status is TrialStatus.OK and t.metrics is not None]
    old = schedule.incumbent
    report: dict[str, Any] = {"retune": {"job_id": job.id, "status": job.status.value, "trials": len(trials),
                                         "stop_reason": job.stop_reason}}
    if not ok:
        report["retune"]["result"] = "no configuration ran: the incumbent is kept and re-checked next tick"
        event = RetuneFinished(tick_id=tick.id, job_id=job.id, job_status=job.status.value)
        return None, report, event
    best = max(ok, key=lambda t: (t.metrics.mfu, -t.index))
    # The next tick compares its probe with this: the probe of this tick (not the trial's fingerprint,
    # which a launcher may report in other keys, or not at all, as a user's Megatron-LM command does).
    framework = dict(tick.fingerprint or {}) or _probe_now(schedule)
    before_strategy = old.strategy if old is not None else None
    def pct(reference: float | None) -> float | None:
        return (best.metrics.mfu / reference - 1) * 100 if reference else None

    report["new_best"] = {"trial": best.index, "mfu": best.metrics.mfu, "strategy": best.strategy.short(),
                          "megatron_args": best.strategy.run_args(job.spec.workload), "fingerprint": framework}
    report["flag_diff"] = flag_diff(before_strategy, best.strategy)
    report["flag_changes"] = flag_changes(before_strategy, best.strategy) if before_strategy else []
    report["new_best_vs_mfu_before_pct"] = pct(tick.mfu_before)  # against the incumbent on the old framework
    report["new_best_vs_mfu_after_pct"] = pct(tick.mfu_after)  # what retuning gained on the new one
    incumbent = Incumbent(strategy=best.strategy, mfu=best.metrics.mfu, fingerprint=framework, job_id=job.id,
                          measured_at=store.db_now())
    event = RetuneFinished(tick_id=tick.id, job_id=job.id, job_status=job.status.value,
                           new_best_mfu=best.metrics.mfu, new_best=best.strategy.short(),
                           incumbent_change_pct=-tick.regression_pct if tick.regression_pct is not None else None,
                           flag_changes=report["flag_changes"])
    return incumbent, report, event


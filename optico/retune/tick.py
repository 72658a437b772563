"""One tick of a schedule, end to end, and the closing of its retune job once that job has ended.

`run_tick` is called with a tick already claimed (`Store.claim_tick`: this replica, and only this one,
holds the schedule's lock). It never raises for the tick's own trouble (a probe that cannot read the
target, a launcher that breaks): the tick is recorded failed, with the reason, and an event.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from optico.events import ScheduleTicked, TickFailed
from optico.fingerprint import changes
from optico.launchers.factory import build_launcher
from optico.perfmodel.constants import load_constants
from optico.pool.contract import Store, StoreError, TickLost
from optico.pool.records import Incumbent, ScheduleRecord, TickRecord, TickVerdict
from optico.redact import clip
from optico.retune import webhook
from optico.retune.decide import Decision, decide, framework_changed
from optico.retune.probe import probe_framework
from optico.retune.remeasure import Remeasurement, remeasure
from optico.retune.retune import ENDED, retune_result, start_retune

log = logging.getLogger("optico.retune")


class LockKeeper(threading.Thread):
    """Renews the schedule's lock while a tick works (a re-measurement on real hardware takes long)."""

    def __init__(self, store: Store, tick_id: int, worker: str, lock_s: float):
        super().__init__(name=f"optico-tick-{tick_id}", daemon=True)
        self.store, self.tick_id, self.worker, self.lock_s = store, tick_id, worker, lock_s
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.lock_s / 4):
            try:
                self.store.renew_tick_lock(self.tick_id, self.worker, self.lock_s)
            except TickLost:
                return  # recording the tick will say so
            except StoreError:
                continue

    def __enter__(self) -> LockKeeper:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()


def outcome_json(schedule: str, tick: TickRecord) -> dict[str, Any]:
    """The `optico schedule run-now --json` object (docs/retuning.md)."""
    return {
        "schedule": schedule, "tick_id": tick.id, "status": tick.status, "outcome": tick.outcome,
        "fingerprint_changed": tick.fingerprint_changed,
        "incumbent": {"mfu_before": tick.mfu_before, "mfu_after": tick.mfu_after},
        "regression_pct": tick.regression_pct, "noise_pct": tick.noise_pct,
        "retune_job_id": tick.retune_job_id, "new_best_mfu": tick.new_best_mfu,
        "flag_changes": tick.report.get("flag_changes", []),
        "error": tick.report.get("error"),
    }


def pending_retune(store: Store, schedule_id: int, *, exclude: int | None = None) -> TickRecord | None:
    """The schedule's tick whose retune job has not ended yet (after closing those that have)."""
    for tick in store.ticks(schedule_id, status="retuning"):
        if tick.id != exclude and settle(store, tick) is None:
            return tick
    return None


async def _remeasure(schedule: ScheduleRecord, incumbent: Incumbent, tick_id: int) -> Remeasurement:
    spec = schedule.spec
    launcher = build_launcher(spec.launcher, spec.seed, load_constants(spec.calibration))
    try:
        return await remeasure(launcher, spec.workload, incumbent.strategy, key=f"schedule{schedule.id}-tick{tick_id}")
    finally:
        await launcher.aclose()


def _verdict(decision: Decision, probed: dict[str, str], schedule: ScheduleRecord,
             remeasured: Remeasurement | None, job_id: int | None) -> TickVerdict:
    old = schedule.incumbent
    report: dict[str, Any] = {"framework": {"before": dict(old.fingerprint) if old else None, "after": probed,
                                            "changes": changes(old.fingerprint if old else {}, probed)}}
    if old is not None:
        report["incumbent"] = {"strategy": old.strategy.short(), "megatron_args": old.strategy.megatron_args(),
                               "mfu": old.mfu, "job_id": old.job_id}
    if remeasured is not None:
        report["remeasure"] = remeasured.as_report()
    return TickVerdict(outcome=decision.outcome, fingerprint=probed, fingerprint_changed=decision.fingerprint_changed,
                       mfu_before=decision.mfu_before, mfu_after=decision.mfu_after, noise_pct=decision.noise_pct,
                       regression_pct=decision.regression_pct, retune_job_id=job_id, report=report)


def run_tick(store: Store, schedule: ScheduleRecord, tick: TickRecord, *, worker: str, lock_s: float) -> TickRecord:
    """Probes, decides (re-measuring the incumbent when the framework changed), starts the retune job
    when one is due (queued for the workers), records the tick and its event; a webhook on regression."""
    with LockKeeper(store, tick.id, worker, lock_s):
        try:
            return _tick(store, schedule, tick, worker=worker)
        except TickLost:
            log.warning("tick %d of %s: the lock expired before it was recorded", tick.id, schedule.name)
            return store.get_tick(tick.id)
        except Exception as exc:  # noqa: BLE001 - a broken tick is recorded, never raised into the scheduler
            reason = clip(f"{type(exc).__name__}: {exc}".splitlines()[0], 500)
            log.warning("tick %d of %s failed: %s", tick.id, schedule.name, reason)
            try:
                # Broken after it created its retune job (recording the verdict failed): the job runs on,
                # and the tick follows it, so that the next tick does not start a second one.
                job_id = store.job_id_for_key(tick.retune_job_key)
                if job_id is not None:
                    reason = clip(f"{reason}; its retune job {job_id} runs on", 500)
                return store.record_tick(tick.id, worker, "failed" if job_id is None else "retuning",
                                         TickVerdict(retune_job_id=job_id, report={"error": reason}),
                                         event=TickFailed(tick_id=tick.id, status="failed" if job_id is None
                                                          else "retuning", reason=reason))
            except (TickLost, StoreError):
                return store.get_tick(tick.id)


def _tick(store: Store, schedule: ScheduleRecord, tick: TickRecord, *, worker: str) -> TickRecord:
    pending = pending_retune(store, schedule.id, exclude=tick.id)
    if pending is not None:
        reason = f"the retune job {pending.retune_job_id} of tick {pending.id} has not ended"
        return store.record_tick(tick.id, worker, "skipped", TickVerdict(report={"error": reason}),
                                 event=TickFailed(tick_id=tick.id, status="skipped", reason=reason))
    probed = probe_framework(schedule.spec)
    incumbent = schedule.incumbent
    remeasured = None
    if incumbent is not None and framework_changed(incumbent, probed):
        remeasured = asyncio.run(_remeasure(schedule, incumbent, tick.id))
    decision = decide(incumbent, probed, remeasured, always_retune=schedule.always_retune)
    job_id = start_retune(store, schedule, tick, first=incumbent is None) if decision.retune else None
    verdict = _verdict(decision, probed, schedule, remeasured, job_id)
    restamped = None
    if decision.outcome == "within-noise" and job_id is None and incumbent is not None:
        # Same configuration, measured now under the new framework: the next tick compares with that.
        restamped = Incumbent(strategy=incumbent.strategy, mfu=decision.mfu_after or incumbent.mfu,
                              fingerprint=probed, job_id=None, measured_at=store.db_now())
    event = ScheduleTicked(tick_id=tick.id, trigger=tick.trigger, outcome=decision.outcome,
                           fingerprint_changed=decision.fingerprint_changed,
                           framework_changes=verdict.report["framework"]["changes"],
                           mfu_before=decision.mfu_before, mfu_after=decision.mfu_after,
                           regression_pct=decision.regression_pct, noise_pct=decision.noise_pct, retune_job_id=job_id)
    record = store.record_tick(tick.id, worker, "retuning" if job_id is not None else "done", verdict,
                               incumbent=restamped, event=event)
    if decision.outcome == "regression":
        webhook.notify(schedule.webhook_url, {"event": "regression", "workload": schedule.spec.workload.describe(),
                                              "framework_changes": event.framework_changes,
                                              **outcome_json(schedule.name, record)})
    return record


def settle(store: Store, tick: TickRecord) -> TickRecord | None:
    """Closes a 'retuning' tick whose job has ended: the new best, its flag diff, the new incumbent,
    the event (and the webhook for a regression). None while the job still runs. Safe to repeat."""
    if tick.status != "retuning" or tick.retune_job_id is None:
        return tick
    if store.get_job(tick.retune_job_id).status not in ENDED:
        return None
    # By id among all: a pool holds tens of schedules, and this runs once per retune.
    schedule = next((s for s in store.list_schedules() if s.id == tick.schedule_id), None)
    if schedule is None:
        return tick  # the schedule was removed: nothing to update
    incumbent, report, event = retune_result(store, schedule, tick)
    closed = store.complete_retune(tick.id, new_best_mfu=event.new_best_mfu, report=report, incumbent=incumbent,
                                   event=event)
    if closed is None:
        return store.get_tick(tick.id)  # another replica closed it first
    if closed.outcome == "regression":
        webhook.notify(schedule.webhook_url, {"event": "retune_done", **outcome_json(schedule.name, closed)})
    return closed

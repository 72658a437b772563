"""What a scheduler does on each poll (`fire_due`), and `optico schedule run-now` (`run_now`).

Every replica of the service may run `fire_due` at the same moment: `Store.claim_tick` lets exactly
one of them fire each cron slot, and a slot missed while every replica was down fires once, not once
per missed slot (the next slot is computed from now).
"""

from __future__ import annotations

import time

from optico.pool.contract import Store
from optico.pool.lifecycle import LeaseHeld, LifecycleError
from optico.pool.records import TickRecord
from optico.retune.cron import next_fire
from optico.retune.retune import ENDED
from optico.retune.tick import pending_retune, run_tick, settle
from optico.runner import LeasePolicy, new_worker_id, run_job

DEFAULT_LOCK_S = 120.0  # a replica that dies mid-tick blocks its schedule this long; renewed while alive


class RetuneRunning(LifecycleError):
    """`run-now` while the schedule's previous retune job still runs."""


class ScheduleRemoved(LifecycleError):
    """The schedule was removed while `run-now` waited for its retune job."""


def settle_all(store: Store) -> list[TickRecord]:
    """Closes every tick whose retune job has ended; returns those closed now."""
    closed = []
    for tick in store.ticks(status="retuning", limit=200):
        done = settle(store, tick)
        if done is not None and done.status == "done":
            closed.append(done)
    return closed


def fire_due(store: Store, *, worker: str, lock_s: float = DEFAULT_LOCK_S) -> list[TickRecord]:
    """One scheduler poll: close ended retunes, settle ticks whose replica died (their lost slot fires
    again, once), then fire every due schedule this replica wins."""
    settle_all(store)
    store.recover_abandoned_ticks()
    fired = []
    for due in store.due_schedules():
        following = next_fire(due.cron, max(store.db_now(), due.next_fire_at))
        tick = store.claim_tick(due.name, worker, lock_s, due_at=due.next_fire_at, next_fire_at=following)
        if tick is None:
            continue  # another replica fired this slot
        fired.append(run_tick(store, store.get_schedule(due.name), tick, worker=worker, lock_s=lock_s))
    return fired


def run_now(store: Store, name: str, *, database_url: str, worker: str | None = None,
            lock_s: float = DEFAULT_LOCK_S, policy: LeasePolicy | None = None, poll_s: float = 1.0) -> TickRecord:
    """Ticks the schedule now, in this process, and runs its retune job (if any) here to the end.

    KeyError for an unknown schedule; TickBusy when a replica is ticking it; RetuneRunning when its
    previous retune job has not ended. The job is a queue job: if a worker of a running service
    claims it first, this waits for it; if this process dies, a worker takes it over."""
    worker = worker or new_worker_id("schedule")
    schedule = store.get_schedule(name)
    pending = pending_retune(store, schedule.id)
    if pending is not None:
        raise RetuneRunning(f"schedule {name!r}: the retune job {pending.retune_job_id} of tick {pending.id} is "
                            f"still running; wait for it or cancel it (optico jobs cancel {pending.retune_job_id})")
    tick = store.claim_tick(name, worker, lock_s)
    if tick is None:  # a manual claim raises TickBusy instead; kept for type checkers
        raise RetuneRunning(f"schedule {name!r} could not be claimed")
    record = run_tick(store, store.get_schedule(name), tick, worker=worker, lock_s=lock_s)
    if record.status != "retuning" or record.retune_job_id is None:
        return record
    job_id = record.retune_job_id
    try:
        run_job(store, database_url, job_id, worker=worker, policy=policy or LeasePolicy.from_env())
    except (LeaseHeld, LifecycleError):
        pass  # a service worker got it first (and may have finished it): wait for it below
    while store.get_job(job_id).status not in ENDED:
        time.sleep(poll_s)
    try:
        return settle(store, store.get_tick(record.id)) or store.get_tick(record.id)
    except KeyError:  # the schedule, and its ticks with it, was removed while the retune job ran
        raise ScheduleRemoved(f"schedule {name!r} was removed while its retune job {job_id} ran; the job "
                              f"ended {store.get_job(job_id).status.value}, and no tick records it") from None

"""Nightly retuning end to end in this process, on SQLite and PostgreSQL: the simulated cluster is
upgraded (OPTICO_SIM_FRAMEWORK_VERSION) under a schedule, and its ticks are run for real."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

from retune_testkit import add_schedule

from optico.launchers.sim import SimLauncher
from optico.pool.lifecycle import JobStatus
from optico.pool.store import SqlStore
from optico.report import flag_changes
from optico.retune.fire import RetuneRunning, ScheduleRemoved, fire_due, run_now
from optico.retune.tick import outcome_json


def _measure_now(store: SqlStore, name: str, strategy, runs: int = 5) -> float:
    """The incumbent's MFU on the cluster as it is now, measured straight through the simulator."""
    spec = store.get_schedule(name).spec
    sim = SimLauncher(seed=spec.seed, hang_rate=0.0, framework_version=spec.launcher.framework_version)
    mfus = [asyncio.run(sim.launch(spec.workload, strategy, trial_key=f"check-{i}")).metrics.mfu for i in range(runs)]
    return statistics.fmean(mfus)


def test_an_upgrade_is_found_retuned_and_recorded_and_a_second_tick_starts_nothing(
        store: SqlStore, db_url: str, upgrade) -> None:
    add_schedule(store, "nightly", max_trials=6)

    first = run_now(store, "nightly", database_url=db_url)
    assert first.outcome == "first-tune" and first.status == "done" and first.retune_job_id is not None
    before = store.get_schedule("nightly").incumbent
    assert before is not None and before.fingerprint == {"framework_version": "24.10"}
    assert before.mfu == first.new_best_mfu == store.best_trial(first.retune_job_id).mfu

    upgrade("25.01")
    tick = run_now(store, "nightly", database_url=db_url)
    result = outcome_json("nightly", tick)
    assert result["fingerprint_changed"] is True
    assert result["outcome"] in ("regression", "improvement")
    # It found the incumbent's change: what the upgraded cluster really gives it, beyond the noise band.
    assert result["incumbent"]["mfu_before"] == before.mfu
    truth = _measure_now(store, "nightly", before.strategy)
    assert abs(result["incumbent"]["mfu_after"] - truth) / truth * 100 < result["noise_pct"]
    assert abs(result["regression_pct"]) > result["noise_pct"]
    assert (result["regression_pct"] > 0) == (result["outcome"] == "regression")
    assert result["regression_pct"] == (before.mfu - result["incumbent"]["mfu_after"]) / before.mfu * 100
    assert len(tick.report["remeasure"]["mfus"]) == 3 and len(tick.report["remeasure"]["warmup_mfus"]) == 1

    # ... and a new best, recorded as the tick's result and as the schedule's incumbent.
    job = store.get_job(result["retune_job_id"])
    assert job.status is JobStatus.SUCCEEDED and job.spec.baseline == before.strategy
    assert job.spec.budget.max_trials == 6 and len(store.trials(job.id)) == 6
    best = store.best_trial(job.id)
    assert result["new_best_mfu"] == best.mfu
    assert all(t.fingerprint["framework_version"] == "25.01" for t in store.trials(job.id))
    after = store.get_schedule("nightly").incumbent
    assert (after.strategy, after.mfu, after.job_id) == (best.strategy, best.mfu, job.id)
    assert after.fingerprint == {"framework_version": "25.01"}
    assert result["flag_changes"] == flag_changes(before.strategy, best.strategy)
    assert tick.report["framework"]["changes"] == {"framework_version": ["24.10", "25.01"]}

    kinds = [(e.kind, e.event.tick_id) for e in store.schedule_events(store.get_schedule("nightly").id)]
    assert kinds == [("tick", first.id), ("retune_done", first.id), ("tick", tick.id), ("retune_done", tick.id)]
    done = store.schedule_events(store.get_schedule("nightly").id)[-1].event
    assert done.new_best_mfu == best.mfu and done.flag_changes == result["flag_changes"]

    jobs_before = len(store.list_jobs(100))
    again = run_now(store, "nightly", database_url=db_url)
    assert outcome_json("nightly", again) | {"tick_id": 0, "schedule": ""} == {
        "schedule": "", "tick_id": 0, "status": "done", "outcome": "no-change", "fingerprint_changed": False,
        "incumbent": {"mfu_before": best.mfu, "mfu_after": None}, "regression_pct": None, "noise_pct": None,
        "retune_job_id": None, "new_best_mfu": None, "flag_changes": [], "error": None}
    assert len(store.list_jobs(100)) == jobs_before
    assert store.get_schedule("nightly").incumbent == after


def test_two_schedulers_on_one_database_fire_a_slot_once(store: SqlStore, db_url: str, upgrade) -> None:
    add_schedule(store, "nightly", max_trials=3)
    run_now(store, "nightly", database_url=db_url)
    upgrade("25.01")
    store.fire_now("nightly")
    slot = store.get_schedule("nightly").next_fire_at
    barrier = threading.Barrier(2)
    fired: dict[str, list] = {}

    def replica(name: str) -> None:
        with SqlStore(db_url) as own:  # each replica has its own engine and connections
            barrier.wait()
            fired[name] = fire_due(own, worker=name, lock_s=30)

    threads = [threading.Thread(target=replica, args=(f"replica-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    ticks = [t for got in fired.values() for t in got]
    assert len(ticks) == 1, fired
    tick = ticks[0]
    assert tick.trigger == "manual" and tick.due_at == slot and tick.status == "retuning"  # made due by fire_now
    assert tick.outcome in ("regression", "improvement")
    assert store.get_schedule("nightly").next_fire_at > slot  # the slot moved on to the next cron time
    retunes = [j for j in store.list_jobs(100) if j.name.endswith(f"(tick {tick.id})")]
    assert [j.id for j in retunes] == [tick.retune_job_id]
    assert store.job_id_for_key(tick.retune_job_key) == tick.retune_job_id
    # No worker runs here: the tick waits for its job, and run-now refuses to start a second retune.
    try:
        run_now(store, "nightly", database_url=db_url)
    except RetuneRunning as exc:
        assert str(tick.retune_job_id) in str(exc)
    else:
        raise AssertionError("run-now started a second retune")


def test_a_schedule_removed_while_its_retune_job_runs_ends_run_now_in_one_error(store: SqlStore, db_url: str) -> None:
    """Before: the job finished, then run-now raised KeyError looking up the removed schedule's tick
    (a traceback from `optico schedule run-now`)."""
    from optico.spec import parse_spec
    from retune_testkit import sim_spec

    add_schedule(store, "nightly", max_trials=3, spec=parse_spec(sim_spec(max_trials=3, trial_seconds=0.5)))

    def remove_once_the_job_runs() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(j.status == JobStatus.RUNNING for j in store.list_jobs(10)):
                store.delete_schedule("nightly")
                return
            time.sleep(0.05)

    remover = threading.Thread(target=remove_once_the_job_runs)
    remover.start()
    try:
        run_now(store, "nightly", database_url=db_url)
    except ScheduleRemoved as exc:
        assert "'nightly' was removed while its retune job" in str(exc) and "ended succeeded" in str(exc)
    else:
        raise AssertionError("run-now returned a tick of a removed schedule")
    remover.join()


def test_a_schedule_added_again_after_removal_starts_its_own_first_tune(store: SqlStore, db_url: str) -> None:
    # SQLite hands out a removed schedule's ids (schedule and tick) again: the new first tune must be a
    # new job, not the old schedule's, adopted through a key built from the tick id alone.
    add_schedule(store, "nightly", max_trials=2)
    old = run_now(store, "nightly", database_url=db_url)
    store.delete_schedule("nightly")
    add_schedule(store, "nightly", max_trials=2)
    new = run_now(store, "nightly", database_url=db_url)
    assert new.outcome == "first-tune" and new.status == "done"
    assert new.retune_job_id != old.retune_job_id and store.get_job(new.retune_job_id).status is JobStatus.SUCCEEDED


def test_a_tick_whose_replica_died_after_starting_its_retune_follows_that_job(store: SqlStore, db_url: str) -> None:
    """The replica died between creating the retune job and recording the tick: the next tick marked the
    old one failed, the job ran on orphaned (its result never became the incumbent), and a second retune
    of the same workload started beside it."""
    from optico.retune.retune import start_retune

    add_schedule(store, "nightly", max_trials=3)
    tick = store.claim_tick("nightly", "replica-that-dies", 0.3)
    orphan = start_retune(store, store.get_schedule("nightly"), tick, first=True)
    time.sleep(0.6)  # its lock expires: the replica is gone
    second = run_now(store, "nightly", database_url=db_url)
    adopted = store.get_tick(tick.id)
    assert (adopted.status, adopted.retune_job_id) == ("retuning", orphan), adopted
    assert "after it started retune job" in adopted.report["error"]
    assert second.status == "skipped" and f"retune job {orphan}" in second.report["error"]
    assert [j.id for j in store.list_jobs(100)] == [orphan]  # no second retune


def test_a_tick_that_breaks_after_starting_its_retune_follows_that_job(store: SqlStore, db_url: str,
                                                                     monkeypatch) -> None:
    """Recording the verdict failed after the job was created: the tick was recorded failed, the job orphaned."""
    from optico.pool.contract import StoreError
    from optico.retune import tick as tick_module

    add_schedule(store, "nightly", max_trials=3)
    real = store.record_tick
    calls = []

    def record_once_broken(*args, **kwargs):
        calls.append(args[2])
        if len(calls) == 1:
            raise StoreError("the database went away for a moment")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "record_tick", record_once_broken)
    claimed = store.claim_tick("nightly", "replica", 30)
    record = tick_module.run_tick(store, store.get_schedule("nightly"), claimed, worker="replica", lock_s=30)
    assert calls == ["retuning", "retuning"] and record.status == "retuning" and record.retune_job_id is not None
    assert "its retune job" in record.report["error"]
    kinds = [(e.kind, getattr(e.event, "status", None)) for e in store.schedule_events(record.schedule_id)]
    assert kinds == [("tick_failed", "retuning")]
    # The job runs on; once it ends the tick is closed and its best is the incumbent, with the framework
    # it ran under (the tick recorded no probe: the incumbent had none, and the next tick saw a change).
    from optico.retune.tick import settle
    from optico.runner import run_job

    run_job(store, db_url, record.retune_job_id)
    closed = settle(store, store.get_tick(record.id))
    incumbent = store.get_schedule("nightly").incumbent
    assert closed.status == "done" and incumbent is not None and incumbent.job_id == record.retune_job_id
    assert incumbent.fingerprint == {"framework_version": "24.10"}
    assert run_now(store, "nightly", database_url=db_url).outcome == "no-change"


def test_a_slot_whose_replica_died_mid_tick_fires_again_once(store: SqlStore, db_url: str) -> None:
    """A service killed mid-tick: its slot had been advanced and its run-now request spent at the claim,
    so nothing fired until the next night while the history showed the tick `running` all day."""
    from optico.retune.cron import next_fire

    add_schedule(store, "nightly", max_trials=3)
    slot = store.get_schedule("nightly").next_fire_at

    def die_mid_tick() -> int:
        store.fire_now("nightly")  # a run-now request, as `POST .../run` makes
        due = store.get_schedule("nightly").next_fire_at
        tick = store.claim_tick("nightly", "dying-replica", 0.3, due_at=due,
                                next_fire_at=next_fire("0 2 * * *", max(store.db_now(), due)))
        time.sleep(0.6)  # the replica is gone; its lock expires
        return tick.id

    first = die_mid_tick()
    fired = fire_due(store, worker="survivor", lock_s=30)
    assert store.get_tick(first).status == "failed" and "stopped before the tick ended" in \
        store.get_tick(first).report["error"]
    assert len(fired) == 1 and fired[0].trigger == "manual" and fired[0].status in ("done", "retuning")
    assert store.get_schedule("nightly").next_fire_at == slot  # the next night's slot is kept
    # A tick that kills its replica every time is not fired again and again: two abandoned in a row stop.
    second = die_mid_tick()
    third = die_mid_tick()
    assert fire_due(store, worker="survivor", lock_s=30) == []
    assert [store.get_tick(t).status for t in (second, third)] == ["failed", "failed"]

"""The pool's schedule methods on SQLite and PostgreSQL: one firing per slot, the tick lock, history, events."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from retune_testkit import add_schedule
from sqlalchemy import text

from optico.events import ScheduleTicked, TickFailed
from optico.pool.contract import TickBusy, TickLost
from optico.pool.records import TickVerdict
from optico.pool.store import SqlStore


def test_names_are_unique_and_unknown_ones_raise_key_error(store: SqlStore) -> None:
    add_schedule(store, "a")
    with pytest.raises(ValueError, match="name: a schedule named 'a' exists"):
        add_schedule(store, "a")
    assert [s.name for s in store.list_schedules()] == ["a"]
    for call in (store.get_schedule, store.delete_schedule, store.fire_now):
        with pytest.raises(KeyError):
            call("nope")
    with pytest.raises(KeyError):
        store.claim_tick("nope", "w", 30)


def test_a_cron_slot_is_claimed_once_and_moves_on(store: SqlStore) -> None:
    add_schedule(store, "a")
    assert store.due_schedules() == []  # the first slot is tomorrow's
    due = store.fire_now("a")
    assert [s.name for s in store.due_schedules()] == ["a"]
    following = due.next_fire_at + timedelta(days=1)
    tick = store.claim_tick("a", "w1", 30, due_at=due.next_fire_at, next_fire_at=following)
    assert tick is not None and tick.status == "running" and tick.due_at == due.next_fire_at
    assert tick.trigger == "manual"  # made due by fire_now (`POST .../run`): not a cron slot of its own
    # The slot has moved on: a replica that saw the old slot gets nothing, even once the lock is free.
    assert store.claim_tick("a", "w2", 30, due_at=due.next_fire_at, next_fire_at=following) is None
    store.record_tick(tick.id, "w1", "done", TickVerdict(outcome="no-change"))
    assert store.claim_tick("a", "w2", 30, due_at=due.next_fire_at, next_fire_at=following) is None
    assert store.get_schedule("a").next_fire_at == following
    assert store.due_schedules() == []
    # The next slot, reached by the clock alone, is the cron's.
    slot = store.claim_tick("a", "w1", 30, due_at=following, next_fire_at=following + timedelta(days=1))
    assert slot is not None and slot.trigger == "cron"
    store.record_tick(slot.id, "w1", "done", TickVerdict(outcome="no-change"))
    # The database refuses a second tick of one slot whatever the code above does.
    schedule_id = store.get_schedule("a").id
    with store.engine.begin() as conn:
        stamp = conn.execute(text("SELECT due_at FROM optico_schedule_ticks WHERE id = :id"), {"id": tick.id}).scalar()
        with pytest.raises(Exception, match="(?i)unique"):
            conn.execute(text("INSERT INTO optico_schedule_ticks (schedule_id, trigger, due_at, status, worker, "
                              "report) VALUES (:s, 'cron', :d, 'running', 'x', '{}')"), {"s": schedule_id, "d": stamp})


def test_the_tick_lock_refuses_others_until_it_expires_and_a_dead_ticks_tick_is_failed(store: SqlStore) -> None:
    add_schedule(store, "a")
    lock_s = 3.0  # long enough that a loaded CI machine gets the next two calls in before it expires
    tick = store.claim_tick("a", "w1", lock_s)
    with pytest.raises(TickBusy, match="schedule 'a' is being ticked by w1 until"):
        store.claim_tick("a", "w2", 30)
    store.fire_now("a")
    assert store.due_schedules() == []  # locked: not due for anyone else
    time.sleep(lock_s + 0.3)
    taken = store.claim_tick("a", "w2", 30)
    dead = store.get_tick(tick.id)
    assert dead.status == "failed" and "w1" in dead.report["error"]
    with pytest.raises(TickLost):
        store.record_tick(tick.id, "w1", "done", TickVerdict(outcome="no-change"))
    with pytest.raises(TickLost):
        store.renew_tick_lock(tick.id, "w1", 30)
    store.renew_tick_lock(taken.id, "w2", 30)
    done = store.record_tick(taken.id, "w2", "done", TickVerdict(outcome="no-change", fingerprint={"torch": "2.13"}),
                             event=ScheduleTicked(tick_id=taken.id, trigger="manual", outcome="no-change",
                                                  fingerprint_changed=False))
    assert done.status == "done" and done.fingerprint == {"torch": "2.13"} and done.finished_at is not None
    s = store.get_schedule("a")
    assert s.locked_by is None and s.last_tick_at is not None
    assert [t.id for t in store.ticks(s.id)] == [taken.id, tick.id]
    assert [t.id for t in store.ticks(s.id, status="failed")] == [tick.id]


def test_events_are_numbered_per_schedule_and_removal_takes_history_along(store: SqlStore) -> None:
    a, b = add_schedule(store, "a"), add_schedule(store, "b")
    for schedule in (a, b, a):
        store.add_schedule_event(schedule.id, TickFailed(tick_id=1, status="skipped", reason="a test"))
    assert [e.seq for e in store.schedule_events(a.id)] == [1, 2]
    assert [e.seq for e in store.schedule_events(a.id, after=1)] == [2]
    assert store.schedule_events(b.id)[0].event == TickFailed(tick_id=1, status="skipped", reason="a test")
    store.claim_tick("a", "w", 30)
    store.delete_schedule("a")
    assert [s.name for s in store.list_schedules()] == ["b"]
    assert store.ticks() == [] and store.schedule_events(a.id) == []


def test_a_webhook_url_is_kept_for_sending_but_registered_as_a_secret(store: SqlStore) -> None:
    from optico.redact import redact

    url = "https://hooks.example.com/services/T000/B000/abcdefsecret"
    add_schedule(store, "a", webhook_url=url)
    assert store.get_schedule("a").webhook_url == url
    assert url not in redact(f"posting to {url}")


def test_a_schedule_read_with_its_history_never_pairs_an_ended_tick_with_the_old_incumbent(store: SqlStore,
                                                                                           monkeypatch) -> None:
    # CI caught `GET /schedules/{name}` showing a retune's tick as done beside the incumbent it had replaced:
    # the retune ended between the endpoint's read of the schedule and its read of the history.
    from datetime import UTC, datetime

    from optico.events import RetuneFinished
    from optico.pool.records import Incumbent
    from optico.strategy import Strategy

    add_schedule(store, "a")
    old = Incumbent(strategy=Strategy(), mfu=0.5, fingerprint={"torch": "1"}, measured_at=datetime(2026, 1, 1, tzinfo=UTC))
    tick = store.claim_tick("a", "w1", 30)
    store.record_tick(tick.id, "w1", "retuning", TickVerdict(outcome="regression"), incumbent=old)
    new = old.model_copy(update={"mfu": 0.6, "fingerprint": {"torch": "2"}})
    read_ticks = store.ticks

    def retune_ends_just_before_the_history_is_read(*args, **kwargs):
        store.complete_retune(tick.id, new_best_mfu=0.6, report={}, incumbent=new,
                              event=RetuneFinished(tick_id=tick.id, job_id=1, job_status="done"))
        return read_ticks(*args, **kwargs)

    monkeypatch.setattr(store, "ticks", retune_ends_just_before_the_history_is_read)
    schedule, ticks = store.schedule_with_history("a")
    assert ticks[0].status == "done" and schedule.incumbent is not None and schedule.incumbent.mfu == 0.6


def test_a_requested_run_stays_requested_until_its_slot_fires(store: SqlStore) -> None:
    # POST .../run, then `optico schedule run-now` before a scheduler polls: the slot is still due,
    # and when it fires it is still the requested run, not a cron slot.
    add_schedule(store, "a")
    due = store.fire_now("a")
    now = store.claim_tick("a", "cli", 30)
    assert now is not None and now.trigger == "manual"
    store.record_tick(now.id, "cli", "done", TickVerdict(outcome="no-change"))
    fired = store.claim_tick("a", "w1", 30, due_at=due.next_fire_at, next_fire_at=due.next_fire_at + timedelta(days=1))
    assert fired is not None and fired.trigger == "manual"

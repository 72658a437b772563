"""The pool's retuning schedules in SQL: `SqlStore` takes these methods from `ScheduleSql`.

Kept apart from store.py (jobs, trials, tokens) because schedules are their own resource with their
own lock; the contract is in `Store` (contract.py), the decisions in `optico.retune`.

One firing per cron slot across replicas, two ways at once:
- `claim_tick` moves `next_fire_at` from the slot the caller saw to the next one only if it still
  holds that slot (compare-and-set, in a transaction that holds the row: PostgreSQL
  `FOR UPDATE SKIP LOCKED`, so a second claimer skips instead of waiting; SQLite's BEGIN IMMEDIATE
  lets one writer in at a time);
- the tick row is unique per (schedule, slot), so even a claimer that slipped past the first check
  could not insert a second tick of the slot.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from optico import redact
from optico.events import ScheduleEvent, parse_schedule_event
from optico.pool.contract import TickBusy, TickLost
from optico.pool.models import JobRow, ScheduleEventRow, ScheduleRow, TickRow
from optico.pool.records import (
    Incumbent,
    ScheduleRecord,
    StoredScheduleEvent,
    TickRecord,
    TickVerdict,
    as_utc,
)
from optico.spec import JobSpec
from optico.strategy import Strategy

TICK_STATUSES = ("running", "done", "retuning", "failed", "skipped")
ABANDONED = "stopped before the tick ended"  # in the error of a tick whose replica died


def _schedule(row: ScheduleRow) -> ScheduleRecord:
    redact.register(row.webhook_url)  # it carries a token more often than not: never print it
    incumbent = None
    if row.incumbent_strategy is not None and row.incumbent_mfu is not None:
        incumbent = Incumbent(strategy=Strategy.model_validate(row.incumbent_strategy), mfu=row.incumbent_mfu,
                              fingerprint=row.incumbent_fingerprint or {}, job_id=row.incumbent_job_id,
                              measured_at=row.incumbent_at or row.created_at)
    return ScheduleRecord(
        id=row.id, name=row.name, spec=JobSpec.model_validate(row.spec), workload_key=row.workload_key,
        cron=row.cron, max_trials=row.max_trials, always_retune=row.always_retune, webhook_url=row.webhook_url,
        created_at=row.created_at, next_fire_at=row.next_fire_at, last_tick_at=row.last_tick_at,
        locked_by=row.locked_by, locked_until=row.locked_until, incumbent=incumbent)


def _tick(row: TickRow) -> TickRecord:
    return TickRecord(
        id=row.id, schedule_id=row.schedule_id, trigger=row.trigger, due_at=row.due_at, status=row.status,
        outcome=row.outcome, worker=row.worker, started_at=row.started_at, finished_at=row.finished_at,
        fingerprint=row.fingerprint, fingerprint_changed=row.fingerprint_changed, mfu_before=row.mfu_before,
        mfu_after=row.mfu_after, noise_pct=row.noise_pct, regression_pct=row.regression_pct,
        retune_job_id=row.retune_job_id, job_key=row.job_key, new_best_mfu=row.new_best_mfu, report=row.report or {})


class ScheduleSql:
    """The schedule half of `SqlStore` (see `Store` for the contract); uses its session helpers."""

    if TYPE_CHECKING:  # provided by SqlStore
        _postgres: bool

        def _session(self, *, read: bool = False) -> Any: ...
        def _now(self, s: Session) -> datetime: ...
        def _stamp(self, value: datetime) -> datetime: ...

    # -- the query vocabulary ------------------------------------------------------------------
    @staticmethod
    def _schedule_row(s: Session, name: str, *, lock: bool = False) -> ScheduleRow:
        query = select(ScheduleRow).where(ScheduleRow.name == name)
        row = s.scalars(query.with_for_update() if lock else query).one_or_none()
        if row is None:
            raise KeyError(f"no schedule named {name!r}")
        return row

    def _append_schedule_event(self, s: Session, schedule_id: int, event: ScheduleEvent) -> int:
        """Adds `event` inside the caller's transaction, the schedule row already locked."""
        from optico.pool.store import _jsonable

        last = s.execute(select(func.max(ScheduleEventRow.seq))
                         .where(ScheduleEventRow.schedule_id == schedule_id)).scalar_one()
        seq = int(last or 0) + 1
        payload = _jsonable(event.model_dump(mode="json", exclude={"kind"}), "event")
        s.add(ScheduleEventRow(schedule_id=schedule_id, seq=seq, kind=event.kind, payload=payload))
        s.flush()
        return seq

    def _set_incumbent(self, row: ScheduleRow, incumbent: Incumbent) -> None:
        from optico.pool.store import _jsonable

        row.incumbent_strategy = incumbent.strategy.model_dump(mode="json")
        row.incumbent_mfu = float(incumbent.mfu)
        row.incumbent_fingerprint = _jsonable(dict(incumbent.fingerprint), "incumbent.fingerprint")
        row.incumbent_job_id = incumbent.job_id
        row.incumbent_at = self._stamp(incumbent.measured_at)

    # -- schedules -------------------------------------------------------------------------------
    def create_schedule(self, name: str, spec: JobSpec, *, cron: str, next_fire_at: datetime, max_trials: int,
                        always_retune: bool = False, webhook_url: str | None = None) -> ScheduleRecord:
        from sqlalchemy.exc import IntegrityError

        from optico.pool.contract import StoreError
        from optico.pool.store import spec_for_storage

        if isinstance(max_trials, bool) or int(max_trials) < 1:
            raise ValueError("max_trials: must be at least 1")
        row = ScheduleRow(name=name, spec=spec_for_storage(spec), workload_key=spec.workload.key(), cron=cron,
                          max_trials=int(max_trials), always_retune=bool(always_retune), webhook_url=webhook_url,
                          next_fire_at=self._stamp(next_fire_at))
        try:
            with self._session() as s:
                s.add(row)
                s.flush()
                s.refresh(row)
                return _schedule(row)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                raise ValueError(f"name: a schedule named {name!r} exists (remove it or pick another name)") from None
            raise

    def get_schedule(self, name: str) -> ScheduleRecord:
        with self._session(read=True) as s:
            return _schedule(self._schedule_row(s, name))

    def list_schedules(self) -> list[ScheduleRecord]:
        with self._session(read=True) as s:
            return [_schedule(r) for r in s.scalars(select(ScheduleRow).order_by(ScheduleRow.name))]

    def delete_schedule(self, name: str) -> None:
        with self._session() as s:
            row = self._schedule_row(s, name, lock=True)
            # Explicit deletes: SQLite enforces ON DELETE CASCADE only with foreign keys on, and a
            # database opened by another tool may not have them on.
            s.execute(delete(ScheduleEventRow).where(ScheduleEventRow.schedule_id == row.id))
            s.execute(delete(TickRow).where(TickRow.schedule_id == row.id))
            s.delete(row)

    def fire_now(self, name: str) -> ScheduleRecord:
        with self._session() as s:
            row = self._schedule_row(s, name, lock=True)
            row.next_fire_at = self._stamp(self._now(s))
            row.run_requested = True
            s.flush()
            return _schedule(row)

    def due_schedules(self, limit: int = 20) -> list[ScheduleRecord]:
        with self._session(read=True) as s:
            now = self._stamp(self._now(s))
            query = (select(ScheduleRow)
                     .where(ScheduleRow.next_fire_at <= now,
                            or_(ScheduleRow.locked_until.is_(None), ScheduleRow.locked_until < now))
                     .order_by(ScheduleRow.next_fire_at, ScheduleRow.id).limit(max(1, int(limit))))
            return [_schedule(r) for r in s.scalars(query)]

    # -- ticks -----------------------------------------------------------------------------------
    def claim_tick(self, name: str, worker: str, lock_s: float, *, due_at: datetime | None = None,
                   next_fire_at: datetime | None = None) -> TickRecord | None:
        cron = due_at is not None
        if cron and next_fire_at is None:
            raise ValueError("claim_tick: a cron firing needs the slot after `due_at`")
        with self._session() as s:
            query = select(ScheduleRow).where(ScheduleRow.name == name)
            if self._postgres and cron:
                query = query.with_for_update(skip_locked=True)  # a replica claiming it now: skip, don't wait
            elif self._postgres:
                query = query.with_for_update()
            row = s.scalars(query).one_or_none()
            if row is None:
                if cron:
                    return None  # deleted, or another replica holds the row this instant
                raise KeyError(f"no schedule named {name!r}")
            now = self._now(s)
            locked = row.locked_by is not None and row.locked_until is not None and as_utc(row.locked_until) > now
            if cron and (as_utc(row.next_fire_at) != as_utc(due_at) or locked):
                return None  # another replica fired this slot, or is still ticking
            if locked and row.locked_by != worker:
                raise TickBusy(name, row.locked_by, as_utc(row.locked_until))
            self._fail_abandoned(s, row)
            if cron:
                row.next_fire_at = self._stamp(next_fire_at)
            row.locked_by, row.locked_until = worker, self._stamp(now + timedelta(seconds=lock_s))
            manual = not cron or row.run_requested
            if cron:  # the requested slot is the one that fires now; a run-now leaves it due, still requested
                row.run_requested = False
            tick = TickRow(schedule_id=row.id, trigger="manual" if manual else "cron",
                           due_at=self._stamp(due_at) if cron else None, status="running", worker=worker, report={},
                           job_key=uuid.uuid4().hex)
            s.add(tick)
            s.flush()
            s.refresh(tick)
            return _tick(tick)

    def recover_abandoned_ticks(self) -> list[str]:
        made_due: list[str] = []
        with self._session(read=True) as s:  # every poll asks; a write transaction only when one is found
            if s.scalars(select(ScheduleRow.id).where(
                    ScheduleRow.locked_by.is_not(None),
                    ScheduleRow.locked_until < self._stamp(self._now(s))).limit(1)).first() is None:
                return made_due
        with self._session() as s:
            now = self._now(s)
            query = select(ScheduleRow).where(ScheduleRow.locked_by.is_not(None),
                                              ScheduleRow.locked_until < self._stamp(now))
            if self._postgres:
                query = query.with_for_update(skip_locked=True)  # a replica claiming it now has it
            for row in s.scalars(query):
                ticks = list(s.scalars(select(TickRow).where(TickRow.schedule_id == row.id)
                                       .order_by(TickRow.id.desc()).limit(2)))
                abandoned = [t for t in ticks if t.status == "running"]
                if not abandoned:
                    continue
                before = next((t for t in ticks if t.status != "running"), None)
                looping = before is not None and before.status == "failed" and \
                    ABANDONED in str((before.report or {}).get("error", ""))
                self._fail_abandoned(s, row)
                row.locked_by, row.locked_until = None, None
                if any(t.status == "failed" for t in abandoned) and not looping:
                    if as_utc(row.next_fire_at) > now:
                        row.next_fire_at = self._stamp(now)
                    row.run_requested = True
                    made_due.append(row.name)
        return made_due

    def _fail_abandoned(self, s: Session, row: ScheduleRow) -> None:
        """Ticks left running by a replica whose lock expired: it died mid-tick. One that had already
        created its retune job is `retuning` with it (the job runs on; the tick is closed when it ends,
        and no second retune starts meanwhile), not failed with the job orphaned."""
        from optico.pool.store import _key_matches

        for tick in s.scalars(select(TickRow).where(TickRow.schedule_id == row.id, TickRow.status == "running")):
            stopped = f"its replica ({tick.worker}) {ABANDONED}; the lock expired"
            job_id = tick.retune_job_id or s.scalars(
                select(JobRow.id).where(_key_matches(_tick(tick).retune_job_key))).first()
            if job_id is not None:
                tick.status, tick.retune_job_id = "retuning", job_id
                tick.report = {**(tick.report or {}), "error": f"{stopped}, after it started retune job {job_id}, "
                                                               f"which runs on"}
                continue
            tick.status = "failed"
            tick.finished_at = func.now()
            tick.report = {**(tick.report or {}), "error": stopped}

    def _held_tick(self, s: Session, tick_id: int, worker: str) -> tuple[TickRow, ScheduleRow]:
        """The running tick of `worker` and its schedule row (locked); TickLost otherwise."""
        tick = s.get(TickRow, tick_id)
        if tick is None:
            raise KeyError(f"no tick with id {tick_id}")
        row = s.scalars(select(ScheduleRow).where(ScheduleRow.id == tick.schedule_id).with_for_update()).one()
        s.refresh(tick)  # re-read under the schedule's lock: a takeover may have failed it meanwhile
        if tick.status != "running" or tick.worker != worker:
            raise TickLost(tick_id, worker)
        return tick, row

    def renew_tick_lock(self, tick_id: int, worker: str, lock_s: float) -> None:
        with self._session() as s:
            _, row = self._held_tick(s, tick_id, worker)
            row.locked_by = worker
            row.locked_until = self._stamp(self._now(s) + timedelta(seconds=lock_s))

    def record_tick(self, tick_id: int, worker: str, status: str, verdict: TickVerdict | None = None, *,
                    incumbent: Incumbent | None = None, event: ScheduleEvent | None = None) -> TickRecord:
        from optico.pool.store import _jsonable

        if status not in TICK_STATUSES or status == "running":
            raise ValueError(f"record_tick: status must be one of done, retuning, failed, skipped; got {status!r}")
        with self._session() as s:
            tick, row = self._held_tick(s, tick_id, worker)
            if verdict is not None:
                values = verdict.model_dump()
                values["report"] = _jsonable({**(tick.report or {}), **values["report"]}, "report")
                values["fingerprint"] = _jsonable(values["fingerprint"], "fingerprint")
                for key, value in values.items():
                    setattr(tick, key, value)
            tick.status = status
            if status != "retuning":
                tick.finished_at = func.now()
            if incumbent is not None:
                self._set_incumbent(row, incumbent)
            row.last_tick_at = self._stamp(self._now(s))
            if row.locked_by == worker:
                row.locked_by, row.locked_until = None, None
            if event is not None:
                self._append_schedule_event(s, row.id, event)
            s.flush()
            s.refresh(tick)
            return _tick(tick)

    def complete_retune(self, tick_id: int, *, new_best_mfu: float | None, report: dict[str, Any],
                        incumbent: Incumbent | None, event: ScheduleEvent) -> TickRecord | None:
        from optico.pool.store import _jsonable

        with self._session() as s:
            tick = s.get(TickRow, tick_id)
            if tick is None:
                raise KeyError(f"no tick with id {tick_id}")
            row = s.scalars(select(ScheduleRow).where(ScheduleRow.id == tick.schedule_id).with_for_update()).one()
            s.refresh(tick)
            if tick.status != "retuning":
                return None  # closed already: by another replica, or by `run-now` itself
            tick.status, tick.finished_at = "done", func.now()
            tick.new_best_mfu = new_best_mfu
            tick.report = _jsonable({**(tick.report or {}), **report}, "report")
            if incumbent is not None:
                self._set_incumbent(row, incumbent)
            self._append_schedule_event(s, row.id, event)
            s.flush()
            s.refresh(tick)
            return _tick(tick)

    def get_tick(self, tick_id: int) -> TickRecord:
        with self._session(read=True) as s:
            row = s.get(TickRow, tick_id)
            if row is None:
                raise KeyError(f"no tick with id {tick_id}")
            return _tick(row)

    def ticks(self, schedule_id: int | None = None, *, status: str | None = None, limit: int = 50) -> list[TickRecord]:
        query = select(TickRow).order_by(TickRow.id.desc()).limit(max(0, int(limit)))
        if schedule_id is not None:
            query = query.where(TickRow.schedule_id == schedule_id)
        if status is not None:
            query = query.where(TickRow.status == status)
        with self._session(read=True) as s:
            return [_tick(r) for r in s.scalars(query)]

    def schedule_with_history(self, name: str, limit: int = 50) -> tuple[ScheduleRecord, list[TickRecord]]:
        # A tick's end and its new incumbent are one commit, but two reads see two snapshots: the schedule
        # is read again after its ticks, so a tick seen ended never comes with the incumbent it replaced.
        ticks = self.ticks(self.get_schedule(name).id, limit=limit) if limit else []
        return self.get_schedule(name), ticks

    # -- the schedule event log ----------------------------------------------------------------------
    def add_schedule_event(self, schedule_id: int, event: ScheduleEvent) -> int:
        with self._session() as s:
            row = s.scalars(select(ScheduleRow).where(ScheduleRow.id == schedule_id).with_for_update()).one_or_none()
            if row is None:
                raise KeyError(f"no schedule with id {schedule_id}")
            return self._append_schedule_event(s, schedule_id, event)

    def schedule_events(self, schedule_id: int, after: int = 0, limit: int | None = None) -> list[StoredScheduleEvent]:
        query = (select(ScheduleEventRow)
                 .where(ScheduleEventRow.schedule_id == schedule_id, ScheduleEventRow.seq > after)
                 .order_by(ScheduleEventRow.seq))
        if limit is not None:
            query = query.limit(max(0, int(limit)))
        with self._session(read=True) as s:
            return [StoredScheduleEvent(schedule_id=r.schedule_id, seq=r.seq, created_at=r.created_at,
                                        event=parse_schedule_event({**r.payload, "kind": r.kind}))
                    for r in s.scalars(query)]

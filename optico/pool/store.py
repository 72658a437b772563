"""The pool in a SQL database (SQLite or PostgreSQL) through SQLAlchemy; the contract is `Store`.

Callers get frozen pydantic objects, never ORM rows, and nothing read back is ever turned into
anything but plain data validated by those models.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import Any

from sqlalchemy import Engine, Table, case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from optico import faults, redact
from optico.errors import first_line
from optico.events import (BudgetChanged, JobEvent, JobFinished, JobStateChanged, LeaseChanged, TrialLost,
                           STORED_KINDS, UnreadableEvent, parse_event)
from optico.pool import schema
from optico.pool.contract import SORT_KEYS, IdempotencyConflict, Store, StoreError
from optico.pool.db import default_database_url, make_engine
from optico.pool.lifecycle import (
    WORKER_ONLY,
    IllegalTransition,
    JobStatus,
    LeaseHeld,
    LeaseLost,
    LifecycleError,
    NoNewTrial,
    NothingToResume,
    check_transition,
)
from optico.pool.models import Base, EventRow, JobRow, MessageRow, TrialRow, WorkloadRow
from optico.pool.records import AgentMessage, JobRecord, JobStats, StoredEvent, as_utc
from optico.pool.schedules import ScheduleSql
from optico.pool.tokens import TokenSql
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.textsafe import terminal_text
from optico.trial import Failure, FailureCategory, Metrics, Trial, TrialStatus

__all__ = ["IdempotencyConflict", "SqlStore", "Store", "StoreError", "open_store"]
log = logging.getLogger("optico.pool")

FINISHED_TRIAL_STATUSES = (TrialStatus.OK.value, TrialStatus.FAILED.value)

# Wall-time histogram buckets of finished trials (seconds), for /metrics.
DURATION_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)

# The Core tables, for the upserts (ON CONFLICT is a Core construct).
_WORKLOADS: Table = Base.metadata.tables[WorkloadRow.__tablename__]
_TRIALS: Table = Base.metadata.tables[TrialRow.__tablename__]
_MESSAGES: Table = Base.metadata.tables[MessageRow.__tablename__]


def _jsonable(value: Any, field: str, redactor: redact.Redactor | None = None) -> Any:
    """`value`, redacted (by `redactor`, default every secret known now), as the database will give it
    back, or ValueError naming the field.

    Checked here because the backends fail differently (SQLite's driver raises
    StatementError, psycopg a bare TypeError at execute time), and NaN/Infinity, which
    Python's json writes but PostgreSQL's json type rejects, must not reach either."""
    try:
        plain = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} must be JSON-serialisable (finite numbers, str keys): {exc}") from exc
    return (redactor or redact.current()).scrub(plain)


def _refuse_live_only(event: JobEvent) -> None:
    if event.kind not in STORED_KINDS:  # a log line is published live; `unreadable` is only ever read
        raise ValueError(f"{event.kind} events are never stored")


def spec_redactor(spec: JobSpec) -> redact.Redactor:
    """A redactor for the texts of one submission: every secret known now, and the secret-named
    `launcher.env` values written into this spec. Those stay this submission's: registered for the
    whole process, any writer could make an ordinary word (`MY_TOKEN: nightly`) a secret masked in
    every other job's texts. (The trial never gets them: a stored spec holds `***`, which the worker
    fills from its own environment, and `trial_env` registers what it passes.)"""
    env = spec.launcher.env or {}
    inline = [value for name, value in env.items() if redact.is_secret_name(name) and value != redact.MASK]
    return redact.Redactor([*redact.known_secrets(), *inline])


def spec_for_storage(spec: JobSpec, redactor: redact.Redactor | None = None) -> dict[str, Any]:
    """The spec as stored: secret-named `launcher.env` values masked, every other string redacted
    (by `redactor`, default `spec_redactor(spec)`)."""
    data = spec.model_dump(mode="json")
    env = data.get("launcher", {}).get("env") or {}
    for name in env:
        if redact.is_secret_name(name):
            env[name] = redact.MASK
    return _jsonable(data, "spec", redactor or spec_redactor(spec))


def _spec_hash(stored: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(stored, sort_keys=True).encode()).hexdigest()


def _key_hash(idempotency_key: str) -> str:
    """What the pool keeps of an Idempotency-Key: its hash (a client may put anything in the header,
    a credential included; equality is all the key is for)."""
    return "sha256:" + hashlib.sha256(idempotency_key.encode()).hexdigest()


def _key_matches(idempotency_key: str) -> Any:
    """The rows created with this key: by its hash, or as it was stored before keys were hashed."""
    return JobRow.idempotency_key.in_([_key_hash(idempotency_key), idempotency_key])


# -- rows -> frozen objects --------------------------------------------------------------------

def _trial(row: TrialRow) -> Trial:
    return Trial(
        id=row.id, job_id=row.job_id, index=row.index,
        strategy=Strategy.model_validate(row.strategy), signature=row.signature,
        status=TrialStatus(row.status),
        metrics=Metrics.model_validate(row.metrics) if row.metrics is not None else None,
        failure=Failure.model_validate(row.failure) if row.failure is not None else None,
        rationale=row.rationale, gpu_seconds=row.gpu_seconds + (row.lost_gpu_seconds or 0.0),
        lost_gpu_seconds=row.lost_gpu_seconds or 0.0, fingerprint=row.fingerprint or {},
        log_path=row.log_path, log_excerpt=row.log_excerpt, attempts=row.attempts,
        interruptions=row.interruptions, wall_seconds=row.wall_seconds,
    )


def _job(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id, name=row.name, status=JobStatus(row.status), workload_key=row.workload_key,
        spec=JobSpec.model_validate(row.spec), origin=row.origin, created_at=row.created_at,
        updated_at=row.updated_at, started_at=row.started_at, finished_at=row.finished_at,
        heartbeat_at=row.heartbeat_at, lease_owner=row.lease_owner, lease_expires_at=row.lease_expires_at,
        stop_reason=row.stop_reason, best_trial_id=row.best_trial_id, best_mfu=row.best_mfu, max_trials=row.max_trials,
        gpu_hours=row.gpu_hours, takeovers=row.takeovers,
    )


def _job_or_why(row: JobRow) -> JobRecord | str:
    """The row as a record, or why it cannot be one (a row written by hand, or by a buggy version)."""
    try:
        return _job(row)
    except Exception as exc:  # noqa: BLE001 - any reason: the row is refused, never run or shown
        return first_line(exc)[:300]


def _readable_jobs(rows: Iterable[JobRow]) -> list[JobRecord]:
    """The rows as records, leaving out (with a warning naming it) a row that cannot be one: one job
    written by hand took down every listing, `optico jobs list`, the API's and the dashboard's."""
    out = []
    for row in rows:
        job = _job_or_why(row)
        if isinstance(job, JobRecord):
            out.append(job)
        else:  # the reason may quote the row: masked, and escaped for a terminal
            log.warning("job %s cannot be read (%s); left out of the list", row.id,
                        terminal_text(redact.redact(job), one_line=True, max_chars=300))
    return out


def _message(row: MessageRow) -> AgentMessage:
    return AgentMessage(id=row.id, job_id=row.job_id, iteration=row.iteration, agent=row.agent, kind=row.kind,
                        content=row.content, text=row.text, created_at=row.created_at)


def _event(row: EventRow) -> StoredEvent:
    try:
        event: JobEvent = parse_event({**row.payload, "kind": row.kind})
    except Exception as exc:  # noqa: BLE001 - a row that is no event: said in its place, the stream goes on
        event = UnreadableEvent(stored_kind=redact.redact(str(row.kind))[:40], reason=redact.redact(first_line(exc))[:200])
    return StoredEvent(job_id=row.job_id, seq=row.seq, created_at=row.created_at, event=event)


# -- the query vocabulary ------------------------------------------------------------------------

def _trial_or_raise(session: Session, trial_id: int) -> TrialRow:
    row = session.get(TrialRow, trial_id)
    if row is None:
        raise KeyError(f"no trial with id {trial_id}")
    return row


class SqlStore(ScheduleSql, TokenSql, Store):
    """The pool in SQLite or PostgreSQL; see `Store` for the contract (retuning schedules: `ScheduleSql`).

    `url` defaults to `default_database_url()`. With `upgrade=True` the schema is migrated to
    this optico's head on open; with `upgrade=False` an outdated schema raises
    `schema.SchemaError` naming the command that fixes it."""

    def __init__(self, url: str | None = None, *, upgrade: bool = True):
        self.url = url or default_database_url()
        self._engine: Engine = make_engine(self.url)
        try:
            if not upgrade:
                schema.ensure_current(self._engine)
            elif schema.current_revision(self._engine) != schema.head_revision():
                schema.upgrade(self._engine)
        except BaseException:
            self._engine.dispose()
            raise
        # expire_on_commit=False: rows become frozen objects inside the transaction anyway.
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self._postgres = self._engine.dialect.name == "postgresql"
        # SQLite: reads get their own engine with deferred transactions (see make_engine); PostgreSQL's
        # MVCC readers never wait for writers anyway.
        self._read_engine = self._engine if self._postgres or ":memory:" in self.url \
            else make_engine(self.url, readonly=True)
        self._read_sessions = sessionmaker(self._read_engine, expire_on_commit=False)
        self._touch_attempts: dict[int, float] = {}  # token id -> when "last used" was last written (TokenSql)
        self._closed = False

    @property
    def engine(self) -> Engine:
        """For tests and the schema tools; application code goes through the methods."""
        return self._engine

    @property
    def read_engine(self) -> Engine:
        """The engine of read-only transactions (on SQLite, deferred: they never wait for a writer)."""
        return self._read_engine

    @contextmanager
    def _session(self, *, read: bool = False) -> Iterator[Session]:
        """The one transaction helper: commit at the end, roll back and re-raise on any error
        (database errors as StoreError), always close. `read=True`: a read-only transaction that
        never waits for writers (it must not write)."""
        if self._closed:
            raise StoreError("the store is closed")
        session = (self._read_sessions if read else self._sessions)()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(redact.redact(f"pool database error: {exc}")) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _insert(self, table: Table) -> postgresql.Insert | sqlite.Insert:
        """INSERT with the backend's ON CONFLICT clause available (both spell it alike)."""
        return postgresql.insert(table) if self._postgres else sqlite.insert(table)

    def _now(self, s: Session) -> datetime:
        """The database clock, UTC-aware, with sub-second precision on both backends."""
        if self._postgres:
            return as_utc(s.execute(select(func.clock_timestamp())).scalar_one())
        text = s.execute(select(func.strftime("%Y-%m-%d %H:%M:%f", "now"))).scalar_one()
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)

    def _stamp(self, value: datetime) -> datetime:
        """A timestamp as this backend stores it (SQLite: naive UTC, so strings compare in order)."""
        return value if self._postgres else value.astimezone(timezone.utc).replace(tzinfo=None)

    def _lock_job(self, s: Session, job_id: int) -> JobRow:
        """The job's row, locked for this transaction (PostgreSQL row lock; SQLite's BEGIN IMMEDIATE
        already holds the one write lock). KeyError if unknown."""
        row = s.scalars(select(JobRow).where(JobRow.id == job_id).with_for_update()).one_or_none()
        if row is None:
            raise KeyError(f"no job with id {job_id}")
        return row

    def _job_row(self, s: Session, job_id: int) -> JobRow:
        row = s.get(JobRow, job_id)
        if row is None:
            raise KeyError(f"no job with id {job_id}")
        return row

    def _fence(self, s: Session, job_id: int, worker: str | None) -> JobRow:
        """The job row, locked; LeaseLost unless `worker` (when given) holds the lease."""
        row = self._lock_job(s, job_id)
        if worker is not None and row.lease_owner != worker:
            raise LeaseLost(job_id, worker, row.lease_owner)
        return row

    def _append_event(self, s: Session, job_id: int, event: JobEvent) -> int:
        """Adds `event` inside the caller's transaction, the job row already locked."""
        last = s.execute(select(func.max(EventRow.seq)).where(EventRow.job_id == job_id)).scalar_one()
        seq = int(last or 0) + 1
        payload = _jsonable(event.model_dump(mode="json", exclude={"kind"}), "event")
        s.add(EventRow(job_id=job_id, seq=seq, kind=event.kind, payload=payload))
        s.flush()
        return seq

    # -- jobs ----------------------------------------------------------------------------
    def submit_job(self, spec: JobSpec, *, origin: str = "queue", idempotency_key: str | None = None
                   ) -> tuple[int, bool]:
        if origin not in ("queue", "cli"):
            raise ValueError(f"origin must be 'queue' or 'cli', got {origin!r}")
        redactor = spec_redactor(spec)
        stored = spec_for_storage(spec, redactor)
        digest = _spec_hash(stored)
        key = spec.workload.key()
        try:
            with self._session() as s:
                if idempotency_key is not None:
                    existing = s.scalars(select(JobRow).where(_key_matches(idempotency_key))).first()
                    if existing is not None:
                        return self._same_spec(existing, digest), False
                # DO NOTHING rather than check-then-insert: two jobs on a new workload may come at once.
                s.execute(self._insert(_WORKLOADS)
                          .values(key=key, description=redactor.text(spec.workload.describe()),
                                  workload=_jsonable(spec.workload.model_dump(mode="json"), "workload", redactor))
                          .on_conflict_do_nothing(index_elements=["key"]))
                row = JobRow(name=redactor.text(spec.name), status=JobStatus.QUEUED.value, workload_key=key,
                             spec=stored, origin=origin, max_trials=spec.budget.max_trials,
                             gpu_hours=spec.budget.gpu_hours,
                             idempotency_key=None if idempotency_key is None else _key_hash(idempotency_key),
                             spec_hash=digest)
                s.add(row)
                s.flush()
                self._append_event(s, row.id, JobStateChanged(status=JobStatus.QUEUED.value, reason="created"))
                return row.id, True
        except StoreError as exc:
            # Two requests with one new key raced: the loser reads the winner's job.
            if idempotency_key is None or not isinstance(exc.__cause__, IntegrityError):
                raise
            with self._session() as s:
                existing = s.scalars(select(JobRow).where(_key_matches(idempotency_key))).one()
                return self._same_spec(existing, digest), False

    @staticmethod
    def _same_spec(row: JobRow, digest: str) -> int:
        # The key is not echoed: it may hold anything a client sent.
        if row.spec_hash != digest:
            raise IdempotencyConflict(f"this Idempotency-Key was used for job {row.id} with a different spec")
        return row.id

    def job_id_for_key(self, idempotency_key: str) -> int | None:
        with self._session(read=True) as s:
            return s.scalars(select(JobRow.id).where(_key_matches(idempotency_key))).first()

    def get_job(self, job_id: int) -> JobRecord:
        with self._session(read=True) as s:
            return _job(self._job_row(s, job_id))

    def list_jobs(self, limit: int = 50, *, status: JobStatus | None = None, workload_key: str | None = None,
                  name: str | None = None, before_id: int | None = None) -> list[JobRecord]:
        query = select(JobRow).order_by(JobRow.id.desc()).limit(max(0, int(limit)))
        if status is not None:
            query = query.where(JobRow.status == JobStatus(status).value)
        if workload_key is not None:
            query = query.where(JobRow.workload_key == workload_key)
        if name:
            query = query.where(JobRow.name.contains(name, autoescape=True))
        if before_id is not None:
            query = query.where(JobRow.id < before_id)
        with self._session(read=True) as s:
            return _readable_jobs(s.scalars(query))

    def search_jobs(self, *, status: JobStatus | None = None, workload_key: str | None = None,
                    name: str | None = None, sort: str = "id", descending: bool = True, offset: int = 0,
                    limit: int = 50) -> tuple[list[JobRecord], int]:
        if sort not in SORT_KEYS:
            raise ValueError(f"sort: one of {', '.join(SORT_KEYS)}, got {sort!r}")
        where = []
        if status is not None:
            where.append(JobRow.status == JobStatus(status).value)
        if workload_key is not None:
            where.append(JobRow.workload_key == workload_key)
        if name:
            where.append(JobRow.name.contains(name, autoescape=True))
        column = getattr(JobRow, sort)
        order = column.desc() if descending else column.asc()
        query = (select(JobRow).where(*where).order_by(column.is_(None), order, JobRow.id.desc())
                 .offset(max(0, int(offset))).limit(max(0, int(limit))))
        with self._session(read=True) as s:
            total = s.execute(select(func.count()).select_from(JobRow).where(*where)).scalar_one()
            return _readable_jobs(s.scalars(query)), int(total)

    def job_stats(self, job_ids: list[int]) -> dict[int, JobStats]:
        if not job_ids:
            return {}
        counts = [func.coalesce(func.sum(case((TrialRow.status == st.value, 1), else_=0)), 0)
                  for st in (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.LOST, TrialStatus.RUNNING)]
        with self._session(read=True) as s:
            rows = s.execute(select(TrialRow.job_id, func.count(), func.coalesce(func.sum(TrialRow.gpu_seconds + TrialRow.lost_gpu_seconds), 0.0),
                                    *counts).where(TrialRow.job_id.in_(job_ids)).group_by(TrialRow.job_id)).all()
            best_ids = s.execute(select(JobRow.id, JobRow.best_trial_id).where(JobRow.id.in_(job_ids))).all()
            wanted = [b for _, b in best_ids if b is not None]
            best = {r.job_id: _trial(r) for r in s.scalars(select(TrialRow).where(TrialRow.id.in_(wanted)))} \
                if wanted else {}
            first = {r.job_id: _trial(r) for r in s.scalars(
                select(TrialRow).where(TrialRow.job_id.in_(job_ids), TrialRow.index == 1))}
        stats = {job_id: JobStats(job_id=job_id, best=best.get(job_id), first=first.get(job_id))
                 for job_id, _ in best_ids}
        for job_id, total, gpu_seconds, ok, failed, lost, running in rows:
            stats[job_id] = JobStats(job_id=job_id, trials=int(total), ok=int(ok), failed=int(failed), lost=int(lost),
                                     running=int(running), gpu_seconds=float(gpu_seconds), best=best.get(job_id),
                                     first=first.get(job_id))
        return stats

    def db_now(self) -> datetime:
        with self._session(read=True) as s:
            return self._now(s)

    # -- the lifecycle ---------------------------------------------------------------------
    def transition(self, job_id: int, to: JobStatus, *, reason: str | None = None, worker: str | None = None,
                   then: JobEvent | None = None, only_from: frozenset[JobStatus] | None = None) -> JobRecord:
        to = JobStatus(to)
        with self._session() as s:
            row = self._lock_job(s, job_id)
            current = JobStatus(row.status)
            if only_from is not None and current not in only_from:
                raise IllegalTransition(job_id, current, to)
            if to in WORKER_ONLY and worker is None:
                raise ValueError(f"only the worker holding job {job_id} may make it {to.value}")
            if worker is not None and row.lease_owner != worker:
                raise LeaseLost(job_id, worker, row.lease_owner)
            check_transition(job_id, current, to)
            if to is JobStatus.QUEUED:
                self._check_resumable(s, row)
            now = self._now(s)
            lease_live = row.lease_owner is not None and row.lease_expires_at is not None \
                and as_utc(row.lease_expires_at) > now
            row.status = to.value
            # A cancel of a run whose worker is alive keeps the lease: that worker kills the running trial,
            # records it lost and releases the lease itself. A cancel of a run nobody runs (interrupted,
            # or its worker is gone) is settled here, as that worker would have: trial lost, job_done.
            cancel = to is JobStatus.CANCELLED and worker is None
            keeps_lease = cancel and current.active and lease_live
            settle_cancel = cancel and not keeps_lease and (current.active or current is JobStatus.INTERRUPTED)
            if to.final:
                row.finished_at = self._stamp(now)
                if not (keeps_lease or settle_cancel):  # settling lets the lease go itself, saying so
                    row.lease_owner, row.lease_expires_at = None, None
            if reason is not None and (to.final or to is JobStatus.STOPPING):
                row.stop_reason = redact.redact(reason)
            if to is JobStatus.INTERRUPTED and worker is not None:
                self._close_attempts(s, job_id, now)
                # Its own worker stopped it cleanly (a shutdown, Ctrl-C): the running trial's launch was
                # killed by us, not by the trial, and does not count toward the deaths that make it lost.
                s.execute(update(TrialRow).where(
                    TrialRow.job_id == job_id, TrialRow.status == TrialStatus.RUNNING.value,
                    TrialRow.attempts > TrialRow.interruptions).values(interruptions=TrialRow.interruptions + 1)
                    .execution_options(synchronize_session=False))
            if to is JobStatus.QUEUED:
                row.stop_reason, row.finished_at = None, None
                row.origin = "queue"  # queued again (`jobs resume`, the API): the workers' now, whoever started it
            self._append_event(s, job_id, JobStateChanged(status=to.value, previous=current.value,
                                                          reason=redact.redact(reason) if reason else None,
                                                          worker=worker))
            if settle_cancel:
                self._settle_cancel(s, row, "the job was cancelled while no worker ran it")
            if then is not None:
                self._append_event(s, job_id, then)
            s.flush()
            return _job(row)

    def claim_job(self, worker: str, lease_s: float, *, job_id: int | None = None) -> JobRecord | None:
        with self._session() as s:
            now = self._now(s)
            if job_id is not None:
                row = self._lock_job(s, job_id)
                status = JobStatus(row.status)
                if status.finished:
                    raise IllegalTransition(job_id, status, JobStatus.RUNNING)
                self._check_resumable(s, row)
                expires = as_utc(row.lease_expires_at) if row.lease_expires_at is not None else None
                if row.lease_owner not in (None, worker) and expires is not None and expires > now:
                    raise LeaseHeld(job_id, row.lease_owner, expires)
            else:
                self._settle_abandoned_cancels(s, now)
                expired = (JobRow.status.in_([JobStatus.RUNNING.value, JobStatus.STOPPING.value])
                           & (or_(JobRow.lease_expires_at.is_(None), JobRow.lease_expires_at < self._stamp(now))))
                claimable = (JobRow.origin == "queue") & or_(
                    JobRow.status.in_([JobStatus.QUEUED.value, JobStatus.INTERRUPTED.value]), expired)
                query = select(JobRow).where(claimable).order_by(JobRow.id).limit(1)
                if self._postgres:
                    # Each claimer skips rows another claimer has locked: no two get the same job.
                    query = query.with_for_update(skip_locked=True)
                while True:
                    row = s.scalars(query).first()
                    if row is None:
                        return None
                    unreadable = _job_or_why(row)
                    if isinstance(unreadable, JobRecord):
                        break
                    # Claimed, it raised out of every worker's loop on every poll (and the job stayed queued).
                    row.status, row.finished_at = JobStatus.FAILED.value, self._stamp(now)
                    row.lease_owner = row.lease_expires_at = None
                    row.stop_reason = redact.redact(f"its stored row cannot be read: {unreadable}")[:500]
                    s.flush()
            return _job(self._take(s, row, worker, lease_s, now))

    def _check_resumable(self, s: Session, row: JobRow) -> None:
        """Raises NothingToResume for a failed job whose loop ended (its `job_done` is logged): the loop
        would start at its end and run nothing, and its stop reason would be lost."""
        if row.status != JobStatus.FAILED.value:
            return
        ended = s.scalar(select(EventRow.id).where(EventRow.job_id == row.id, EventRow.kind == "job_done").limit(1))
        if ended is not None:
            raise NothingToResume(row.id, row.stop_reason)

    def settle_abandoned_cancels(self, job_id: int | None = None) -> int:
        """Settles every job (or job `job_id`) cancelled while its worker looked alive, whose lease has
        since expired: that worker is gone. Returns how many were settled. Claimers call it on every
        poll; an event stream and `optico jobs show` call it, so a pool without workers settles too."""
        with self._session() as s:
            return self._settle_abandoned_cancels(s, self._now(s), job_id)

    def _settle_abandoned_cancels(self, s: Session, now: datetime, job_id: int | None = None) -> int:
        """A job cancelled while its worker was alive-looking keeps that worker's lease, for the worker
        to record its running trial lost and let go (`transition`). If the worker was in fact dead,
        nobody would: once the lease has expired, this does it instead."""
        abandoned = ((JobRow.status == JobStatus.CANCELLED.value) & JobRow.lease_owner.is_not(None)
                     & (JobRow.lease_expires_at < self._stamp(now)))
        if job_id is not None:
            abandoned = abandoned & (JobRow.id == job_id)
        query = select(JobRow).where(abandoned)
        if self._postgres:
            query = query.with_for_update(skip_locked=True)
        jobs = s.scalars(query).all()
        for job in jobs:
            self._settle_cancel(s, job, "the job was cancelled while its worker was gone")
        s.flush()
        return len(jobs)

    def _settle_cancel(self, s: Session, job: JobRow, reason: str) -> None:
        """What the worker of a cancelled run would write, for a run whose worker is gone: its running
        trial lost, job_done, and the lease let go. Inside the caller's transaction, the job row locked."""
        self._close_attempts(s, job.id, job.heartbeat_at)
        trials = s.scalars(select(TrialRow).where(TrialRow.job_id == job.id)).all()
        for trial in trials:
            if self._lose(trial, reason):  # as its worker would have said it
                self._append_event(s, job.id, TrialLost(index=trial.index, reason=redact.redact(reason)))
        best = [t.mfu for t in map(_trial, trials) if t.mfu is not None]
        self._append_event(s, job.id, JobFinished(status=JobStatus.CANCELLED.value, stop_reason="cancelled",
                                                  trials=len(trials), best_mfu=max(best) if best else None))
        if job.lease_owner is not None:
            self._append_event(s, job.id, LeaseChanged(action="expired", worker=job.lease_owner))
        job.lease_owner, job.lease_expires_at = None, None

    def _take(self, s: Session, row: JobRow, worker: str, lease_s: float, now: datetime) -> JobRow:
        previous_owner, status = row.lease_owner, JobStatus(row.status)
        takeover = status.active and previous_owner not in (None, worker)
        # A launch still open ran under a worker that died: it ran until that worker's last heartbeat.
        self._close_attempts(s, row.id, row.heartbeat_at)
        expires = now + timedelta(seconds=lease_s)
        row.lease_owner, row.lease_expires_at, row.heartbeat_at = worker, self._stamp(expires), self._stamp(now)
        if not status.active:
            check_transition(row.id, status, JobStatus.RUNNING)
            row.status = JobStatus.RUNNING.value
            row.stop_reason = None
            row.finished_at = None
            if row.started_at is None:
                row.started_at = self._stamp(now)
            self._append_event(s, row.id, JobStateChanged(status=JobStatus.RUNNING.value, previous=status.value,
                                                          reason="claimed", worker=worker))
        if takeover:
            row.takeovers = (row.takeovers or 0) + 1
        action = "taken_over" if takeover else "acquired"
        self._append_event(s, row.id, LeaseChanged(action=action, worker=worker, previous_worker=previous_owner,
                                                   expires_at=expires))
        s.flush()
        return row

    def renew_lease(self, job_id: int, worker: str, lease_s: float) -> JobRecord:
        with self._session() as s:
            row = self._fence(s, job_id, worker)
            now = self._now(s)
            # A Core UPDATE so that updated_at stays: it means "last changed", and a renewal is not a change.
            s.execute(update(JobRow).where(JobRow.id == job_id).values(
                lease_expires_at=self._stamp(now + timedelta(seconds=lease_s)), heartbeat_at=self._stamp(now),
                updated_at=JobRow.updated_at).execution_options(synchronize_session=False))
            s.refresh(row)
            faults.point("lease_renewal")
            return _job(row)

    def release_lease(self, job_id: int, worker: str) -> None:
        with self._session() as s:
            row = self._lock_job(s, job_id)
            if row.lease_owner == worker:
                row.lease_owner, row.lease_expires_at = None, None
                self._append_event(s, job_id, LeaseChanged(action="released", worker=worker))

    def set_budget(self, job_id: int, *, max_trials: int | None = None, gpu_hours: float | None = None) -> JobRecord:
        if max_trials is not None and (isinstance(max_trials, bool) or int(max_trials) < 1):
            raise ValueError("max_trials: must be at least 1")
        if gpu_hours is not None and not (0 < float(gpu_hours) < float("inf")):
            raise ValueError("gpu_hours: must be a positive number")
        with self._session() as s:
            row = self._lock_job(s, job_id)
            status = JobStatus(row.status)
            if status.finished:
                raise LifecycleError(f"job {job_id} is {status.value}; its budget can no longer change")
            if max_trials is not None:
                row.max_trials = int(max_trials)
            if gpu_hours is not None:
                row.gpu_hours = float(gpu_hours)
            self._append_event(s, job_id, BudgetChanged(max_trials=row.max_trials, gpu_hours=row.gpu_hours))
            s.flush()
            return _job(row)

    def set_best_trial(self, job_id: int, trial_id: int, *, worker: str | None = None) -> None:
        with self._session() as s:
            row = self._fence(s, job_id, worker)
            trial = _trial_or_raise(s, trial_id)
            if trial.job_id != job_id:
                raise ValueError(f"best trial {trial_id} is a trial of job {trial.job_id}, not of job {job_id}")
            if row.best_trial_id != trial_id:
                row.best_trial_id = trial_id
            mfu = (trial.metrics or {}).get("mfu")
            row.best_mfu = float(mfu) if isinstance(mfu, (int, float)) else None

    # -- trials ----------------------------------------------------------------------------
    def start_trial(self, job_id: int, index: int, strategy: Strategy, rationale: str = "", *,
                    worker: str | None = None) -> Trial:
        with self._session() as s:
            job = self._fence(s, job_id, worker)
            found = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.index == index)).first()
            if found is not None:
                return _trial(found)  # a re-run after a crash reads the trial its worker started
            # Compare-and-set on the job's status, under the job row's lock: a stop or cancel that landed
            # while the agents chose (LLM round-trips take minutes) starts no run.
            status = JobStatus(job.status)
            if status is JobStatus.STOPPING or status.final:
                raise NoNewTrial(job_id, status)
            # ON CONFLICT DO NOTHING then read back: a second claim of the index reads the first's row.
            s.execute(self._insert(_TRIALS)
                      .values(job_id=job_id, index=index, signature=strategy.signature(),
                              strategy=strategy.model_dump(mode="json"), status=TrialStatus.RUNNING.value,
                              rationale=redact.redact(rationale), gpu_seconds=0.0, fingerprint={}, log_excerpt="",
                              attempts=0, interruptions=0)
                      .on_conflict_do_nothing(index_elements=["job_id", "index"]))
            row = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.index == index)).one()
            return _trial(row)

    def begin_attempt(self, trial_id: int, *, gpus: int = 0, worker: str | None = None) -> Trial:
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            self._fence(s, row.job_id, worker)
            if row.status != TrialStatus.RUNNING.value:
                raise ValueError(f"trial {trial_id} is {row.status}; only a running trial is re-run")
            now = self._now(s)
            self._close_attempts(s, row.job_id, now)  # one its own worker left open (a launch that raised)
            row.attempts = row.attempts + 1
            row.attempt_started_at, row.attempt_gpus = self._stamp(now), max(0, int(gpus))
            s.flush()
            return _trial(row)

    def finish_trial(self, trial_id: int, *, status: TrialStatus, metrics: Metrics | None = None,
                     failure: Failure | None = None, gpu_seconds: float = 0.0,
                     fingerprint: dict[str, Any] | None = None, log_path: str | None = None,
                     log_excerpt: str = "", wall_seconds: float | None = None, worker: str | None = None) -> Trial:
        status = TrialStatus(status)
        if status not in (TrialStatus.OK, TrialStatus.FAILED):
            raise ValueError(f"finish_trial: status must be ok or failed, got {status.value}")
        values: dict[str, Any] = {
            "status": status.value,
            "metrics": _jsonable(metrics.model_dump(mode="json"), "metrics") if metrics is not None else None,
            "failure": _jsonable(failure.model_dump(mode="json"), "failure") if failure is not None else None,
            "gpu_seconds": float(gpu_seconds),
            "fingerprint": _jsonable(dict(fingerprint or {}), "fingerprint"),
            "log_path": log_path,
            "log_excerpt": redact.redact(log_excerpt),
        }
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            self._fence(s, row.job_id, worker)
            changed = row.finished_at is None or any(getattr(row, k) != v for k, v in values.items())
            if changed:
                for key, value in values.items():
                    setattr(row, key, value)
                if wall_seconds is not None:
                    row.wall_seconds = float(wall_seconds)
                row.attempt_started_at = None  # its GPU time is the result's
                row.finished_at = func.now()  # the database clock, like every timestamp here
                s.flush()
            return _trial(row)

    def lose_trial(self, trial_id: int, reason: str, *, worker: str | None = None) -> Trial:
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            self._fence(s, row.job_id, worker)
            self._close_attempts(s, row.job_id, self._now(s))  # its worker killed the launch just now
            self._lose(row, reason)
            s.flush()
            return _trial(row)

    @staticmethod
    def _lose(row: TrialRow, reason: str) -> bool:
        """Marks `row` lost if it is still running (its run ended without a result we can trust); whether
        it was."""
        if row.status != TrialStatus.RUNNING.value:
            return False
        row.status = TrialStatus.LOST.value
        row.failure = _jsonable(Failure(category=FailureCategory.INFRASTRUCTURE, summary=redact.redact(
            f"lost: {reason}"), confidence=100).model_dump(mode="json"), "failure")
        row.finished_at = func.now()
        return True

    @staticmethod
    def _close_attempts(s: Session, job_id: int, ended: datetime | None) -> None:
        """Job `job_id`'s launch still open ended without a result at `ended` (None: unknown, nothing
        added): its GPU time goes to its trial's lost_gpu_seconds, and it is open no more."""
        for row in s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.attempt_started_at.is_not(None))):
            if ended is not None:
                seconds = max(0.0, (as_utc(ended) - as_utc(row.attempt_started_at)).total_seconds())
                row.lost_gpu_seconds = (row.lost_gpu_seconds or 0.0) + seconds * (row.attempt_gpus or 0)
            row.attempt_started_at = None

    def set_trial_failure(self, trial_id: int, failure: Failure, *, worker: str | None = None) -> Trial:
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            self._fence(s, row.job_id, worker)
            if row.status == TrialStatus.OK.value:
                raise ValueError(f"trial {trial_id} succeeded; a failure analysis cannot be attached to it")
            row.failure = _jsonable(failure.model_dump(mode="json"), "failure")
            s.flush()
            return _trial(row)

    def get_trial(self, trial_id: int) -> Trial:
        with self._session(read=True) as s:
            return _trial(_trial_or_raise(s, trial_id))

    def trials(self, job_id: int, *, after_index: int = 0) -> list[Trial]:
        with self._session(read=True) as s:
            self._job_row(s, job_id)
            rows = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.index > after_index)
                             .order_by(TrialRow.index))
            return [_trial(r) for r in rows]

    def workload_trials(self, workload_key: str, exclude_job: int | None = None) -> list[Trial]:
        query = (select(TrialRow).join(JobRow, TrialRow.job_id == JobRow.id)
                 .where(JobRow.workload_key == workload_key, TrialRow.status.in_(FINISHED_TRIAL_STATUSES))
                 .order_by(TrialRow.job_id, TrialRow.index))
        if exclude_job is not None:
            query = query.where(TrialRow.job_id != exclude_job)
        with self._session(read=True) as s:
            return [_trial(r) for r in s.scalars(query)]

    # -- the message pool and the event log ---------------------------------------------------
    def add_message(self, job_id: int, iteration: int, agent: str, kind: str, content: dict[str, Any],
                    text: str = "", *, worker: str | None = None, event: JobEvent | None = None) -> int:
        if event is not None:
            _refuse_live_only(event)
        content = _jsonable(dict(content), "content")
        usage = {k: content.get(k) for k in ("prompt_tokens", "completion_tokens", "cost_usd")}
        usage = {k: (v if isinstance(v, (int, float)) and not isinstance(v, bool) else None) for k, v in usage.items()}
        values = dict(job_id=job_id, iteration=iteration, agent=agent, kind=kind, content=content,
                      text=redact.redact(text), **usage)
        with self._session() as s:
            if worker is not None or event is not None:
                self._fence(s, job_id, worker)  # an event's seq is allocated under the job's row lock
            else:
                self._job_row(s, job_id)
            message_id = int(s.execute(self._message_upsert, values).scalar_one())
            if event is not None:
                self._append_event(s, job_id, event)
            return message_id

    @cached_property
    def _message_upsert(self) -> postgresql.Insert | sqlite.Insert:
        """INSERT of a message that replaces the same (job, iteration, agent, kind); built once, its
        values bound per call (building it cost as much as running it)."""
        insert = self._insert(_MESSAGES)
        return (insert.on_conflict_do_update(index_elements=["job_id", "iteration", "agent", "kind"],
                                             set_={"content": insert.excluded.content, "text": insert.excluded.text,
                                                   "prompt_tokens": insert.excluded.prompt_tokens,
                                                   "completion_tokens": insert.excluded.completion_tokens,
                                                   "cost_usd": insert.excluded.cost_usd, "created_at": func.now()})
                .returning(_MESSAGES.c.id))

    def messages(self, job_id: int, iteration: int | None = None, *, after_id: int = 0) -> list[AgentMessage]:
        query = select(MessageRow).where(MessageRow.job_id == job_id, MessageRow.id > after_id)
        if iteration is not None:
            query = query.where(MessageRow.iteration == iteration)
        with self._session(read=True) as s:
            self._job_row(s, job_id)
            return [_message(r) for r in s.scalars(query.order_by(MessageRow.iteration, MessageRow.id))]

    def add_event(self, job_id: int, event: JobEvent, *, worker: str | None = None) -> int:
        _refuse_live_only(event)
        with self._session() as s:
            self._fence(s, job_id, worker)
            return self._append_event(s, job_id, event)

    def events(self, job_id: int, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        query = select(EventRow).where(EventRow.job_id == job_id, EventRow.seq > after).order_by(EventRow.seq)
        if limit is not None:
            query = query.limit(max(0, int(limit)))
        with self._session(read=True) as s:
            self._job_row(s, job_id)
            return [_event(r) for r in s.scalars(query)]

    def last_event_seq(self, job_id: int) -> int:
        with self._session(read=True) as s:
            self._job_row(s, job_id)
            return int(s.execute(select(func.max(EventRow.seq)).where(EventRow.job_id == job_id)).scalar_one() or 0)

    # -- service figures --------------------------------------------------------------------
    def service_stats(self) -> dict[str, Any]:
        with self._session(read=True) as s:
            jobs = dict(s.execute(select(JobRow.status, func.count()).group_by(JobRow.status)).all())
            trials = dict(s.execute(select(TrialRow.status, func.count()).group_by(TrialRow.status)).all())
            timed = TrialRow.wall_seconds.is_not(None)
            buckets = [func.coalesce(func.sum(case((TrialRow.wall_seconds <= b, 1), else_=0)), 0)
                       for b in DURATION_BUCKETS]
            row = s.execute(select(func.count(), func.coalesce(func.sum(TrialRow.wall_seconds), 0.0), *buckets)
                            .where(timed)).one()
            llm = s.execute(select(func.coalesce(func.sum(MessageRow.prompt_tokens), 0),
                                   func.coalesce(func.sum(MessageRow.completion_tokens), 0),
                                   func.coalesce(func.sum(MessageRow.cost_usd), 0.0))).one()
            takeovers = s.execute(select(func.coalesce(func.sum(JobRow.takeovers), 0))).scalar_one()
        return {
            "jobs": {JobStatus(k).value: int(v) for k, v in jobs.items()},
            "trials": {str(k): int(v) for k, v in trials.items()},
            "trial_seconds": {"count": int(row[0]), "sum": float(row[1]),
                              "buckets": dict(zip(DURATION_BUCKETS, (int(x) for x in row[2:])))},
            "llm": {"prompt_tokens": int(llm[0]), "completion_tokens": int(llm[1]), "cost_usd": float(llm[2])},
            "lease_takeovers": int(takeovers),
        }

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine.dispose()
            self._read_engine.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self._engine.url.render_as_string(hide_password=True)!r})"


def open_store(url: str | None = None) -> SqlStore:
    """The pool at `url` (default: `default_database_url()`), migrated to head."""
    return SqlStore(url)

"""The global message pool: jobs, their trials, the agents' messages and an audit trail.

`Store` is the contract every backend keeps; `SqlStore` keeps it on SQLite or
PostgreSQL through SQLAlchemy. Callers get frozen pydantic objects, never ORM rows.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from sqlalchemy import Engine, Table, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from optico.pool import schema
from optico.pool.db import default_database_url, make_engine
from optico.pool.models import Base, EventRow, JobRow, MessageRow, TrialRow, WorkloadRow
from optico.pool.records import AgentMessage, Event, JobRecord, JobStatus, as_utc
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import Failure, Metrics, Trial, TrialStatus

FINISHED_TRIAL_STATUSES = (TrialStatus.OK.value, TrialStatus.FAILED.value)

# The Core tables, for the upserts (ON CONFLICT is a Core construct).
_WORKLOADS: Table = Base.metadata.tables[WorkloadRow.__tablename__]
_TRIALS: Table = Base.metadata.tables[TrialRow.__tablename__]
_MESSAGES: Table = Base.metadata.tables[MessageRow.__tablename__]


class StoreError(RuntimeError):
    """The database itself failed (lost connection, lock timeout, a broken constraint).

    The transaction was rolled back; the driver's exception is chained as __cause__."""


class Store(ABC):
    """The global message pool: the one place a job's history lives.

    Thread safety: one Store may be shared by any number of threads. Every method is
    one transaction of its own: it commits before returning, or rolls back and raises.
    Several processes may open stores on the same database at once.

    Ownership: a job belongs to the one worker running it. Only that worker writes the
    job's trials and messages; anyone (the dashboard, the REST API, a warm-starting job)
    may read at any time. Writes are safe to repeat, because a worker resumed after a
    crash re-runs the graph node that was interrupted:
    - `start_trial` is keyed by (job, index): a second call returns the existing trial,
      whatever its status, so a trial is never launched twice under two ids;
    - `finish_trial` with the same values is a no-op, with other values it overwrites;
    - `add_message` replaces the message of the same (job, iteration, agent, kind).
    `add_event` is the exception: events are an append-only log.

    Errors: an unknown job or trial id raises KeyError; an argument that contradicts
    what is stored (a finishing status of RUNNING, a failure on a successful trial, a
    best trial of another job) raises ValueError; a database failure raises StoreError.
    Nothing is written when a method raises.
    """

    # -- jobs ----------------------------------------------------------------------------
    @abstractmethod
    def create_job(self, spec: JobSpec) -> int:
        """Stores a new job (status QUEUED) and its workload if unseen; returns its id."""

    @abstractmethod
    def get_job(self, job_id: int) -> JobRecord:
        """The job; KeyError if unknown."""

    @abstractmethod
    def list_jobs(self, limit: int = 50) -> list[JobRecord]:
        """The `limit` most recently created jobs, newest first."""

    @abstractmethod
    def set_job_status(self, job_id: int, status: JobStatus, *, stop_reason: str | None = None,
                       best_trial_id: int | None = None) -> None:
        """Sets the status; `stop_reason` and `best_trial_id` are changed only when given.

        KeyError if the job or the trial is unknown; ValueError if the trial belongs to
        another job."""

    @abstractmethod
    def heartbeat(self, job_id: int) -> None:
        """Records that the job's worker is alive, by the database clock; KeyError if unknown."""

    @abstractmethod
    def stale_jobs(self, max_age_s: float) -> list[JobRecord]:
        """RUNNING jobs whose last heartbeat (or status change, if none) is more than
        `max_age_s` old by the database clock: their worker is presumed dead. Oldest first."""

    # -- trials ----------------------------------------------------------------------------
    @abstractmethod
    def start_trial(self, job_id: int, index: int, strategy: Strategy, rationale: str = "") -> Trial:
        """Claims trial `index` (1-based) of the job, status RUNNING, and returns it.

        Idempotent: if the job already has a trial with this index, that trial is returned
        unchanged whatever its status or strategy (compare `signature` if it matters).
        KeyError if the job is unknown."""

    @abstractmethod
    def finish_trial(self, trial_id: int, *, status: TrialStatus, metrics: Metrics | None = None,
                     failure: Failure | None = None, gpu_seconds: float = 0.0,
                     fingerprint: dict[str, Any] | None = None, log_path: str | None = None,
                     log_excerpt: str = "") -> Trial:
        """Records the outcome (status OK or FAILED) and returns the updated trial.

        Every field is set to the given value (None clears it). Repeating the call with the
        same values changes nothing, not even the finish time. KeyError if the trial is
        unknown; ValueError if `status` is RUNNING."""

    @abstractmethod
    def set_trial_failure(self, trial_id: int, failure: Failure) -> Trial:
        """Attaches the failure analysis, which arrives after the run; returns the trial.

        KeyError if unknown; ValueError if the trial succeeded."""

    @abstractmethod
    def get_trial(self, trial_id: int) -> Trial:
        """The trial; KeyError if unknown."""

    @abstractmethod
    def trials(self, job_id: int) -> list[Trial]:
        """The job's trials in index order; KeyError if the job is unknown."""

    @abstractmethod
    def workload_trials(self, workload_key: str, exclude_job: int | None = None) -> list[Trial]:
        """Finished (OK or FAILED) trials of every job on the workload with this key,
        except `exclude_job`'s, ordered by job then index: what a new job warm-starts
        from. An unknown key gives an empty list."""

    # -- the message pool and the audit trail -------------------------------------------------
    @abstractmethod
    def add_message(self, job_id: int, iteration: int, agent: str, kind: str, content: dict[str, Any],
                    text: str = "") -> int:
        """Stores an agent's message and returns its id. A message with the same
        (job, iteration, agent, kind) is replaced and keeps its id. KeyError if the job
        is unknown."""

    @abstractmethod
    def messages(self, job_id: int, iteration: int | None = None) -> list[AgentMessage]:
        """The job's messages (of one iteration if given), ordered by iteration then id.
        KeyError if the job is unknown."""

    @abstractmethod
    def add_event(self, job_id: int, kind: str, payload: dict[str, Any]) -> int:
        """Appends an event to the job's audit trail and returns its id. Ids grow with
        time; with one writer per job (its worker) they also grow in commit order, which
        is what lets `events(after_id=...)` tail without gaps. KeyError if the job is unknown."""

    @abstractmethod
    def events(self, job_id: int, after_id: int = 0) -> list[Event]:
        """The job's events with id > `after_id`, oldest first (tail with the last id
        seen). KeyError if the job is unknown."""

    @abstractmethod
    def close(self) -> None:
        """Releases connections. Calling it twice is harmless."""

    # -- conveniences built on the primitives above ---------------------------------------------
    def best_trial(self, job_id: int) -> Trial | None:
        """The job's successful trial with the highest MFU (the earliest on a tie)."""
        ok = [t for t in self.trials(job_id) if t.status is TrialStatus.OK and t.metrics is not None]
        return max(ok, key=lambda t: (t.mfu or 0.0, -t.index)) if ok else None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _jsonable(value: dict[str, Any], field: str) -> dict[str, Any]:
    """`value` as the database will give it back, or ValueError naming the field.

    Checked here because the backends fail differently (SQLite's driver raises
    StatementError, psycopg a bare TypeError at execute time), and NaN/Infinity, which
    Python's json writes but PostgreSQL's json type rejects, must not reach either."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} must be JSON-serialisable (finite numbers, str keys): {exc}") from exc


# -- rows -> frozen objects --------------------------------------------------------------------

def _trial(row: TrialRow) -> Trial:
    return Trial(
        id=row.id, job_id=row.job_id, index=row.index,
        strategy=Strategy.model_validate(row.strategy), signature=row.signature,
        status=TrialStatus(row.status),
        metrics=Metrics.model_validate(row.metrics) if row.metrics is not None else None,
        failure=Failure.model_validate(row.failure) if row.failure is not None else None,
        rationale=row.rationale, gpu_seconds=row.gpu_seconds, fingerprint=row.fingerprint or {},
        log_path=row.log_path, log_excerpt=row.log_excerpt,
    )


def _job(row: JobRow) -> JobRecord:
    return JobRecord(
        id=row.id, name=row.name, status=JobStatus(row.status), workload_key=row.workload_key,
        spec=JobSpec.model_validate(row.spec), created_at=row.created_at, updated_at=row.updated_at,
        heartbeat_at=row.heartbeat_at, stop_reason=row.stop_reason, best_trial_id=row.best_trial_id,
    )


def _message(row: MessageRow) -> AgentMessage:
    return AgentMessage(id=row.id, job_id=row.job_id, iteration=row.iteration, agent=row.agent, kind=row.kind,
                        content=row.content, text=row.text, created_at=row.created_at)


def _event(row: EventRow) -> Event:
    return Event(id=row.id, job_id=row.job_id, kind=row.kind, payload=row.payload, created_at=row.created_at)


# -- the query vocabulary ------------------------------------------------------------------------

def _job_or_raise(session: Session, job_id: int) -> JobRow:
    row = session.get(JobRow, job_id)
    if row is None:
        raise KeyError(f"no job with id {job_id}")
    return row


def _trial_or_raise(session: Session, trial_id: int) -> TrialRow:
    row = session.get(TrialRow, trial_id)
    if row is None:
        raise KeyError(f"no trial with id {trial_id}")
    return row


class SqlStore(Store):
    """The pool in a SQL database (SQLite or PostgreSQL); see `Store` for the contract.

    `url` defaults to `default_database_url()`. With `upgrade=True` the schema is
    migrated to this optico's head on open; with `upgrade=False` an outdated schema
    raises `schema.SchemaError` naming the command that fixes it."""

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
        # expire_on_commit=False: the rows are turned into frozen objects inside the
        # transaction anyway; expiring them would only cost reloads.
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self._closed = False

    @property
    def engine(self) -> Engine:
        """For tests and the schema tools; application code goes through the methods."""
        return self._engine

    @contextmanager
    def _session(self) -> Iterator[Session]:
        """The one transaction helper: commit at the end, roll back and re-raise on any
        error (database errors as StoreError), always close."""
        if self._closed:
            raise StoreError("the store is closed")
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            raise StoreError(f"pool database error: {exc}") from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _insert(self, table: Table) -> postgresql.Insert | sqlite.Insert:
        """INSERT with the backend's ON CONFLICT clause available (both spell it alike)."""
        if self._engine.dialect.name == "postgresql":
            return postgresql.insert(table)
        return sqlite.insert(table)

    # -- jobs ----------------------------------------------------------------------------
    def create_job(self, spec: JobSpec) -> int:
        key = spec.workload.key()
        with self._session() as s:
            # DO NOTHING rather than check-then-insert: two jobs on a new workload may
            # be created at the same moment.
            s.execute(self._insert(_WORKLOADS)
                      .values(key=key, description=spec.workload.describe(),
                              workload=spec.workload.model_dump(mode="json"))
                      .on_conflict_do_nothing(index_elements=["key"]))
            row = JobRow(name=spec.name, status=JobStatus.QUEUED.value, workload_key=key,
                         spec=spec.model_dump(mode="json"))
            s.add(row)
            s.flush()
            return row.id

    def get_job(self, job_id: int) -> JobRecord:
        with self._session() as s:
            return _job(_job_or_raise(s, job_id))

    def list_jobs(self, limit: int = 50) -> list[JobRecord]:
        with self._session() as s:
            rows = s.scalars(select(JobRow).order_by(JobRow.id.desc()).limit(limit))
            return [_job(r) for r in rows]

    def set_job_status(self, job_id: int, status: JobStatus, *, stop_reason: str | None = None,
                       best_trial_id: int | None = None) -> None:
        status = JobStatus(status)
        with self._session() as s:
            row = _job_or_raise(s, job_id)
            if best_trial_id is not None:
                trial = _trial_or_raise(s, best_trial_id)
                if trial.job_id != job_id:
                    raise ValueError(f"best_trial_id {best_trial_id} is a trial of job {trial.job_id}, "
                                     f"not of job {job_id}")
                row.best_trial_id = best_trial_id
            row.status = status.value
            if stop_reason is not None:
                row.stop_reason = stop_reason

    def heartbeat(self, job_id: int) -> None:
        with self._session() as s:
            # updated_at stays: it means "status last changed", and a beat is not a change.
            result = s.execute(update(JobRow).where(JobRow.id == job_id)
                               .values(heartbeat_at=func.now(), updated_at=JobRow.updated_at))
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise KeyError(f"no job with id {job_id}")

    def stale_jobs(self, max_age_s: float) -> list[JobRecord]:
        with self._session() as s:
            # Compare against the database's clock, never this machine's: workers on
            # other hosts beat with the same clock we judge them by.
            now = as_utc(s.execute(select(func.now())).scalar_one())
            rows = s.scalars(select(JobRow).where(JobRow.status == JobStatus.RUNNING.value))
            stale = [_job(row) for row in rows
                     if (now - as_utc(row.heartbeat_at or row.updated_at)).total_seconds() > max_age_s]
            return sorted(stale, key=lambda j: (j.heartbeat_at or j.updated_at, j.id))

    # -- trials ----------------------------------------------------------------------------
    def start_trial(self, job_id: int, index: int, strategy: Strategy, rationale: str = "") -> Trial:
        with self._session() as s:
            _job_or_raise(s, job_id)
            # ON CONFLICT DO NOTHING then read back is the race-free form of "insert,
            # catch IntegrityError, re-read": a concurrent claim of the same index waits
            # for the first to commit, then reads its row; no transaction is spoilt.
            s.execute(self._insert(_TRIALS)
                      .values(job_id=job_id, index=index, signature=strategy.signature(),
                              strategy=strategy.model_dump(mode="json"), status=TrialStatus.RUNNING.value,
                              rationale=rationale, gpu_seconds=0.0, fingerprint={}, log_excerpt="")
                      .on_conflict_do_nothing(index_elements=["job_id", "index"]))
            row = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.index == index)).one()
            return _trial(row)

    def finish_trial(self, trial_id: int, *, status: TrialStatus, metrics: Metrics | None = None,
                     failure: Failure | None = None, gpu_seconds: float = 0.0,
                     fingerprint: dict[str, Any] | None = None, log_path: str | None = None,
                     log_excerpt: str = "") -> Trial:
        status = TrialStatus(status)
        if status is TrialStatus.RUNNING:
            raise ValueError("finish_trial: status must be ok or failed, got running")
        values: dict[str, Any] = {
            "status": status.value,
            "metrics": _jsonable(metrics.model_dump(mode="json"), "metrics") if metrics is not None else None,
            "failure": _jsonable(failure.model_dump(mode="json"), "failure") if failure is not None else None,
            "gpu_seconds": float(gpu_seconds),
            "fingerprint": _jsonable(dict(fingerprint or {}), "fingerprint"),
            "log_path": log_path,
            "log_excerpt": log_excerpt,
        }
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            changed = row.finished_at is None or any(getattr(row, k) != v for k, v in values.items())
            if changed:
                for key, value in values.items():
                    setattr(row, key, value)
                row.finished_at = func.now()  # the database clock, like every timestamp here
                s.flush()
            return _trial(row)

    def set_trial_failure(self, trial_id: int, failure: Failure) -> Trial:
        with self._session() as s:
            row = _trial_or_raise(s, trial_id)
            if row.status == TrialStatus.OK.value:
                raise ValueError(f"trial {trial_id} succeeded; a failure analysis cannot be attached to it")
            row.failure = _jsonable(failure.model_dump(mode="json"), "failure")
            s.flush()
            return _trial(row)

    def get_trial(self, trial_id: int) -> Trial:
        with self._session() as s:
            return _trial(_trial_or_raise(s, trial_id))

    def trials(self, job_id: int) -> list[Trial]:
        with self._session() as s:
            _job_or_raise(s, job_id)
            rows = s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.index))
            return [_trial(r) for r in rows]

    def workload_trials(self, workload_key: str, exclude_job: int | None = None) -> list[Trial]:
        query = (select(TrialRow).join(JobRow, TrialRow.job_id == JobRow.id)
                 .where(JobRow.workload_key == workload_key, TrialRow.status.in_(FINISHED_TRIAL_STATUSES))
                 .order_by(TrialRow.job_id, TrialRow.index))
        if exclude_job is not None:
            query = query.where(TrialRow.job_id != exclude_job)
        with self._session() as s:
            return [_trial(r) for r in s.scalars(query)]

    # -- the message pool and the audit trail -------------------------------------------------
    def add_message(self, job_id: int, iteration: int, agent: str, kind: str, content: dict[str, Any],
                    text: str = "") -> int:
        insert = self._insert(_MESSAGES)
        stmt = (insert.values(job_id=job_id, iteration=iteration, agent=agent, kind=kind,
                              content=_jsonable(dict(content), "content"), text=text)
                .on_conflict_do_update(index_elements=["job_id", "iteration", "agent", "kind"],
                                       set_={"content": insert.excluded.content, "text": insert.excluded.text,
                                             "created_at": func.now()})
                .returning(_MESSAGES.c.id))
        with self._session() as s:
            _job_or_raise(s, job_id)
            return int(s.execute(stmt).scalar_one())

    def messages(self, job_id: int, iteration: int | None = None) -> list[AgentMessage]:
        query = select(MessageRow).where(MessageRow.job_id == job_id)
        if iteration is not None:
            query = query.where(MessageRow.iteration == iteration)
        with self._session() as s:
            _job_or_raise(s, job_id)
            return [_message(r) for r in s.scalars(query.order_by(MessageRow.iteration, MessageRow.id))]

    def add_event(self, job_id: int, kind: str, payload: dict[str, Any]) -> int:
        with self._session() as s:
            _job_or_raise(s, job_id)
            row = EventRow(job_id=job_id, kind=kind, payload=_jsonable(dict(payload), "payload"))
            s.add(row)
            s.flush()
            return row.id

    def events(self, job_id: int, after_id: int = 0) -> list[Event]:
        with self._session() as s:
            _job_or_raise(s, job_id)
            rows = s.scalars(select(EventRow).where(EventRow.job_id == job_id, EventRow.id > after_id)
                             .order_by(EventRow.id))
            return [_event(r) for r in rows]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self._engine.url.render_as_string(hide_password=True)!r})"


def open_store(url: str | None = None) -> SqlStore:
    """The pool at `url` (default: `default_database_url()`), migrated to head."""
    return SqlStore(url)


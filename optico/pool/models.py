"""The pool's tables (SQLAlchemy 2 declarative). Internal to `optico.pool`.

Callers never see these rows: `store.py` turns them into frozen pydantic objects. (The bound of
their integer columns, for callers that check ids before they reach the driver, is
`optico.sql_limits.SQL_INT_MAX`.)
Every table is prefixed `optico_` because LangGraph's checkpointer keeps its own tables
(`checkpoints`, `writes`, `checkpoint_blobs`, ...) in the same database. The schema is
created and changed only by the Alembic migrations in `migrations/`; a change here
needs a new revision there (tests compare the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names: SQLite migrations rebuild tables ("batch" mode) and
# must be able to name what they drop; PostgreSQL would otherwise invent names.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSON that stores Python None as SQL NULL (not the JSON literal 'null'), so
# `IS NULL` means "absent" on both backends.
NullableJSON = JSON(none_as_null=True)


def _utcnow() -> Any:
    """The database clock: one clock for every worker, whatever their own clocks say."""
    return func.now()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class WorkloadRow(Base):
    """A workload seen by some job; jobs with the same key share what they learned."""

    __tablename__ = "optico_workloads"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    description: Mapped[str] = mapped_column(Text, default="")
    workload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())


class JobRow(Base):
    __tablename__ = "optico_jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    # Plain strings, not a database ENUM or CHECK: the enums live in Python (JobStatus,
    # TrialStatus) and a new value should not need a migration on every backend.
    status: Mapped[str] = mapped_column(String(16), index=True)
    workload_key: Mapped[str] = mapped_column(
        String(64), ForeignKey("optico_workloads.key", ondelete="RESTRICT"), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=_utcnow(), onupdate=_utcnow())
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stop_reason: Mapped[str | None] = mapped_column(Text)
    # 'queue' (submitted for the workers) or 'cli' (run by `optico tune`, resumed only on request).
    origin: Mapped[str] = mapped_column(String(16), default="queue", server_default="queue")
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The lease: who runs the job and until when (database clock). Renewed by the worker's
    # heartbeat for the whole run; an expired lease lets another worker take the job over.
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    takeovers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # The live budget, changeable while the job runs (PATCH); starts as the spec's.
    max_trials: Mapped[int] = mapped_column(Integer)
    gpu_hours: Mapped[float | None] = mapped_column(Float)
    # The same Idempotency-Key returns the same job; spec_hash tells a reused key with another body.
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    spec_hash: Mapped[str] = mapped_column(String(64), default="", server_default="")
    # No foreign key to optico_trials: jobs and trials would reference each other, and a
    # cycle needs ALTER TABLE ADD CONSTRAINT, which SQLite lacks. The store checks that
    # the trial belongs to the job instead.
    best_trial_id: Mapped[int | None] = mapped_column(Integer)
    # The best trial's MFU, copied here so that a list of 10,000 jobs sorts by it in SQL.
    best_mfu: Mapped[float | None] = mapped_column(Float, index=True)


class TrialRow(Base):
    __tablename__ = "optico_trials"
    __table_args__ = (
        # A job's trial `index` is claimed once; start_trial relies on it to be idempotent.
        UniqueConstraint("job_id", "index"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("optico_jobs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column("index", Integer)
    # Duplicate checks across jobs look trials up by signature.
    signature: Mapped[str] = mapped_column(String(64), index=True)
    strategy: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    metrics: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    failure: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    rationale: Mapped[str] = mapped_column(Text, default="")
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    log_path: Mapped[str | None] = mapped_column(Text)
    log_excerpt: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    interruptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    wall_seconds: Mapped[float | None] = mapped_column(Float)
    # The launch now running: when it began (database clock) and on how many GPUs. One that ends without
    # a result (its worker died or stopped, the job was cancelled) adds its GPU time, up to its worker's
    # last heartbeat, to lost_gpu_seconds: the GPU-hour budget and the report count what was spent.
    attempt_started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempt_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lost_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class MessageRow(Base):
    """One agent output in the global message pool."""

    __tablename__ = "optico_messages"
    __table_args__ = (
        # One message per (job, iteration, agent, kind): a node re-run after a crash
        # replaces its message (upsert) instead of adding a second one.
        UniqueConstraint("job_id", "iteration", "agent", "kind"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("optico_jobs.id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(Integer)
    agent: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(64))
    content: Mapped[dict[str, Any]] = mapped_column(JSON)
    text: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    # LLM accounting copied out of `content` of llm_call/llm_reask messages, so /metrics can sum it in SQL.
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)


class EventRow(Base):
    """A job's append-only event log; readers tail it with `after=seq`.

    `seq` is 1, 2, 3... per job, allocated under the job's row lock, so it grows in commit
    order even with several writers (the worker and an API request): a reader that saw seq N
    never misses a later-committed N-1."""

    __tablename__ = "optico_events"
    __table_args__ = (UniqueConstraint("job_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("optico_jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())


class TokenRow(Base):
    """An API token: only its SHA-256 is kept (tokens are long random strings, so a fast hash is enough)."""

    __tablename__ = "optico_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    scope: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ScheduleRow(Base):
    """A retuning schedule: a job spec re-checked on a cron, and the incumbent it defends."""

    __tablename__ = "optico_schedules"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    # No foreign key: a schedule's workload is stored with its first job, not before.
    workload_key: Mapped[str] = mapped_column(String(64), index=True)
    cron: Mapped[str] = mapped_column(String(128))
    max_trials: Mapped[int] = mapped_column(Integer)
    always_retune: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    webhook_url: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    # The next cron slot (database clock). Firing moves it forward with a conditional UPDATE, so of
    # several replicas polling at once exactly one fires each slot.
    next_fire_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    # `POST .../run` made it due now: the tick that fires is recorded as manual, not as a cron slot.
    run_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    last_tick_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The tick lock: the replica working on a tick (probe, re-measurement) holds it; a replica that
    # died lets the next one in once it has expired.
    locked_by: Mapped[str | None] = mapped_column(String(255))
    locked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The incumbent: the best configuration, its MFU, and the framework it was measured under.
    incumbent_strategy: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    incumbent_mfu: Mapped[float | None] = mapped_column(Float)
    incumbent_fingerprint: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    incumbent_job_id: Mapped[int | None] = mapped_column(Integer)
    incumbent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class TickRow(Base):
    """One firing of a schedule and what it found (the schedule's history)."""

    __tablename__ = "optico_schedule_ticks"
    __table_args__ = (
        # A cron slot fires once, whichever replica fires it (NULL for `run-now`: never equal).
        UniqueConstraint("schedule_id", "due_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int] = mapped_column(Integer, ForeignKey("optico_schedules.id", ondelete="CASCADE"),
                                             index=True)
    trigger: Mapped[str] = mapped_column(String(16))
    due_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # running -> done | retuning (a retune job runs) -> done; failed; skipped (a retune still ran).
    status: Mapped[str] = mapped_column(String(16), index=True)
    outcome: Mapped[str | None] = mapped_column(String(16))
    worker: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(NullableJSON)
    fingerprint_changed: Mapped[bool | None] = mapped_column(Boolean)
    mfu_before: Mapped[float | None] = mapped_column(Float)
    mfu_after: Mapped[float | None] = mapped_column(Float)
    noise_pct: Mapped[float | None] = mapped_column(Float)
    regression_pct: Mapped[float | None] = mapped_column(Float)
    retune_job_id: Mapped[int | None] = mapped_column(Integer, index=True)
    # Random, for the retune job's Idempotency-Key (tick ids come back after a removal on SQLite);
    # NULL on ticks from before revision 0005.
    job_key: Mapped[str | None] = mapped_column(String(64))
    new_best_mfu: Mapped[float | None] = mapped_column(Float)
    # Everything else a person reads: the re-measurements, the framework change, the new best and
    # its Megatron-LM flag diff, an error.
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ScheduleEventRow(Base):
    """A schedule's append-only event log (tick outcomes, retune results), apart from the jobs'
    logs: a tick belongs to no job. `seq` grows by one per schedule, under its row lock."""

    __tablename__ = "optico_schedule_events"
    __table_args__ = (UniqueConstraint("schedule_id", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    schedule_id: Mapped[int] = mapped_column(Integer, ForeignKey("optico_schedules.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=_utcnow())


OUR_TABLES: frozenset[str] = frozenset(Base.metadata.tables)

"""What the store hands out besides trials: frozen records of jobs, messages, events.

(Trials are `optico.trial.Trial`, shared with the agents.) Frozen so that nothing a
caller holds can drift from the database without a store call.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from optico.events import JobEvent, ScheduleEvent
from optico.pool.lifecycle import JobStatus
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import Trial

__all__ = ["AgentMessage", "Incumbent", "JobRecord", "JobStats", "JobStatus", "ScheduleRecord", "StoredEvent",
           "StoredScheduleEvent", "TickRecord", "TickVerdict", "TokenRecord", "as_utc"]


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive UTC timestamps, PostgreSQL aware ones: make both aware."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)

    @field_validator("created_at", "updated_at", "heartbeat_at", "lease_expires_at", "started_at", "finished_at",
                     "last_used_at", "revoked_at", mode="after", check_fields=False)
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return as_utc(value) if value is not None else None


class JobRecord(_Record):
    """A job as stored. Timestamps are UTC from the database clock."""

    id: int
    name: str
    status: JobStatus
    workload_key: str
    spec: JobSpec
    origin: str = Field("queue", description="'queue': submitted for the workers; 'cli': run by `optico tune` "
                                             "(workers do not pick it up unless it is queued again: "
                                             "`optico jobs resume`, the API).")
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = Field(None, description="Last lease renewal by its worker.")
    lease_owner: str | None = Field(None, description="The worker holding the job, if any.")
    lease_expires_at: datetime | None = None
    stop_reason: str | None = None
    best_trial_id: int | None = None
    best_mfu: float | None = Field(None, description="The best trial's MFU (sortable in SQL).")
    max_trials: int = Field(description="The live trial budget (the spec's, unless changed while it runs).")
    gpu_hours: float | None = Field(None, description="The live GPU-hour budget.")
    takeovers: int = Field(0, description="How often another worker took the job over from a dead one.")

    def lease_live(self, now: datetime) -> bool:
        """A worker holds the job and its lease has not expired at `now` (the database clock)."""
        return self.lease_owner is not None and self.lease_expires_at is not None and self.lease_expires_at > now


class JobStats(_Record):
    """A job's trial counts and best trial, computed in SQL for a whole page of jobs at once."""

    job_id: int
    trials: int = 0
    ok: int = 0
    failed: int = 0
    lost: int = 0
    running: int = 0
    gpu_seconds: float = 0.0
    best: Trial | None = None
    first: Trial | None = Field(None, description="Trial 1: the spec's baseline, or the seed configuration.")


class AgentMessage(_Record):
    """One entry of the global message pool: what an agent said in one iteration."""

    id: int
    job_id: int
    iteration: int
    agent: str = Field(description="Which agent wrote it, e.g. 'analysis', 'generation'.")
    kind: str = Field(description="What it is, e.g. 'diagnosis', 'proposal'; unique per agent and iteration.")
    content: dict[str, Any]
    text: str = ""
    created_at: datetime


class StoredEvent(_Record):
    """One entry of a job's event log: `seq` grows by one per job, in commit order."""

    job_id: int
    seq: int
    created_at: datetime
    event: JobEvent

    @property
    def kind(self) -> str:
        return self.event.kind


class TokenRecord(_Record):
    """An API token as stored: never the token itself, only its hash (kept out of this object)."""

    id: int
    name: str
    scope: str = Field(description="'read' or 'write' (write includes read).")
    prefix: str = Field(description="The token's first characters, to tell tokens apart in listings.")
    created_at: datetime
    last_used_at: datetime | None = None
    revoked_at: datetime | None = None

    @property
    def can_write(self) -> bool:
        return self.scope == "write"


# -- retuning schedules ---------------------------------------------------------------------------

class _Dated(_Record):
    @field_validator("next_fire_at", "last_tick_at", "locked_until", "measured_at", "due_at", mode="after",
                     check_fields=False)
    @classmethod
    def _utc_too(cls, value: datetime | None) -> datetime | None:
        return as_utc(value) if value is not None else None


class Incumbent(_Dated):
    """The configuration a schedule defends: the best measured, under the framework it was measured on."""

    strategy: Strategy
    mfu: float
    fingerprint: dict[str, str] = Field(description="The framework it was measured under (optico.fingerprint).")
    job_id: int | None = Field(None, description="The job whose trial measured it (None: a tick's re-measurement).")
    measured_at: datetime


class ScheduleRecord(_Dated):
    """A retuning schedule as stored. `webhook_url` is a secret (it often carries a token): views show
    `webhook_host` only."""

    id: int
    name: str
    spec: JobSpec
    workload_key: str
    cron: str
    max_trials: int
    always_retune: bool = False
    webhook_url: str | None = None
    created_at: datetime
    next_fire_at: datetime
    last_tick_at: datetime | None = None
    locked_by: str | None = None
    locked_until: datetime | None = None
    incumbent: Incumbent | None = None


# Idempotency-Keys starting with this are OptiCo's own; the API refuses them from users.
RESERVED_KEY_PREFIX = "optico-"


class TickVerdict(_Record):
    """What a tick found: the fields of `TickRecord` a tick decides (see `optico.retune.decide`)."""

    outcome: str | None = None
    fingerprint: dict[str, str] | None = None
    fingerprint_changed: bool | None = None
    mfu_before: float | None = None
    mfu_after: float | None = None
    noise_pct: float | None = None
    regression_pct: float | None = None
    retune_job_id: int | None = None
    new_best_mfu: float | None = None
    report: dict[str, Any] = Field(default_factory=dict)


class TickRecord(TickVerdict, _Dated):
    """One firing of a schedule: its verdict (the fields of `TickVerdict`) and its bookkeeping. `status`:
    running, done, retuning (its retune job has not ended), failed, skipped. `outcome` as in `optico
    schedule run-now --json` (None until decided)."""

    id: int
    schedule_id: int
    trigger: str
    due_at: datetime | None = None
    status: str
    worker: str
    started_at: datetime
    finished_at: datetime | None = None
    job_key: str | None = Field(None, description="Random: the retune job's Idempotency-Key (None before 0005).")

    @property
    def retune_job_key(self) -> str:
        """The Idempotency-Key of this tick's retune job, unique for all time: SQLite hands a removed
        schedule's tick ids out again, and a key of the tick id alone adopted the old schedule's job as the
        new one's retune. The pool reads it too: a tick whose replica died after creating the job adopts it."""
        # Ticks from before migration 0005 have no job_key: theirs stays as it was (no second job).
        return f"{RESERVED_KEY_PREFIX}retune-{self.job_key or f'tick-{self.id}'}"


class StoredScheduleEvent(_Record):
    """One entry of a schedule's event log: `seq` grows by one per schedule."""

    schedule_id: int
    seq: int
    created_at: datetime
    event: ScheduleEvent

    @property
    def kind(self) -> str:
        return self.event.kind

"""What the store hands out besides trials: frozen records of jobs, messages, events.

(Trials are `optico.trial.Trial`, shared with the agents.) Frozen so that nothing a
caller holds can drift from the database without a store call.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from optico.spec import JobSpec


def as_utc(value: datetime) -> datetime:
    """SQLite hands back naive UTC timestamps, PostgreSQL aware ones: make both aware."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # its worker died; resumable from the checkpoint

    @property
    def finished(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)

    @field_validator("created_at", "updated_at", "heartbeat_at", mode="after", check_fields=False)
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
    created_at: datetime
    updated_at: datetime
    heartbeat_at: datetime | None = None
    stop_reason: str | None = None
    best_trial_id: int | None = None


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


class Event(_Record):
    """One entry of a job's audit trail (tool calls, model responses, state changes)."""

    id: int
    job_id: int
    kind: str
    payload: dict[str, Any]
    created_at: datetime

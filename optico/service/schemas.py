"""What the REST API returns: public views of the pool's records (no secrets, no ORM rows)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from optico.pool.records import AgentMessage, JobRecord, JobStats, TokenRecord
from optico.spec import MAX_GPU_HOURS, MAX_TRIALS
from optico.trial import Trial


class _Public(BaseModel):
    model_config = ConfigDict(frozen=True)


class LeaseView(_Public):
    worker: str
    expires_at: datetime


class BestView(_Public):
    trial: int
    mfu: float
    tflops_per_gpu: float
    strategy: str
    megatron_args: list[str]


class JobView(_Public):
    """A job: its state, progress, best so far and who runs it."""

    id: int
    name: str
    status: str
    origin: str
    workload: str
    workload_key: str
    launcher: str
    trials: int = Field(description="Trials recorded (running, finished and lost).")
    max_trials: int
    gpu_hours_budget: float | None
    gpu_hours_spent: float
    best: BestView | None
    stop_reason: str | None
    lease: LeaseView | None = Field(description="The worker holding the job, if any.")
    takeovers: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobPage(_Public):
    items: list[JobView]
    next_cursor: int | None = Field(description="Pass as `cursor` for the next page; null on the last one.")


class TrialView(_Public):
    index: int
    status: str
    strategy: dict[str, Any]
    short: str
    megatron_args: list[str]
    signature: str
    rationale: str
    metrics: dict[str, Any] | None
    failure: dict[str, Any] | None
    gpu_seconds: float
    lost_gpu_seconds: float
    wall_seconds: float | None
    attempts: int
    interruptions: int
    fingerprint: dict[str, Any]
    log_excerpt: str


class MessageView(_Public):
    id: int
    iteration: int
    agent: str
    kind: str
    text: str
    content: dict[str, Any]
    created_at: datetime


class BudgetPatch(BaseModel):
    """A new budget for a job that has not finished; omitted fields keep their value. Strict, as the
    spec is: `true` or "5" is not a number of trials."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_trials: int | None = Field(None, ge=1, le=MAX_TRIALS)
    gpu_hours: float | None = Field(None, gt=0, le=MAX_GPU_HOURS)

    @model_validator(mode="after")
    def _changes_something(self) -> "BudgetPatch":
        if self.max_trials is None and self.gpu_hours is None:
            raise ValueError("give max_trials or gpu_hours (or both)")  # else an event that changes nothing
        return self


class TokenView(_Public):
    name: str
    scope: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class Problem(_Public):
    detail: str


def job_view(job: JobRecord, stats: JobStats | None) -> JobView:
    stats = stats or JobStats(job_id=job.id)
    best = stats.best if stats.best is not None and stats.best.metrics is not None else None
    return JobView(
        id=job.id, name=job.name, status=job.status.value, origin=job.origin,
        workload=job.spec.workload.describe(), workload_key=job.workload_key, launcher=job.spec.launcher.kind,
        trials=stats.trials, max_trials=job.max_trials, gpu_hours_budget=job.gpu_hours,
        gpu_hours_spent=stats.gpu_seconds / 3600,
        best=None if best is None else BestView(trial=best.index, mfu=best.metrics.mfu,
                                                tflops_per_gpu=best.metrics.tflops_per_gpu,
                                                strategy=best.strategy.short(),
                                                megatron_args=best.strategy.run_args(job.spec.workload)),
        stop_reason=job.stop_reason,
        lease=LeaseView(worker=job.lease_owner, expires_at=job.lease_expires_at)
        if job.lease_owner and job.lease_expires_at else None,
        takeovers=job.takeovers, created_at=job.created_at, started_at=job.started_at, finished_at=job.finished_at)


def trial_view(t: Trial) -> TrialView:
    return TrialView(index=t.index, status=t.status.value, strategy=t.strategy.model_dump(mode="json"),
                     short=t.strategy.short(), megatron_args=t.strategy.megatron_args(), signature=t.signature,
                     rationale=t.rationale, metrics=t.metrics.model_dump(mode="json") if t.metrics else None,
                     failure=t.failure.model_dump(mode="json", exclude={"log_excerpt"}) if t.failure else None,
                     gpu_seconds=t.gpu_seconds, lost_gpu_seconds=t.lost_gpu_seconds, wall_seconds=t.wall_seconds,
                     attempts=t.attempts, interruptions=t.interruptions, fingerprint=t.fingerprint,
                     log_excerpt=t.log_excerpt)


def message_view(m: AgentMessage, *, reasoning: bool) -> MessageView:
    content = dict(m.content)
    if not reasoning:
        content.pop("reasoning", None)
    return MessageView(id=m.id, iteration=m.iteration, agent=m.agent, kind=m.kind, text=m.text, content=content,
                       created_at=m.created_at)


def token_view(t: TokenRecord) -> TokenView:
    return TokenView(name=t.name, scope=t.scope, prefix=t.prefix, created_at=t.created_at,
                     last_used_at=t.last_used_at, revoked_at=t.revoked_at)

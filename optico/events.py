"""Typed job events: one pydantic model per kind, the one declaration every writer and reader uses.

The loop and the worker write them to the pool (`Store.add_event`), where each gets an id that
grows per job; the REST stream (SSE), the dashboard and the CLI's live view read them back with
`after=id`, so a dropped stream resumes without loss or repeats. Reading back validates the
stored JSON against these models: nothing but plain data ever comes out of the database.

`log` events (a training process's progress lines) are published to live listeners only and
never stored: a run prints thousands of lines, and the log file is where they are kept.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class JobStateChanged(_Event):
    """The job moved from one lifecycle state to another."""

    kind: Literal["state"] = "state"
    status: str
    previous: str | None = None
    reason: str | None = None
    worker: str | None = None


class LeaseChanged(_Event):
    """A worker acquired, took over (an expired lease) or released the job; or its lease expired
    on a cancelled job (its worker was gone, and a claiming worker settled the job for it)."""

    kind: Literal["lease"] = "lease"
    action: Literal["acquired", "taken_over", "released", "expired"]
    worker: str
    previous_worker: str | None = None
    expires_at: datetime | None = None


class TrialStarted(_Event):
    kind: Literal["trial_started"] = "trial_started"
    index: int
    strategy: str
    rationale: str = ""


class TrialFinished(_Event):
    """A trial's outcome: metrics on success, the diagnosis on failure."""

    kind: Literal["trial_done"] = "trial_done"
    index: int
    strategy: str
    status: str
    mfu: float | None = None
    mem_max_gib: float | None = None
    mem_limit_gib: float | None = None
    summary: str | None = None
    rationale: str = ""
    best_mfu: float | None = None


class TrialLost(_Event):
    """A trial whose worker died and which will not be re-run (its result is unknown)."""

    kind: Literal["trial_lost"] = "trial_lost"
    index: int
    reason: str


class AgentOutput(_Event):
    """What an agent said in an iteration (the full message is in the pool's messages)."""

    kind: Literal["agent"] = "agent"
    iteration: int
    agent: str
    message: str
    text: str = ""
    reasoner: str | None = None


class ReasonerFallback(_Event):
    """An LLM reasoner's answer could not be used; the offline rules decided instead."""

    kind: Literal["fallback"] = "fallback"
    iteration: int
    agent: str
    reason: str


class BudgetChanged(_Event):
    kind: Literal["budget"] = "budget"
    max_trials: int | None = None
    gpu_hours: float | None = None


class JobFinished(_Event):
    kind: Literal["job_done"] = "job_done"
    status: str
    stop_reason: str
    trials: int
    best_mfu: float | None = None


class TrialLog(_Event):
    """A progress line of a running trial (live only, never stored)."""

    kind: Literal["log"] = "log"
    index: int
    line: str


class UnreadableEvent(_Event):
    """Read in place of a stored event whose row is not one (written by hand, or by a buggy version):
    the log keeps its sequence, and a stream or a page that meets it goes on (never stored)."""

    kind: Literal["unreadable"] = "unreadable"
    stored_kind: str
    reason: str


JobEvent = Annotated[
    Union[JobStateChanged, LeaseChanged, TrialStarted, TrialFinished, TrialLost, AgentOutput, ReasonerFallback,
          BudgetChanged, JobFinished, TrialLog, UnreadableEvent],
    Field(discriminator="kind"),
]
EVENT_ADAPTER: TypeAdapter[JobEvent] = TypeAdapter(JobEvent)
STORED_KINDS: frozenset[str] = frozenset(
    {"state", "lease", "trial_started", "trial_done", "trial_lost", "agent", "fallback", "budget", "job_done"})


def parse_event(data: dict) -> JobEvent:
    """A stored or received event as its typed model; ValidationError for anything else."""
    return EVENT_ADAPTER.validate_python(data)


# -- schedule events ---------------------------------------------------------------------------
# A schedule's own log (`Store.add_schedule_event`, the optico_schedule_events table), apart from the
# jobs' logs: a tick belongs to no job, and a job's stream must not carry another object's history.
# A retune job's own trials and state are in that job's log as usual.


class ScheduleTicked(_Event):
    """A tick's verdict: what the probe found and, when the framework changed, how the incumbent moved."""

    kind: Literal["tick"] = "tick"
    tick_id: int
    trigger: Literal["cron", "manual"]
    outcome: Literal["first-tune", "no-change", "within-noise", "regression", "improvement"]
    fingerprint_changed: bool
    framework_changes: dict[str, list[str | None]] = Field(default_factory=dict)
    mfu_before: float | None = None
    mfu_after: float | None = None
    regression_pct: float | None = None
    noise_pct: float | None = None
    retune_job_id: int | None = None


class RetuneFinished(_Event):
    """A tick's retune job ended: the new best, the incumbent's change, what changed as Megatron-LM flags."""

    kind: Literal["retune_done"] = "retune_done"
    tick_id: int
    job_id: int
    job_status: str
    new_best_mfu: float | None = None
    new_best: str | None = None
    incumbent_change_pct: float | None = None
    flag_changes: list[str] = Field(default_factory=list)


class TickFailed(_Event):
    """A tick could not finish (the probe or a re-measurement broke) or was skipped; `retuning`: it broke
    after it had started its retune job, which runs on, and the tick is closed when the job ends."""

    kind: Literal["tick_failed"] = "tick_failed"
    tick_id: int
    status: Literal["failed", "skipped", "retuning"]
    reason: str


ScheduleEvent = Annotated[Union[ScheduleTicked, RetuneFinished, TickFailed], Field(discriminator="kind")]
SCHEDULE_EVENT_ADAPTER: TypeAdapter[ScheduleEvent] = TypeAdapter(ScheduleEvent)


def parse_schedule_event(data: dict) -> ScheduleEvent:
    """A stored schedule event as its typed model; ValidationError for anything else."""
    return SCHEDULE_EVENT_ADAPTER.validate_python(data)

"""/api/v1/schedules: nightly retuning schedules (docs/retuning.md), with the jobs API's conventions:
read token to read, write token to change, 422 naming each bad field, 409 for a taken name or a busy
schedule, 404 for an unknown one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

import yaml
from fastapi import APIRouter, HTTPException, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field, field_validator

from optico.pool.records import Incumbent, ScheduleRecord, StoredScheduleEvent, TickRecord
from optico.redact import credential_shaped
from optico.retune.cron import DEFAULT_CRON, check_cron, next_fire
from optico.retune.webhook import check_webhook_url, where
from optico.service.bodies import spec_from_body
from optico.service.deps import DIGITS, SQL_INT_MAX, ReadToken, SettingsDep, StoreDep, WriteToken
from optico.service.schemas import Problem
from optico.service.strict_json import StrictJsonRoute
from optico.spec import SpecError

router = APIRouter(prefix="/api/v1/schedules", tags=["schedules"], route_class=StrictJsonRoute)
ERRORS = {401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem}, 409: {"model": Problem}}
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


# -- bodies and views ------------------------------------------------------------------------------

class ScheduleCreate(BaseModel):
    """A new schedule. `spec` is a job spec as `optico tune` reads it: a JSON object, or YAML text.
    Strict, as the spec and a PATCH are: "5" is not a number of trials, "yes" not a boolean."""

    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=NAME_PATTERN, description="Unique; letters, digits, '.', '_', '-' (1-128).")
    spec: dict[str, Any] | str = Field(description="The job spec the schedule re-tunes.")
    cron: str = Field(DEFAULT_CRON, description="When it ticks (five fields, UTC); default nightly at 02:00.")
    max_trials: int | None = Field(None, ge=1, le=10_000, description="A retune's trial budget; None = the "
                                                                      "spec's budget.max_trials.")
    always_retune: bool = Field(False, description="Retune after every framework change, even when the "
                                                   "incumbent moved within the noise band.")
    webhook_url: str | None = Field(None, description="POSTed a JSON object on a regression (http or https).")

    @field_validator("name")
    @classmethod
    def _not_a_credential(cls, value: str) -> str:
        if credential_shaped(value):
            raise ValueError("looks like a credential; a schedule's name is shown in every listing")
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        try:
            return check_cron(value)
        except ValueError as exc:  # the location names the field already
            raise ValueError(str(exc).removeprefix("cron: ")) from None

    @field_validator("webhook_url")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        try:
            return None if value in (None, "") else check_webhook_url(value)
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("webhook_url: ")) from None


class _View(BaseModel):
    model_config = ConfigDict(frozen=True)


class IncumbentView(_View):
    strategy: str
    megatron_args: list[str]
    mfu: float
    fingerprint: dict[str, str] = Field(description="The framework it was measured under.")
    job_id: int | None
    measured_at: datetime


class TickingView(_View):
    worker: str
    until: datetime


class ScheduleView(_View):
    name: str
    workload: str
    workload_key: str
    launcher: str
    cron: str
    max_trials: int
    always_retune: bool
    webhook: str | None = Field(description="The webhook's scheme and host only: its URL is a secret.")
    next_fire_at: datetime
    last_tick_at: datetime | None
    ticking: TickingView | None = Field(description="The replica ticking it now, if any.")
    incumbent: IncumbentView | None
    created_at: datetime


class TickView(_View):
    id: int
    trigger: str
    due_at: datetime | None
    status: str = Field(description="running, done, retuning (its retune job runs), failed or skipped.")
    outcome: str | None = Field(description="first-tune, no-change, within-noise, regression or improvement.")
    started_at: datetime
    finished_at: datetime | None
    fingerprint: dict[str, str] | None
    fingerprint_changed: bool | None
    mfu_before: float | None
    mfu_after: float | None
    noise_pct: float | None
    regression_pct: float | None = Field(description="(before - after) / before, in %: positive = slower.")
    retune_job_id: int | None
    new_best_mfu: float | None
    report: dict[str, Any]


class ScheduleDetail(ScheduleView):
    history: list[TickView] = Field(description="Its ticks, newest first.")


class ScheduleEventView(_View):
    seq: int
    kind: str
    created_at: datetime
    data: dict[str, Any]


def _incumbent(i: Incumbent | None) -> IncumbentView | None:
    if i is None:
        return None
    return IncumbentView(strategy=i.strategy.short(), megatron_args=i.strategy.megatron_args(), mfu=i.mfu,
                         fingerprint=i.fingerprint, job_id=i.job_id, measured_at=i.measured_at)


def schedule_view(s: ScheduleRecord, now: datetime | None = None) -> dict[str, Any]:
    ticking = None
    if s.locked_by and s.locked_until and (now is None or s.locked_until > now):
        ticking = TickingView(worker=s.locked_by, until=s.locked_until)
    return dict(name=s.name, workload=s.spec.workload.describe(), workload_key=s.workload_key,
                launcher=s.spec.launcher.kind, cron=s.cron, max_trials=s.max_trials, always_retune=s.always_retune,
                webhook=where(s.webhook_url) if s.webhook_url else None, next_fire_at=s.next_fire_at,
                last_tick_at=s.last_tick_at, ticking=ticking, incumbent=_incumbent(s.incumbent),
                created_at=s.created_at)


def tick_view(t: TickRecord) -> TickView:
    return TickView(**t.model_dump(exclude={"schedule_id", "worker"}))


def event_view(e: StoredScheduleEvent) -> ScheduleEventView:
    return ScheduleEventView(seq=e.seq, kind=e.kind, created_at=e.created_at,
                             data=e.event.model_dump(mode="json", exclude={"kind"}))


# -- handlers --------------------------------------------------------------------------------------

def _spec_error(exc: SpecError) -> HTTPException:
    parts = [p for p in exc.field.split(".") if p and p != "body"]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                         detail=[{"loc": ["body", "spec", *parts], "msg": exc.reason, "type": "spec_error"}])


@contextmanager
def _known(name: str) -> Iterator[None]:
    """A store's KeyError for the schedule `name` becomes a 404."""
    try:
        yield
    except KeyError:
        raise _no_schedule(name) from None


def _no_schedule(name: str) -> HTTPException:
    shown = repr(name) if len(name) <= 100 else f"{name[:100]!r}… ({len(name)} characters)"  # not echoed whole
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no schedule named {shown}")


def _schedule(store, name: str) -> ScheduleRecord:
    with _known(name):
        return store.get_schedule(name)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=ScheduleView,
             responses={422: {"description": "Each invalid field with its path and reason."}, **ERRORS})
def create_schedule(body: ScheduleCreate, response: Response, store: StoreDep, settings: SettingsDep,
                    _: WriteToken) -> ScheduleView:
    """Adds a schedule; its first tick (at the next cron slot, or `POST .../run`) tunes and sets the incumbent."""
    raw, kind = (body.spec.encode(), "application/yaml") if isinstance(body.spec, str) \
        else (json.dumps(body.spec).encode(), "application/json")
    try:
        spec = spec_from_body(raw, kind, settings)  # the jobs API's checks: allowed files, no commands
    except (SpecError, yaml.YAMLError) as exc:
        raise _spec_error(exc if isinstance(exc, SpecError) else SpecError("", str(exc))) from None
    try:
        record = store.create_schedule(body.name, spec, cron=body.cron, next_fire_at=next_fire(body.cron, store.db_now()),
                                       max_trials=body.max_trials or spec.budget.max_trials,
                                       always_retune=body.always_retune, webhook_url=body.webhook_url)
    except ValueError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    response.headers["Location"] = f"/api/v1/schedules/{record.name}"
    return ScheduleView(**schedule_view(record))


@router.get("", response_model=list[ScheduleView], responses=ERRORS)
def list_schedules(store: StoreDep, _: ReadToken) -> list[ScheduleView]:
    """Every schedule, by name, with its incumbent and next slot."""
    now = store.db_now()
    return [ScheduleView(**schedule_view(s, now)) for s in store.list_schedules()]


@router.get("/{name}", response_model=ScheduleDetail, responses=ERRORS)
def get_schedule(name: str, store: StoreDep, _: ReadToken,
                 history: Annotated[int, DIGITS, Query(ge=0, le=1000, description="Ticks to include.")] = 50) -> ScheduleDetail:
    """One schedule and its history: each tick's verdict, the incumbent's change, the retune's new best."""
    with _known(name):
        record, ticks = store.schedule_with_history(name, history)
    return ScheduleDetail(**schedule_view(record, store.db_now()), history=[tick_view(t) for t in ticks])


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS)
def delete_schedule(name: str, store: StoreDep, _: WriteToken) -> Response:
    """Removes the schedule and its history; its jobs (retunes included) stay in the pool."""
    with _known(name):
        store.delete_schedule(name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{name}/run", status_code=status.HTTP_202_ACCEPTED, response_model=ScheduleView, responses=ERRORS)
def run_schedule(name: str, store: StoreDep, _: WriteToken) -> ScheduleView:
    """Makes the schedule due now: the next poll of any replica's scheduler ticks it (once, whichever)."""
    _schedule(store, name)
    try:
        record = store.fire_now(name)
    except KeyError:
        raise _no_schedule(name) from None
    return ScheduleView(**schedule_view(record, store.db_now()))


@router.get("/{name}/events", response_model=list[ScheduleEventView], responses=ERRORS)
def list_events(name: str, store: StoreDep, _: ReadToken,
                after: Annotated[int, DIGITS, Query(ge=0, le=SQL_INT_MAX, description="Only events with a larger seq.")] = 0,
                limit: Annotated[int, DIGITS, Query(ge=1, le=10_000)] = 500) -> list[ScheduleEventView]:
    """The schedule's event log (tick verdicts, retune results, failures) after `after`."""
    record = _schedule(store, name)
    return [event_view(e) for e in store.schedule_events(record.id, after=after, limit=limit)]

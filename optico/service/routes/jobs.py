"""/api/v1/jobs: submit, list, read, control and report tuning jobs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.responses import PlainTextResponse
from pydantic import AfterValidator

from optico.pool.contract import IdempotencyConflict
from optico.pool.lifecycle import JobStatus, LifecycleError
from optico.report import job_report, report_markdown
from optico.pool.records import RESERVED_KEY_PREFIX
from optico.service.bodies import spec_from_body
from optico.service.deps import DIGITS, SQL_INT_MAX, JobDep, ReadToken, SettingsDep, StoreDep, WriteToken
from optico.service.schemas import (
    BudgetPatch,
    JobPage,
    JobView,
    MessageView,
    Problem,
    TrialView,
    job_view,
    message_view,
    trial_view,
)
from optico.service.strict_json import StrictJsonRoute
from optico.spec import SpecError

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"], route_class=StrictJsonRoute)

SPEC_BODY = {
    "requestBody": {
        "required": True,
        "description": "A job spec, as `optico tune` reads it from a YAML file (docs/spec.md).",
        "content": {
            "application/json": {"schema": {"type": "object"}, "example": {
                "name": "llama3-8b", "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512,
                                                   "precision": "bf16",
                                                   "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
                "search_space": {"tunables": ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                                              "micro_batch_size", "recompute_granularity"]},
                "budget": {"max_trials": 10}, "launcher": {"kind": "sim", "trial_seconds": 2}}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}
ERRORS = {401: {"model": Problem}, 403: {"model": Problem}, 404: {"model": Problem}, 409: {"model": Problem}}


def _conflict(exc: Exception) -> HTTPException:
    return HTTPException(status.HTTP_409_CONFLICT, detail=str(exc))


def _spec_error(exc: SpecError) -> HTTPException:
    parts = [p for p in exc.field.split(".") if p and p != "body"]
    loc = ["body", *parts]
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                         detail=[{"loc": loc, "msg": exc.reason, "type": "spec_error"}])


def _users_key(key: str | None) -> str | None:
    if key is not None and key.lower().startswith(RESERVED_KEY_PREFIX):
        # A user's key in the schedules' namespace could block or hijack a future retune job.
        raise ValueError(f"keys starting with {RESERVED_KEY_PREFIX!r} are reserved for OptiCo's own jobs")
    return key


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobView, openapi_extra=SPEC_BODY,
             responses={200: {"model": JobView, "description": "The job this Idempotency-Key created before."},
                        422: {"description": "Each invalid field with its path and reason."}, **ERRORS})
async def create_job(request: Request, response: Response, store: StoreDep, settings: SettingsDep, _: WriteToken,
                     idempotency_key: Annotated[str | None, Header(min_length=1, max_length=255),
                                                AfterValidator(_users_key)] = None) -> JobView:
    """Submits a job for the workers. The same `Idempotency-Key` returns the same job (200)."""
    raw = await request.body()
    try:
        spec = spec_from_body(raw, request.headers.get("content-type", "application/json"), settings)
    except SpecError as exc:
        raise _spec_error(exc) from None
    from starlette.concurrency import run_in_threadpool

    try:
        job_id, created = await run_in_threadpool(lambda: store.submit_job(spec, idempotency_key=idempotency_key))
    except IdempotencyConflict as exc:
        raise _conflict(exc) from None
    if not created:
        response.status_code = status.HTTP_200_OK
    response.headers["Location"] = f"/api/v1/jobs/{job_id}"
    job = await run_in_threadpool(store.get_job, job_id)
    return job_view(job, None)


@router.get("", response_model=JobPage, responses=ERRORS)
def list_jobs(store: StoreDep, settings: SettingsDep, _: ReadToken,
              status_: Annotated[JobStatus | None, Query(alias="status")] = None,
              workload: Annotated[str | None, Query(max_length=64, description="A workload key.")] = None,
              name: Annotated[str | None, Query(max_length=255, description="A substring of the name.")] = None,
              cursor: Annotated[int | None, DIGITS, Query(ge=1, le=SQL_INT_MAX,
                                                  description="`next_cursor` of the previous page.")] = None,
              limit: Annotated[int, DIGITS, Query(ge=1, le=10_000)] = 50) -> JobPage:
    """Jobs, newest first, filtered by status, workload and name; paginated with a cursor."""
    limit = min(limit, settings.page_max)
    jobs = store.list_jobs(limit + 1, status=status_, workload_key=workload, name=name, before_id=cursor)
    page = jobs[:limit]
    stats = store.job_stats([j.id for j in page])
    return JobPage(items=[job_view(j, stats.get(j.id)) for j in page],
                   next_cursor=page[-1].id if len(jobs) > limit else None)


@router.get("/{job_id}", response_model=JobView, responses=ERRORS)
def get_job(_: ReadToken, job: JobDep, store: StoreDep) -> JobView:
    """One job: status, progress, best so far, lease holder, stop reason."""
    return job_view(job, store.job_stats([job.id]).get(job.id))


@router.get("/{job_id}/trials", response_model=list[TrialView], responses=ERRORS)
def list_trials(_: ReadToken, job: JobDep, store: StoreDep,
                after: Annotated[int, DIGITS, Query(ge=0, le=SQL_INT_MAX, description="Only trials with a larger index.")] = 0,
                ) -> list[TrialView]:
    """The job's trials after index `after`, in order (fetch only what is new)."""
    return [trial_view(t) for t in store.trials(job.id, after_index=after)]


@router.get("/{job_id}/messages", response_model=list[MessageView], responses=ERRORS)
def list_messages(_: ReadToken, job: JobDep, store: StoreDep,
                  after: Annotated[int, DIGITS, Query(ge=0, le=SQL_INT_MAX, description="Only messages with a larger id.")] = 0,
                  iteration: Annotated[int | None, DIGITS, Query(ge=0, le=SQL_INT_MAX)] = None,
                  reasoning: Annotated[bool, Query(description="Include stored chain of thought.")] = False,
                  ) -> list[MessageView]:
    """The agents' messages (their reasoning per iteration), after message id `after`."""
    return [message_view(m, reasoning=reasoning) for m in store.messages(job.id, iteration, after_id=after)]


def _fresh_view(store, job_id: int) -> JobView:
    """The job as it is now, after a change."""
    return job_view(store.get_job(job_id), store.job_stats([job_id]).get(job_id))


def _control(store, job_id: int, to: JobStatus, reason: str) -> JobView:
    try:
        store.transition(job_id, to, reason=reason)
    except LifecycleError as exc:
        raise _conflict(exc) from None
    return _fresh_view(store, job_id)


@router.post("/{job_id}/stop", response_model=JobView, responses=ERRORS)
def stop_job(token: WriteToken, job: JobDep, store: StoreDep) -> JobView:
    """Graceful stop: the running trial finishes, no new one starts. A queued job is cancelled."""
    try:
        store.stop_job(job.id, f"token {token.name}")
    except LifecycleError as exc:
        raise _conflict(exc) from None
    return _fresh_view(store, job.id)


@router.post("/{job_id}/cancel", response_model=JobView, responses=ERRORS)
def cancel_job(token: WriteToken, job: JobDep, store: StoreDep) -> JobView:
    """Cancel: the running trial is killed through its launcher and recorded as lost."""
    return _control(store, job.id, JobStatus.CANCELLED, f"cancelled on request (token {token.name})")


@router.post("/{job_id}/resume", response_model=JobView, responses=ERRORS)
def resume_job(_: WriteToken, job: JobDep, store: StoreDep) -> JobView:
    """Queues an interrupted or failed job again; a worker resumes it from its checkpoint."""
    return _control(store, job.id, JobStatus.QUEUED, "resumed on request")


@router.patch("/{job_id}", response_model=JobView, responses={422: {"description": "Invalid budget."}, **ERRORS})
def patch_job(_: WriteToken, job: JobDep, body: BudgetPatch, store: StoreDep) -> JobView:
    """Raises or lowers the trial or GPU-hour budget, also while the job runs."""
    try:
        store.set_budget(job.id, max_trials=body.max_trials, gpu_hours=body.gpu_hours)
    except LifecycleError as exc:
        raise _conflict(exc) from None
    return _fresh_view(store, job.id)


@router.get("/{job_id}/report", responses={200: {"content": {"application/json": {}, "text/markdown": {}},
                                                  "description": "The report (JSON or Markdown)."}, **ERRORS})
def get_report(_: ReadToken, job: JobDep, store: StoreDep,
               format_: Annotated[Literal["json", "markdown"], Query(alias="format")] = "json",
               tokens: Annotated[float | None, Query(gt=0, le=1e16, allow_inf_nan=False, description="A training budget in tokens: "
                                                     "GPU-hours it takes with the baseline and the best.")] = None):
    """The best configuration as Megatron-LM flags and a launch script, improvement over the baseline,
    the path of changes with the reason for each, failures with their diagnoses, GPU-hours spent and saved."""
    report = job_report(store, job.id, tokens=tokens)
    if format_ == "markdown":
        return PlainTextResponse(report_markdown(report), media_type="text/markdown; charset=utf-8")
    return report

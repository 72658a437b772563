"""`optico jobs submit|stop|cancel|resume|budget`: change jobs in the pool (the workers act on it).

Registered on the `jobs` group next to its read-only commands."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.text import Text

from optico.cli.common import (ANY_COUNT, DatabaseOption, JobIdArgument, console, decimal_number, fail, open_store,
                               whole_number)
from optico.cli.jobs import jobs_app
from optico.errors import SpecError
from optico.redact import redact

if TYPE_CHECKING:
    from optico.pool.contract import Store
    from optico.pool.records import JobRecord


def _change(job_id: int, database: str | None, change: Callable[[Store], JobRecord]) -> None:
    """Applies `change` to the job and prints its new status; a refused change is one line."""
    from optico.pool.lifecycle import LifecycleError

    store, url = open_store(database, job=job_id)
    with store:
        try:
            job = change(store)
        except KeyError:
            fail(SpecError("JOB_ID", f"no job {job_id} in {url}"))
        except LifecycleError as exc:
            fail(str(exc))
    console.print(f"job {job.id} is {job.status.value}", highlight=False)


@jobs_app.command("submit")
def jobs_submit(spec_path: Path = typer.Argument(..., metavar="SPEC.yaml", help="The workload spec."),
                database: Optional[str] = DatabaseOption) -> None:
    """Queue a job for the workers (`optico serve` or `optico worker`) and print its id."""
    from optico.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        fail(str(exc))
    store, _ = open_store(database)
    with store:
        job_id = store.create_job(spec)
    console.print(Text(redact(f"job {job_id} queued: {spec.name}")))  # as stored: redacted, never markup


@jobs_app.command("stop")
def jobs_stop(job_id: int = JobIdArgument, database: Optional[str] = DatabaseOption) -> None:
    """Stop gracefully: the running trial finishes, no new one starts; a queued job is cancelled."""
    _change(job_id, database, lambda store: store.stop_job(job_id, "CLI"))  # as the API stops one


@jobs_app.command("cancel")
def jobs_cancel(job_id: int = JobIdArgument, database: Optional[str] = DatabaseOption) -> None:
    """Cancel: the running trial is killed and recorded as lost."""
    from optico.pool.lifecycle import JobStatus

    _change(job_id, database, lambda store: store.transition(job_id, JobStatus.CANCELLED,
                                                             reason="cancelled on request (CLI)"))


@jobs_app.command("resume")
def jobs_resume(job_id: int = JobIdArgument, database: Optional[str] = DatabaseOption) -> None:
    """Queue an interrupted or failed job again for the workers (`optico tune --resume` runs it here instead)."""
    from optico.pool.lifecycle import JobStatus

    _change(job_id, database, lambda store: store.transition(job_id, JobStatus.QUEUED,
                                                             reason="resumed on request (CLI)"))


@jobs_app.command("budget")
def jobs_budget(job_id: int = JobIdArgument,
                max_trials: Optional[int] = typer.Option(None, "--max-trials", parser=whole_number(0, ANY_COUNT),
                                                         help="New trial budget."),
                gpu_hours: Optional[float] = typer.Option(None, "--gpu-hours", parser=decimal_number(0, math.inf),
                                                          help="New GPU-hour budget."),
                database: Optional[str] = DatabaseOption) -> None:
    """Raise or lower a job's budget, also while it runs."""
    from optico.pool.lifecycle import LifecycleError
    from optico.spec import MAX_GPU_HOURS, MAX_TRIALS

    if max_trials is None and gpu_hours is None:
        fail("give --max-trials and/or --gpu-hours")
    # The spec's bounds: a budget changed later may not exceed what a spec may ask for.
    if max_trials is not None and not 1 <= max_trials <= MAX_TRIALS:
        fail(SpecError("--max-trials", f"must be 1 to {MAX_TRIALS:,}, got {max_trials:,}"))
    if gpu_hours is not None and not (math.isfinite(gpu_hours) and 0 < gpu_hours <= MAX_GPU_HOURS):
        fail(SpecError("--gpu-hours", f"must be above 0 and at most {MAX_GPU_HOURS:g}, got {gpu_hours:g}"))
    store, url = open_store(database, job=job_id)
    with store:
        try:
            job = store.set_budget(job_id, max_trials=max_trials, gpu_hours=gpu_hours)
        except KeyError:
            fail(SpecError("JOB_ID", f"no job {job_id} in {url}"))
        except (LifecycleError, ValueError) as exc:
            fail(str(exc))
    console.print(f"job {job.id}: max trials {job.max_trials}, GPU-hours {job.gpu_hours or '-'}", highlight=False)

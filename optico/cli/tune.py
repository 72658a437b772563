"""`optico tune`: run a tuning job (or resume one) with a live view of its trials."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from optico.cli.common import (DatabaseOption, check_output_path, console, err, fail, open_store, output_file,
                               parse_id, shown_url, whole_number)
from optico.agents.fallback import FALLBACK_LOGGER
from optico.cli.views import summary, trial_block
from optico.reasoner_options import ablations_option, check_llm_settings
from optico.redact import redact
from optico.spec import (
    MAX_SEED,
    MAX_TRIALS,
    REASONER_KINDS,
    Budget,
    JobSpec,
    ReasonerSpec,
    SpecError,
    check_launcher,
    load_spec,
)
from optico.textsafe import markup, rich_text, terminal_text

LAUNCHERS = ("sim", "replay", "local", "ray")


def _apply_overrides(spec: JobSpec, launcher: str | None, max_trials: int | None, seed: int | None,
                     base_dir: Path | None = None) -> JobSpec:
    """The command line's overrides, checked as the spec's own fields are."""
    updates: dict[str, Any] = {}
    if launcher is not None:
        if launcher not in LAUNCHERS:
            raise SpecError("--launcher", f"unknown launcher {launcher[:40]!r} ({', '.join(LAUNCHERS)})")
        if launcher == "replay" and not spec.launcher.data:
            raise SpecError("--launcher", "replay needs launcher.data (a CSV of measured runs) in the spec")
        changed = spec.launcher.model_copy(update={"kind": launcher})
        updates["launcher"] = check_launcher(changed, spec.workload, spec.search_space, base_dir)
    if max_trials is not None:
        updates["budget"] = Budget.model_validate({**spec.budget.model_dump(), "max_trials": max_trials})
    if seed is not None:
        updates["seed"] = seed
    return spec.model_copy(update=updates) if updates else spec


def _apply_reasoner(spec: JobSpec, reasoner: str | None, ablate: str | None = None,
                    require_llm: bool = False) -> JobSpec:
    """`--reasoner` sets all three agents' reasoners, `--ablate` the paper's ablations, `--require-llm`
    makes a fallback to the rules an error; an LLM endpoint must be configured."""
    r = spec.reasoner
    updates: dict[str, Any] = {}
    if reasoner is not None:
        if reasoner not in (*REASONER_KINDS, "openai"):
            raise SpecError("--reasoner", f"unknown reasoner {reasoner[:40]!r} ({', '.join(REASONER_KINDS)})")
        updates.update(ReasonerSpec.every(reasoner).model_dump(include={"analysis", "generation", "failure"}))
    if ablate is not None:
        updates["ablate"] = ablations_option(ablate)
    if require_llm:
        updates["require_llm"] = True
    if updates:
        spec = spec.model_copy(update={"reasoner": ReasonerSpec.model_validate({**r.model_dump(), **updates})})
    if spec.reasoner.require_llm and not spec.reasoner.uses_llm:
        where = "--require-llm" if require_llm else "reasoner.require_llm"  # whichever said it
        raise SpecError(where, "no agent uses an LLM reasoner (set --reasoner llm-led or model-guided)")
    return spec


def _check_environment(spec: JobSpec) -> None:
    """What the spec relies on outside itself: $OPTICO_CALIBRATION, and the devices, libraries and
    folders a real run needs on this machine."""
    from optico.perfmodel.constants import read_calibration
    from optico.launchers.preflight import check_launch

    try:
        if spec.calibration is None and os.environ.get("OPTICO_CALIBRATION"):
            read_calibration(Path(os.environ["OPTICO_CALIBRATION"]), "OPTICO_CALIBRATION")
        check_launch(spec)
    except SpecError as exc:
        fail(exc)


def _check_stored_files(spec: JobSpec) -> None:
    """A resumed job's files, read again as at submission: its replay CSV may have changed since (swapped
    for a FIFO, removed, cut to no usable row), and the job must not start on what cannot be replayed."""
    try:
        check_launcher(spec.launcher, spec.workload, spec.search_space)
    except SpecError as exc:
        fail(exc)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or a container's stop), handled as Ctrl-C is: the job is marked
    interrupted and its lease released, so `--resume` need not wait for the lease to expire."""


class SigtermSeen:
    """Whether SIGTERM came while `sigterm_as_interrupt` was in force (tune exits 143, not 130)."""

    def __init__(self) -> None:
        self.seen = False


@contextmanager
def sigterm_as_interrupt(received: SigtermSeen | None = None) -> Iterator[SigtermSeen]:
    """SIGTERM takes Ctrl-C's path. Under `asyncio.run` that is the runner's SIGINT handler, which
    cancels the job's task at its next await; raising from the handler instead stopped the main
    thread mid-statement, once inside a pool commit on PostgreSQL, and SQLAlchemy's cleanup then
    failed the job ("This session is in 'committed' state") rather than interrupting it. Without a
    running loop it raises `Terminated` as Ctrl-C would raise KeyboardInterrupt."""
    received = received or SigtermSeen()
    if threading.current_thread() is not threading.main_thread():
        yield received  # only the main thread may set handlers (an in-process caller's worker thread)
        return

    def interrupt(signum: int, frame: object) -> None:
        received.seen = True
        on_sigint = signal.getsignal(signal.SIGINT)
        if callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)  # asyncio.run's: cancels the main task (a second one raises)
            return
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, previous)


class TrialView:
    """A block per finished trial (what changed and why, MFU and memory against the limit, or the
    diagnosis and the log), printed above a live progress bar."""

    def __init__(self, max_trials: int, live: bool):
        self.live = live
        # Each fallback is printed below, wrapped; Python's last-resort handler printed it again as an
        # unwrapped warning line. A handler of its own stops that (a service's logging still gets it).
        fallbacks = logging.getLogger(FALLBACK_LOGGER)
        if not any(isinstance(h, logging.NullHandler) for h in fallbacks.handlers):
            fallbacks.addHandler(logging.NullHandler())
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                                 console=console)
        self.task = self.progress.add_task("starting", total=max_trials)

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "trial_started":
            self.progress.update(self.task, description=markup(
                f"running #{payload['index']}: {payload['strategy']}", one_line=True, max_chars=60))
        elif kind == "trial_done":
            console.print(trial_block(
                payload["index"], payload["strategy"], payload["status"], mfu=payload.get("mfu"),
                mem_gib=payload.get("mem_max_gib"), limit_gib=payload.get("mem_limit_gib"),
                why=payload.get("rationale") or "", diagnosis=payload.get("summary"),
                log_path=payload.get("log_path")))
            best = payload.get("best_mfu")
            self.progress.update(self.task, advance=1, description=f"best {best:.1%}" if best else "")
        elif kind == "fallback":  # an LLM reasoner's answer was not used: say so as it happens
            console.print(Text.assemble(("fallback ", "yellow"), rich_text(
                f"iteration {payload.get('iteration')} {payload.get('agent')}: {payload.get('reason', '')}",
                one_line=True, max_chars=400)))
        elif kind == "job_done":
            self.progress.update(self.task, description=markup(f"done: {payload.get('stop_reason') or ''}",
                                                               one_line=True, max_chars=60))


def _where_files_go(spec: JobSpec, url: str, job_id: int) -> None:
    """Says what a trimmed default space fixed, where the pool is and where this job's run logs will
    be, before anything runs."""
    trimmed = spec.search_space.trimmed_text()
    if trimmed:
        console.print(Text.assemble(("search space: ", "dim"), rich_text(trimmed, one_line=True)))
    console.print(Text.assemble(("pool: ", "dim"), rich_text(shown_url(url), one_line=True)))
    kind = spec.launcher.kind
    if kind in ("local", "ray"):
        from optico.launchers.local import default_runs_dir

        root = Path(spec.launcher.run_dir).expanduser() if spec.launcher.run_dir else default_runs_dir()
        files = "stdout.log, stderr.log, command.txt" if kind == "local" else "output.log"
        where = f"{root}/job{job_id}-trial<N>/ ({files})"
    else:
        where = f"none: the {kind} launcher starts no process"
    console.print(Text.assemble(("run logs: ", "dim"), rich_text(where, one_line=True)))


def _with_log_path(store, job_id: int, payload: dict[str, Any]) -> dict[str, Any]:
    trial = next((t for t in store.trials(job_id) if t.index == payload.get("index")), None)
    return {**payload, "log_path": trial.log_path} if trial is not None else payload


def tune(
    spec_path: Optional[Path] = typer.Argument(None, metavar="SPEC.yaml", help="The workload spec."),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="sim|replay|local|ray",
                                           help="Override the spec's launcher."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", parser=whole_number(1, MAX_TRIALS), metavar="N",
                                             help="Override the trial budget."),
    seed: Optional[int] = typer.Option(None, "--seed", parser=whole_number(0, MAX_SEED), metavar="S",
                                       help="Override the job seed."),
    reasoner: Optional[str] = typer.Option(None, "--reasoner", metavar="rules|model-guided|llm-led",
                                           help="Override the spec's reasoners for all three agents (openai = "
                                                "model-guided; the endpoint from OPTICO_LLM_*)."),
    ablate: Optional[str] = typer.Option(None, "--ablate", metavar="LIST",
                                         help="The paper's ablations, comma-separated: history, "
                                              "failure-analysis, cot, confidence."),
    require_llm: bool = typer.Option(False, "--require-llm", help="Fail the job when an LLM reasoner falls "
                                                                  "back to the rules."),
    json_path: Optional[Path] = typer.Option(None, "--json", metavar="PATH", help="Write the result as JSON here."),
    resume: Optional[int] = typer.Option(None, "--resume", metavar="JOB_ID", parser=parse_id,
                                         help="Resume an interrupted job."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Run a tuning job (or resume one) and print the best configuration."""
    if resume is None and spec_path is None:
        fail("SPEC.yaml: give a spec file, or --resume JOB_ID")
    if resume is not None and spec_path is not None:
        fail("--resume: resumes the job's stored spec; give no SPEC.yaml")
    spec = None
    if resume is None:
        try:
            spec = _apply_reasoner(_apply_overrides(load_spec(spec_path), launcher, max_trials, seed,
                                                    spec_path.parent), reasoner, ablate, require_llm)
        except SpecError as exc:
            fail(exc)
        check_llm_settings(spec.reasoner)
        _check_environment(spec)
    if json_path:
        check_output_path(json_path, "--json")
    # Imported after every input is checked: a bad input fails fast, without loading LangGraph.
    from optico.pool.lifecycle import IllegalTransition, JobStatus, LeaseHeld, NothingToResume
    from optico.report import job_result
    from optico.runner import LeasePolicy, run_job

    try:  # before the job is created: a job left queued by a bad variable would be a worker's to run
        policy = LeasePolicy.from_env()
    except ValueError as exc:
        fail(str(exc))

    store, url = open_store(database, job=resume, job_option="--resume")
    try:
        if resume is not None:
            try:
                job = store.get_job(resume)
            except KeyError:
                fail(f"--resume: no job {resume} in {shown_url(url)}")
            check_llm_settings(job.spec.reasoner)
            _check_environment(job.spec)
            _check_stored_files(job.spec)
            max_t = job.max_trials
            job_id = resume
            if job.status is JobStatus.CANCELLED:
                fail(f"--resume: job {job_id} was cancelled; it cannot be resumed")
            if job.lease_live(store.db_now()):
                # Refused before anything is printed (the claim below refuses a race just the same).
                fail(str(LeaseHeld(job_id, job.lease_owner, job.lease_expires_at)))
            name = terminal_text(job.name, one_line=True, max_chars=200)
            if job.status is not JobStatus.SUCCEEDED:
                console.print(Text(f"resuming job {job_id} ({name}), {len(store.trials(job_id))} trials recorded"))
            _where_files_go(job.spec, url, job_id)
            real_runs = job.spec.launcher.kind in ("local", "ray")
        else:
            job_id = store.create_job(spec, origin="cli")
            max_t = spec.budget.max_trials
            # A spec's name is printable (checked), and redacted like every text we print.
            console.print(Text(redact(f"job {job_id}: {spec.name} — {spec.workload.describe()}, "
                                      f"launcher {spec.launcher.kind}")))
            _where_files_go(spec, url, job_id)
            real_runs = spec.launcher.kind in ("local", "ray")
        view = TrialView(max_t, live=console.is_terminal)

        def on_event(kind: str, payload: dict[str, Any]) -> None:
            if kind == "trial_done" and real_runs:
                payload = _with_log_path(store, job_id, payload)
            view.on_event(kind, payload)

        sigterm = SigtermSeen()
        try:
            if store.get_job(job_id).status is not JobStatus.SUCCEEDED:
                with sigterm_as_interrupt(sigterm):
                    if view.live:
                        with Live(view.progress, console=console, refresh_per_second=4):
                            run_job(store, url, job_id, on_event=on_event, policy=policy)
                    else:
                        run_job(store, url, job_id, on_event=on_event, policy=policy)
        except (LeaseHeld, IllegalTransition, NothingToResume) as exc:
            fail(str(exc))
        except KeyboardInterrupt as exc:
            # Said from the pool, not assumed: a job already stopping ends stopped, not resumable.
            ended = store.get_job(job_id)
            if ended.status is JobStatus.INTERRUPTED:
                err.print(f"interrupted: job {job_id} is resumable with `optico tune --resume {job_id}`")
            else:
                err.print(f"interrupted: job {job_id} is {ended.status.value}"
                          + (f" ({markup(ended.stop_reason, one_line=True)})" if ended.stop_reason else ""),
                          highlight=False)
            terminated = isinstance(exc, Terminated) or sigterm.seen
            raise typer.Exit(143 if terminated else 130) from None
        result = job_result(store, job_id)
        final = store.get_job(job_id)
        succeeded = final.status is JobStatus.SUCCEEDED
        # A job that did not succeed says why once: on stderr, below, not also in the summary.
        summary(result, console, stop_reason=succeeded)
        if json_path:
            with output_file(json_path, "--json") as f:
                f.write(json.dumps(result, indent=2) + "\n")
            console.print(Text(f"result written to {terminal_text(json_path, one_line=True)}"))
        if not succeeded:
            reason = terminal_text(final.stop_reason or "", one_line=True, max_chars=500)
            err.print(Text(f"job {job_id} {final.status.value}: {reason}".rstrip(": ")), soft_wrap=True)
            raise typer.Exit(1)
    finally:
        store.close()

"""`optico tune`: run a tuning job (or resume one) with a live view of its trials."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from optico.agents.fallback import FallbackRefused
from optico.cli.common import DatabaseOption, console, err, fail, open_store
from optico.spec import ABLATIONS, REASONER_KINDS, JobSpec, ReasonerSpec, SpecError, load_spec


def _apply_overrides(spec: JobSpec, launcher: str | None, max_trials: int | None, seed: int | None) -> JobSpec:
    updates: dict[str, Any] = {}
    if launcher is not None:
        if launcher not in ("sim", "replay", "local", "ray"):
            raise SpecError("--launcher", f"unknown launcher {launcher!r} (sim, replay, local, ray)")
        if launcher == "replay" and not spec.launcher.data:
            raise SpecError("--launcher", "replay needs launcher.data (a CSV of measured runs) in the spec")
        updates["launcher"] = spec.launcher.model_copy(update={"kind": launcher})
    if max_trials is not None:
        if max_trials < 1:
            raise SpecError("--max-trials", "must be at least 1")
        updates["budget"] = spec.budget.model_copy(update={"max_trials": max_trials})
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
            raise SpecError("--reasoner", f"unknown reasoner {reasoner!r} ({', '.join(REASONER_KINDS)})")
        updates.update(ReasonerSpec.every(reasoner).model_dump(include={"analysis", "generation", "failure"}))
    if ablate is not None:
        wanted = [a.strip() for a in ablate.split(",") if a.strip()]
        unknown = [a for a in wanted if a not in ABLATIONS]
        if unknown:
            raise SpecError("--ablate", f"unknown ablation {unknown[0]!r} ({', '.join(ABLATIONS)})")
        updates["ablate"] = wanted
    if require_llm:
        updates["require_llm"] = True
    if updates:
        spec = spec.model_copy(update={"reasoner": ReasonerSpec.model_validate({**r.model_dump(), **updates})})
    if spec.reasoner.require_llm and not spec.reasoner.uses_llm:
        raise SpecError("--require-llm", "no agent uses an LLM reasoner (set --reasoner llm-led or model-guided)")
    return spec


def _check_llm(spec: JobSpec) -> None:
    """Fails fast, naming the OPTICO_LLM_* variable, when an LLM reasoner cannot be built."""
    r = spec.reasoner
    if r.uses_llm:
        from optico.llm.settings import load_settings

        try:
            load_settings()
        except ValueError as exc:
            fail(f"reasoner {r.analysis if r.analysis != 'rules' else r.generation}: {exc}")


class TrialView:
    """Live rows, one per trial: what changed and why, MFU, memory vs limit, or the diagnosis."""

    def __init__(self, max_trials: int, live: bool):
        self.rows: list[tuple[str, ...]] = []
        self.live = live
        self.progress = Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.description}"), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task("starting", total=max_trials)

    def table(self) -> Table:
        t = Table(show_lines=False, expand=True)
        for col, kw in [("#", {"justify": "right", "width": 3}), ("configuration", {"ratio": 3}),
                        ("what changed and why", {"ratio": 5}), ("MFU", {"justify": "right", "width": 6}),
                        ("memory / diagnosis", {"ratio": 4})]:
            t.add_column(col, **kw)
        for row in self.rows:
            t.add_row(*row)
        return t

    def render(self) -> Group:
        return Group(self.table(), self.progress)

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "trial_started":
            self.progress.update(self.task, description=f"running #{payload['index']}: {payload['strategy']}")
        elif kind == "trial_done":
            if payload["status"] == "ok":
                mem = payload.get("mem_max_gib")
                detail = f"{mem:.1f} / {payload['mem_limit_gib']:.1f} GiB" if mem else ""
                mfu = f"{payload['mfu']:.1%}"
            else:
                detail, mfu = f"[red]{payload.get('summary') or 'failed'}[/]", "[red]fail[/]"
            row = (str(payload["index"]), payload["strategy"], payload.get("rationale", ""), mfu, detail)
            self.rows.append(row)
            self.progress.update(self.task, advance=1, description=f"best {payload['best_mfu']:.1%}"
                                 if payload.get("best_mfu") else "")
            if not self.live:
                console.print(f"#{row[0]:>2} {row[1]:<40} MFU {mfu:>6}  {detail}  — {row[2]}", highlight=False)
        elif kind == "fallback":  # an LLM reasoner's answer was not used: say so as it happens
            console.print(f"[yellow]fallback[/] iteration {payload['iteration']} {payload['agent']}: "
                          f"{escape(payload['reason'])}", highlight=False, soft_wrap=True)
        elif kind == "job_done":
            self.progress.update(self.task, description=f"done: {payload['stop_reason']}")


def summary(result: dict[str, Any]) -> None:
    base, best = result["baseline"], result["best"]
    console.rule(f"[bold]job {result['job_id']} {result['status']}: {result['stop_reason']}")
    if best:
        tflops = best["tflops_per_gpu"]
        shown = f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.3g}"  # CPU runs measure fractions of a TFLOP/s
        line = f"best MFU [bold green]{best['mfu']:.1%}[/] ({shown} TFLOP/s/GPU, trial {best['trial']})"
        if base["mfu"]:
            gain = best["mfu"] / base["mfu"] - 1
            line += f" vs baseline {base['mfu']:.1%} ({base['source']}): {gain:+.1%}"
        console.print(line)
    else:
        console.print("[red]no successful trial[/]")
    console.print(f"trials {len(result['trials'])}, failed {result['failed_trials']}, "
                  f"GPU-hours {result['gpu_hours']:.1f}")
    if best:
        console.print("best configuration as Megatron-LM flags:")
        console.print("  " + " ".join(best["megatron_args"]), highlight=False, soft_wrap=True)


def tune(
    spec_path: Optional[Path] = typer.Argument(None, metavar="SPEC.yaml", help="The workload spec."),
    launcher: Optional[str] = typer.Option(None, "--launcher",
                                            help="Override the spec's launcher: sim|replay|local|ray."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", help="Override the trial budget."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the job seed."),
    reasoner: Optional[str] = typer.Option(None, "--reasoner", help="Override the spec's reasoners for all "
                                           "three agents: rules|model-guided|llm-led (openai = model-guided; "
                                           "endpoint from OPTICO_LLM_*)."),
    ablate: Optional[str] = typer.Option(None, "--ablate", metavar="LIST",
                                         help="The paper's ablations, comma-separated: history, "
                                              "failure-analysis, cot, confidence."),
    require_llm: bool = typer.Option(False, "--require-llm", help="Fail the job when an LLM reasoner falls "
                                                                  "back to the rules."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON here."),
    resume: Optional[int] = typer.Option(None, "--resume", metavar="JOB_ID", help="Resume an interrupted job."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Run a tuning job (or resume one) and print the best configuration."""
    if resume is None and spec_path is None:
        fail("give a SPEC.yaml, or --resume JOB_ID")
    spec = None
    if resume is None:
        try:
            spec = _apply_reasoner(_apply_overrides(load_spec(spec_path), launcher, max_trials, seed), reasoner,
                                   ablate, require_llm)
        except SpecError as exc:
            fail(str(exc))
        _check_llm(spec)
    # Imported after the spec is checked: a bad spec fails fast, without loading LangGraph.
    from optico.report import job_result
    from optico.runner import run_job

    store, url = open_store(database)
    try:
        if resume is not None:
            try:
                job = store.get_job(resume)
            except KeyError:
                fail(f"--resume: no job {resume} in {url}")
            _check_llm(job.spec)
            max_t = job.spec.budget.max_trials
            job_id = resume
            console.print(f"resuming job {job_id} ({job.name}), {len(store.trials(job_id))} trials recorded")
        else:
            job_id = store.create_job(spec)
            max_t = spec.budget.max_trials
            console.print(f"job {job_id}: {spec.name} — {spec.workload.describe()}, launcher {spec.launcher.kind}")
        view = TrialView(max_t, live=console.is_terminal)
        try:
            if view.live:
                with Live(view.render(), console=console, refresh_per_second=4) as live:
                    def on_event(kind: str, payload: dict[str, Any]) -> None:
                        view.on_event(kind, payload)
                        live.update(view.render())
                    run_job(store, url, job_id, on_event=on_event)
            else:
                run_job(store, url, job_id, on_event=view.on_event)
        except FallbackRefused as exc:  # --require-llm: the job is failed, and so is the command
            err.print(f"[bold red]error:[/] job {job_id}: {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None
        result = job_result(store, job_id)
        summary(result)
        if json_path:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(result, indent=2) + "\n")
            console.print(f"result written to {json_path}")
    finally:
        store.close()


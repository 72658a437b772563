"""`optico`: the command line (typer + rich)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from optico.bench.cli import bench
from optico.llm.cli import llm_app
from optico.spec import JobSpec, ReasonerSpec, SpecError, load_spec

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Tune Megatron training configurations.")
jobs_app = typer.Typer(no_args_is_help=True, help="Inspect tuning jobs in the pool.")
perf_app = typer.Typer(no_args_is_help=True, help="The analytic performance model.")
db_app = typer.Typer(no_args_is_help=True, help="The pool's database.")
app.add_typer(jobs_app, name="jobs")
app.add_typer(perf_app, name="perfmodel")
app.add_typer(db_app, name="db")
app.add_typer(llm_app, name="llm")
app.command("bench")(bench)

console = Console()
err = Console(stderr=True)

# Click options take one value each; the files after the first come in as arguments, so both
# `--data a.csv b.csv` (a shell glob) and `--data a.csv --data b.csv` work.
MoreFilesArgument = typer.Argument(None, metavar="[FILE.csv ...]", show_default=False,
                                   help="More CSV files after the first --data one.")
DatabaseOption = typer.Option(None, "--database", envvar="OPTICO_DATABASE_URL",
                              help="SQLAlchemy URL of the pool (default: SQLite in the user data dir).")


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _open_store(database: str | None):
    from optico.pool.db import default_database_url
    from optico.pool.store import SqlStore

    url = database or default_database_url()
    return SqlStore(url), url


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


def _apply_reasoner(spec: JobSpec, reasoner: str | None) -> JobSpec:
    """`--reasoner` sets all three agents' reasoners; an LLM endpoint must be configured."""
    if reasoner is not None:
        if reasoner not in ("rules", "openai"):
            raise SpecError("--reasoner", f"unknown reasoner {reasoner!r} (rules, openai)")
        spec = spec.model_copy(update={"reasoner": ReasonerSpec(analysis=reasoner, generation=reasoner,
                                                                failure=reasoner)})
    return spec


def _check_llm(spec: JobSpec) -> None:
    """Fails fast, naming the OPTICO_LLM_* variable, when an LLM reasoner cannot be built."""
    r = spec.reasoner
    if "openai" in (r.analysis, r.generation, r.failure):
        from optico.llm.settings import load_settings

        try:
            load_settings()
        except ValueError as exc:
            _fail(f"reasoner openai: {exc}")


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
        elif kind == "job_done":
            self.progress.update(self.task, description=f"done: {payload['stop_reason']}")


def _summary(result: dict[str, Any]) -> None:
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


@app.command()
def tune(
    spec_path: Optional[Path] = typer.Argument(None, metavar="SPEC.yaml", help="The workload spec."),
    launcher: Optional[str] = typer.Option(None, "--launcher",
                                            help="Override the spec's launcher: sim|replay|local|ray."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", help="Override the trial budget."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Override the job seed."),
    reasoner: Optional[str] = typer.Option(None, "--reasoner", help="Override the spec's reasoners for all "
                                           "three agents: rules|openai (endpoint from OPTICO_LLM_*)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON here."),
    resume: Optional[int] = typer.Option(None, "--resume", metavar="JOB_ID", help="Resume an interrupted job."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Run a tuning job (or resume one) and print the best configuration."""
    if resume is None and spec_path is None:
        _fail("give a SPEC.yaml, or --resume JOB_ID")
    spec = None
    if resume is None:
        try:
            spec = _apply_reasoner(_apply_overrides(load_spec(spec_path), launcher, max_trials, seed), reasoner)
        except SpecError as exc:
            _fail(str(exc))
        _check_llm(spec)
    # Imported after the spec is checked: a bad spec fails fast, without loading LangGraph.
    from optico.report import job_result
    from optico.runner import run_job

    store, url = _open_store(database)
    try:
        if resume is not None:
            try:
                job = store.get_job(resume)
            except KeyError:
                _fail(f"--resume: no job {resume} in {url}")
            _check_llm(job.spec)
            max_t = job.spec.budget.max_trials
            job_id = resume
            console.print(f"resuming job {job_id} ({job.name}), {len(store.trials(job_id))} trials recorded")
        else:
            job_id = store.create_job(spec)
            max_t = spec.budget.max_trials
            console.print(f"job {job_id}: {spec.name} — {spec.workload.describe()}, launcher {spec.launcher.kind}")
        view = TrialView(max_t, live=console.is_terminal)
        if view.live:
            with Live(view.render(), console=console, refresh_per_second=4) as live:
                def on_event(kind: str, payload: dict[str, Any]) -> None:
                    view.on_event(kind, payload)
                    live.update(view.render())
                run_job(store, url, job_id, on_event=on_event)
        else:
            run_job(store, url, job_id, on_event=view.on_event)
        result = job_result(store, job_id)
        _summary(result)
        if json_path:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(result, indent=2) + "\n")
            console.print(f"result written to {json_path}")
    finally:
        store.close()


@jobs_app.command("list")
def jobs_list(database: Optional[str] = DatabaseOption, limit: int = typer.Option(20, help="How many.")) -> None:
    """Jobs in the pool, newest first."""
    store, _ = _open_store(database)
    with store:
        table = Table("id", "name", "status", "trials", "best MFU", "stop reason", "created")
        for job in store.list_jobs(limit):
            trials = store.trials(job.id)
            best = max((t.mfu for t in trials if t.mfu is not None), default=None)
            table.add_row(str(job.id), job.name, job.status.value, str(len(trials)),
                          f"{best:.1%}" if best is not None else "-", job.stop_reason or "",
                          job.created_at.strftime("%Y-%m-%d %H:%M"))
        console.print(table)


@jobs_app.command("show")
def jobs_show(job_id: int, messages: bool = typer.Option(False, "--messages", help="Each agent's output per iteration."),
              reasoning: bool = typer.Option(False, "--reasoning", help="Include stored chain of thought."),
              database: Optional[str] = DatabaseOption) -> None:
    """One job: its trials, its best configuration, and optionally the agents' messages."""
    from optico.report import job_result

    store, url = _open_store(database)
    with store:
        try:
            result = job_result(store, job_id)
        except KeyError:
            _fail(f"no job {job_id} in {url}")
        table = Table("#", "configuration", "status", "MFU", "memory GiB", "diagnosis / rationale")
        for t in store.trials(job_id):
            table.add_row(str(t.index), t.strategy.short(), t.status.value,
                          f"{t.mfu:.1%}" if t.mfu is not None else "-",
                          f"{t.metrics.mem_max_gib:.1f}" if t.metrics and t.metrics.mem_max_gib else "-",
                          t.failure.summary if t.failure else t.rationale)
        console.print(f"job {job_id}: {result['name']} — {result['workload']}")
        console.print(table)
        if messages:
            for msg in store.messages(job_id):
                console.rule(f"iteration {msg.iteration} · {msg.agent} · {msg.kind}")
                content = dict(msg.content)
                if not reasoning:
                    content.pop("reasoning", None)
                if msg.text:
                    console.print(msg.text, highlight=False)
                console.print_json(json.dumps(content, default=str))
        _summary(result)


def _figures_table(title: str, report: dict[str, Any]) -> Table:
    table = Table("file", "rows", "skipped", "OOM/fit acc.", "MFU MdAPE", "mem MdAPE", "Spearman", title=title)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for name, f in [*report["files"].items(), ("overall", report["overall"])]:
        table.add_row(name, str(f["rows"]), str(f["skipped"]), pct(f["oom_accuracy"]), pct(f["mfu_median_ape"]),
                      pct(f["mem_median_ape"]), "-" if f["spearman"] is None else f"{f['spearman']:.2f}")
    return table


def _require_files(option: str, paths: list[Path]) -> None:
    for path in paths:
        if not path.is_file():
            _fail(f"{option}: no such file: {path}")


@perf_app.command("evaluate")
def perfmodel_evaluate(
    data: list[Path] = typer.Option(..., "--data", help="Replay CSV file(s) of measured runs."),
    more: Optional[list[Path]] = MoreFilesArgument,
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", envvar="OPTICO_CALIBRATION",
                                               help="Constants to evaluate (default: the shipped calibration)."),
) -> None:
    """Compare the model's predictions with measured runs: fit/OOM accuracy, MFU and memory error, rank correlation."""
    from optico.perfmodel.constants import load_constants
    from optico.perfmodel.evaluate import evaluate_files

    data = [*data, *(more or [])]
    _require_files("--data", data)
    try:
        report = evaluate_files(data, load_constants(calibration))
    except (ValueError, FileNotFoundError) as exc:
        _fail(str(exc))
    if as_json:
        print(json.dumps({"files": report["files"], "overall": report["overall"]}, indent=2))
        return
    console.print(_figures_table("performance model vs measurements", report))
    for name, d in report["details"].items():
        if d["skip_reasons"]:
            reasons = ", ".join(f"{k} ({v})" for k, v in list(d["skip_reasons"].items())[:4])
            console.print(f"[dim]{name}: skipped — {reasons}[/]", highlight=False)
        if d.get("mfu_unscored_not_tuned") and name != "overall":
            console.print(f"[dim]{name}: MFU not scored on {d['mfu_unscored_not_tuned']} rows whose times are "
                          f"not tuned throughput (memory and fit/OOM are)[/]", highlight=False)


@perf_app.command("calibrate")
def perfmodel_calibrate(
    data: list[Path] = typer.Option(..., "--data", help="Replay CSV file(s) to fit on."),
    more: Optional[list[Path]] = MoreFilesArgument,
    out: Optional[Path] = typer.Option(None, "--out", help="Write the fitted constants here (JSON)."),
    max_evals: int = typer.Option(40, "--max-evals", help="Least-squares evaluations (each predicts every row)."),
    field: Optional[list[str]] = typer.Option(None, "--field", help="Fit only these constants (repeatable)."),
    holdout: Optional[list[Path]] = typer.Option(None, "--holdout", metavar="FILE.csv",
                                                 help="Measured rows kept out of the fit; evaluate's figures on "
                                                      "them before and after (repeatable)."),
    start: Optional[str] = typer.Option(None, "--start", metavar="defaults|FILE.json",
                                        help="Constants to start from: 'defaults' (uncalibrated) or a JSON file "
                                             "(default: the calibration in use)."),
    prior: float = typer.Option(1.0, "--prior", min=0.0, help="Pull of each constant toward its start (0 = none)."),
) -> None:
    """Fit the model's free constants to measured rows; report evaluate's figures before and after."""
    from optico.perfmodel.calibrate import calibrate, worse_figures
    from optico.perfmodel.constants import Constants, load_constants

    data = [*data, *(more or [])]
    _require_files("--data", data)
    _require_files("--holdout", holdout or [])
    if start not in (None, "defaults") and not Path(start).is_file():
        _fail(f"--start: no such file: {start} (or say 'defaults')")
    try:
        begin = Constants() if start == "defaults" else load_constants(start)
        result = calibrate(data, start=begin, fields=field or None, max_nfev=max_evals,
                           holdout=list(holdout or []) or None, prior=prior)
    except (KeyError, ValueError) as exc:
        _fail(str(exc.args[0] if exc.args else exc))
    console.print(_figures_table("before", result.before))
    console.print(_figures_table("after", result.after))
    console.print(f"cost {result.cost_before:.4f} -> {result.cost_after:.4f}")
    for label, before, after in (("fitted data", result.before, result.after),
                                 ("held-out data", result.holdout_before, result.holdout_after)):
        if before is None or after is None:
            continue
        if label == "held-out data":
            console.print(_figures_table("held out: before", before))
            console.print(_figures_table("held out: after", after))
        worse = worse_figures(before, after)
        console.print(f"{label}: " + (f"[yellow]worse[/] {', '.join(worse)}" if worse else "no figure got worse"),
                      highlight=False)
    if out:
        result.constants.save(out)
        console.print(f"constants written to {out}; select them with OPTICO_CALIBRATION={out}")


@db_app.command("upgrade")
def db_upgrade(database: Optional[str] = DatabaseOption) -> None:
    """Create or migrate the pool's schema (Alembic)."""
    from optico.pool.db import default_database_url, make_engine
    from optico.pool.schema import current_revision, upgrade

    engine = make_engine(database or default_database_url())
    upgrade(engine)
    console.print(f"schema at {current_revision(engine)}")


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())

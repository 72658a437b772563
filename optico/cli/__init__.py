"""`optico`: the command line (typer + rich). One module per command group."""

from __future__ import annotations

import typer

from optico.bench.cli import bench
from optico.cli import job_control  # noqa: F401 - registers submit/stop/cancel/resume/budget on `jobs`
from optico.cli.db import db_app
from optico.cli.jobs import jobs_app
from optico.cli.perfmodel import perf_app
from optico.cli.schedule import schedule_app
from optico.cli.serve import serve, worker
from optico.cli.tokens import token_app
from optico.cli.tune import tune
from optico.llm.cli import llm_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Tune Megatron training configurations.")
app.command()(tune)
app.add_typer(jobs_app, name="jobs")
app.add_typer(perf_app, name="perfmodel")
app.add_typer(db_app, name="db")
app.add_typer(llm_app, name="llm")
app.add_typer(token_app, name="token")
app.add_typer(schedule_app, name="schedule")
app.command("bench")(bench)
app.command("serve")(serve)
app.command("worker")(worker)


def main() -> None:  # pragma: no cover - console entry
    app()

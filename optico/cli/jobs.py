"""`optico jobs ...`: what the pool holds."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from optico.cli.common import DatabaseOption, console, fail, open_store
from optico.cli.tune import summary

jobs_app = typer.Typer(no_args_is_help=True, help="Inspect tuning jobs in the pool.")


@jobs_app.command("list")
def jobs_list(database: Optional[str] = DatabaseOption, limit: int = typer.Option(20, help="How many.")) -> None:
    """Jobs in the pool, newest first."""
    store, _ = open_store(database)
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

    store, url = open_store(database)
    with store:
        try:
            result = job_result(store, job_id)
        except KeyError:
            fail(f"no job {job_id} in {url}")
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
        summary(result)


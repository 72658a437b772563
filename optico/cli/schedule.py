"""`optico schedule add|list|show|remove|run-now`: nightly retuning schedules (docs/retuning.md).

Bad input is one line, `error: <field>: <reason>`, and exit 2, as everywhere in the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from optico.cli.common import (ANY_COUNT, DatabaseOption, check_output_path, console, err, fail, open_store,
                               output_file, whole_number)
from optico.redact import credential_shaped
from optico.textsafe import markup, rich_text

schedule_app = typer.Typer(no_args_is_help=True, help="Nightly retuning schedules: re-check a tuned workload "
                                                      "after framework upgrades.")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else "-"


def _pct(value: float | None) -> str:
    return f"{value:+.1f}%" if value is not None else "-"


def _mfu(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


def _points(value: float | None) -> str:
    """An MFU in percent without the sign (the header says %)."""
    return f"{100 * value:.1f}" if value is not None else "-"


@schedule_app.command("add")
def schedule_add(
    name: str = typer.Argument(..., help="A unique name: letters, digits, '.', '_', '-'."),
    spec_path: Path = typer.Option(..., "--spec", metavar="FILE", help="The job spec (YAML) to keep tuned."),
    cron: Optional[str] = typer.Option(None, "--cron", metavar="EXPR",
                                       help="When it ticks: five cron fields in UTC (default '0 2 * * *', nightly)."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", metavar="N", parser=whole_number(0, ANY_COUNT),
                                             help="A retune's trial budget (default: the spec's budget.max_trials)."),
    always_retune: bool = typer.Option(False, "--always-retune",
                                       help="Retune after every framework change, even within the noise band."),
    webhook: Optional[str] = typer.Option(None, "--webhook", metavar="URL",
                                          help="http(s) URL POSTed a JSON object on a regression."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Add a schedule: each tick checks the framework and retunes the spec's workload when it moved."""
    from optico.retune.cron import DEFAULT_CRON, check_cron, next_fire
    from optico.retune.webhook import check_webhook_url
    from optico.spec import MAX_TRIALS, SpecError, load_spec

    if not NAME.fullmatch(name):  # match() and '$' would take a trailing newline
        fail(f"name: {name!r} must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit")
    if credential_shaped(name):
        fail("name: looks like a credential; a schedule's name is shown in every listing")
    if max_trials is not None and not 1 <= max_trials <= MAX_TRIALS:
        fail(f"--max-trials: must be 1 to {MAX_TRIALS:,}, got {max_trials:,}")
    try:
        cron = check_cron(cron if cron is not None else DEFAULT_CRON)
    except ValueError as exc:
        fail(f"--{exc}")
    try:
        webhook = check_webhook_url(webhook) if webhook else None
    except ValueError as exc:
        fail(f"--webhook: {str(exc).removeprefix('webhook_url: ')}")
    if not spec_path.exists():  # a directory or a FIFO is not "no such file": the loader says what it is
        fail(f"--spec: no such spec file: {spec_path}")
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        fail(str(exc) if exc.field else f"--spec: {exc.reason}")
    store, _ = open_store(database)
    with store:
        try:
            record = store.create_schedule(name, spec, cron=cron, next_fire_at=next_fire(cron, store.db_now()),
                                           max_trials=max_trials or spec.budget.max_trials,
                                           always_retune=always_retune, webhook_url=webhook)
        except ValueError as exc:
            fail(str(exc))
    # The workload's text comes from the spec (a model's name): escaped, never read as Rich markup.
    console.print(f"schedule {record.name!r}: {markup(record.spec.workload.describe())}, cron '{record.cron}' (UTC), "
                  f"{record.max_trials} trials per retune; next tick {_when(record.next_fire_at)} UTC",
                  highlight=False)


@schedule_app.command("list")
def schedule_list(database: Optional[str] = DatabaseOption) -> None:
    """Every schedule: cron, next tick, incumbent and its MFU, last tick."""
    store, _ = open_store(database, empty="no schedules")
    with store:
        table = Table("name", "workload", "cron", "next tick", "incumbent", "MFU", "last tick")
        for s in store.list_schedules():
            inc = s.incumbent
            table.add_row(s.name, rich_text(s.spec.workload.describe()), s.cron, _when(s.next_fire_at),
                          inc.strategy.short() if inc else "-", _mfu(inc.mfu if inc else None), _when(s.last_tick_at))
        console.print(table)


@schedule_app.command("show")
def schedule_show(name: str, history: int = typer.Option(20, "--history", parser=whole_number(0, 1000),
                                                         help="Ticks to show."),
                  database: Optional[str] = DatabaseOption) -> None:
    """A schedule's incumbent and its history of ticks."""
    from optico.fingerprint import describe

    store, _ = open_store(database, absent=f"schedule: no schedule named {name!r}")
    with store:
        try:
            s, ticks = store.schedule_with_history(name, history)
        except KeyError:
            fail(f"schedule: no schedule named {name!r}")
    inc = s.incumbent
    console.print(f"{s.name}: {markup(s.spec.workload.describe())}, cron '{s.cron}' (UTC), "
                  f"next {_when(s.next_fire_at)}", highlight=False)
    if inc:
        console.print(f"incumbent: {inc.strategy.short()}, MFU {_mfu(inc.mfu)}, measured under "
                      f"{markup(describe(inc.fingerprint))}", highlight=False)  # versions a probe read
    # Eleven figures in 80 columns: short dates, MFU before and after in one cell, change and noise in one.
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0))
    for header, justify in (("tick", "right"), ("started", "left"), ("trigger", "left"), ("status", "left"),
                            ("outcome", "left"), ("MFU %", "right"), ("change", "right"), ("job", "right"),
                            ("best %", "right")):
        table.add_column(header, justify=justify, no_wrap=True)
    for t in ticks:
        change = -t.regression_pct if t.regression_pct is not None else None
        mfu = "-" if t.mfu_before is None and t.mfu_after is None else \
            f"{_points(t.mfu_before)}→{_points(t.mfu_after)}"
        noise = f" ±{t.noise_pct:.1f}" if t.noise_pct else ""
        table.add_row(str(t.id), t.started_at.strftime("%m-%d %H:%M") if t.started_at else "-", t.trigger, t.status,
                      t.outcome or "-", mfu, f"{_pct(change)}{noise}" if change is not None else "-",
                      str(t.retune_job_id or "-"), _points(t.new_best_mfu))
    console.print(table)


@schedule_app.command("remove")
def schedule_remove(name: str, database: Optional[str] = DatabaseOption) -> None:
    """Remove a schedule and its history (its jobs stay in the pool)."""
    store, _ = open_store(database, absent=f"schedule: no schedule named {name!r}")
    with store:
        try:
            store.delete_schedule(name)
        except KeyError:
            fail(f"schedule: no schedule named {name!r}")
    console.print(f"schedule {name!r} removed", highlight=False)


@schedule_app.command("run-now")
def schedule_run_now(
    name: str,
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="OUT", help="Write the tick's outcome as JSON."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Tick now, here: probe, re-measure if the framework changed, and run a retune job to its end if one is due."""
    from optico.pool.lifecycle import LifecycleError
    from optico.retune.fire import run_now
    from optico.retune.tick import outcome_json
    from optico.runner import LeasePolicy

    if json_out is not None:
        check_output_path(json_out, "--json")
    try:  # before the tick: a retune job left queued by a bad variable would be a worker's to run
        policy = LeasePolicy.from_env()
    except ValueError as exc:
        fail(str(exc))
    store, url = open_store(database, absent=f"schedule: no schedule named {name!r}")
    with store:
        try:
            store.get_schedule(name)
        except KeyError:
            fail(f"schedule: no schedule named {name!r}")
        err.print(f"ticking {name!r} …", highlight=False)
        try:
            tick = run_now(store, name, database_url=url, policy=policy, lock_s=policy.lease_s)
        except LifecycleError as exc:
            fail(str(exc))
        result = outcome_json(name, tick)
    if json_out is not None:
        with output_file(json_out, "--json") as f:
            f.write(json.dumps(result, indent=2) + "\n")
    if tick.status == "failed":
        fail(f"tick {tick.id} failed: {result['error']}", code=1)
    console.print(_summary(result), highlight=False)


def _summary(r: dict) -> str:
    inc = r["incumbent"]
    line = f"{r['schedule']}: {r['outcome']}"
    if r["outcome"] not in ("first-tune", "no-change"):
        line += (f" — incumbent MFU {_mfu(inc['mfu_before'])} → {_mfu(inc['mfu_after'])} "
                 f"({_pct(-r['regression_pct'] if r['regression_pct'] is not None else None)}, "
                 f"noise ±{r['noise_pct'] or 0:.1f}%)")
    if r["retune_job_id"] is not None:
        line += f"; retune job {r['retune_job_id']}: new best MFU {_mfu(r['new_best_mfu'])}"
        if r["flag_changes"]:
            line += " (" + ", ".join(r["flag_changes"]) + ")"
    return line

"""`optico jobs ...`: what the pool holds."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from optico.cli.common import (DatabaseOption, JobIdArgument, check_output_path, console, fail, open_store,
                               output_file, parse_id, shown_url, whole_number)
from optico.cli.views import resume_hint, status_label, summary, trial_block, worker_gone
from optico.textsafe import rich_text, terminal_text

jobs_app = typer.Typer(no_args_is_help=True, help="Inspect tuning jobs in the pool.")

MAX_LIST = 10_000
# Content keys that are the bulk of a message, shown only with --full.
_BULKY = {"prompt", "completion", "messages", "raw", "response", "request", "log", "log_excerpt"}


def _short_stop(reason: str | None) -> str:
    """A stop reason's first clause ('converged', 'max trials (20) reached'), for one-line rows."""
    if not reason:
        return ""
    return reason.split(":")[0].split(";")[0].strip()


_HEADERS = ("id", "name", "status", "trials", "best", "stopped", "created")
_GAP = 3  # a cell's right padding, the (blank) divider, the next cell's left padding


def _text_widths(rows: list[tuple]) -> tuple[int | None, int | None]:
    """Widths for the two free-text columns (name, stopped) so the row fits the terminal and the
    figures (id, status, trials, best MFU, created) are never cut; None where the text fits as is."""
    def widest(i: int) -> int:
        return max([len(_HEADERS[i])] + [len(str(r[i])) for r in rows])
    fixed = sum(widest(i) for i in (0, 2, 3, 4, 6)) + _GAP * (len(_HEADERS) - 1)
    room = max(16, console.width - fixed)
    name, stop = min(widest(1), 24), widest(5)
    if name + stop <= room:
        return None if widest(1) <= 24 else 24, None
    name = max(8, min(name, room // 2))
    return name, max(8, room - name)


@jobs_app.command("list")
def jobs_list(database: Optional[str] = DatabaseOption,
              limit: int = typer.Option(20, "--limit", parser=whole_number(1, MAX_LIST), metavar="N", help="How many."),
              wide: bool = typer.Option(False, "--wide", help="Full names and stop reasons (rows may wrap).")) -> None:
    """Jobs in the pool, newest first: one row each (--wide: everything, wrapped)."""
    store, _ = open_store(database, empty="no jobs")
    with store:
        store.settle_abandoned_cancels()  # cancelled while their worker looked alive, and it is gone
        rows, gone = [], []
        for job in store.list_jobs(limit):
            trials = store.trials(job.id)
            best = max((t.mfu for t in trials if t.mfu is not None), default=None)
            if worker_gone(job):
                gone.append(job)
            stop = job.stop_reason if wide else _short_stop(job.stop_reason)
            rows.append((str(job.id), rich_text(job.name, one_line=True, max_chars=200), status_label(job),
                         str(len(trials)), f"{best:.1%}" if best is not None else "-",
                         rich_text(stop or "", one_line=True),
                         job.created_at.strftime("%Y-%m-%d %H:%M" if wide else "%m-%d %H:%M")))
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
        name_width, stop_width = (None, None) if wide else _text_widths(rows)
        table.add_column("id", justify="right", no_wrap=True)
        table.add_column("name", no_wrap=not wide, overflow="fold" if wide else "ellipsis", width=name_width)
        table.add_column("status", no_wrap=True)
        table.add_column("trials", justify="right", no_wrap=True)
        table.add_column("best", justify="right", no_wrap=True)
        table.add_column("stopped", no_wrap=not wide, overflow="fold" if wide else "ellipsis", width=stop_width)
        table.add_column("created", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        for job in gone:
            console.print(Text(resume_hint(job), style="yellow"))


def _value(value: Any) -> str:
    """A content value in a few words: strategies as their short form, lists as a count."""
    if isinstance(value, dict):
        if "tensor_model_parallel_size" in value:
            from optico.strategy import Strategy

            try:
                return Strategy.model_validate(value).short()
            except ValueError:
                pass
        shown = [f"{k} {_value(v)}" for k, v in list(value.items())[:4] if not isinstance(v, (dict, list))]
        return ", ".join(shown) + (", ..." if len(value) > len(shown) else "")
    if isinstance(value, list):
        first = value[0] if value else None
        if isinstance(first, dict):
            label = next((first[k] for k in ("text", "summary", "strategy", "rationale") if k in first), None)
            if label is not None:
                return f"{len(value)}, first: {_value(label)}"
        return f"{len(value)} item(s)"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _compact(content: dict[str, Any], reasoning: bool) -> str:
    parts = []
    for key, value in content.items():
        if key in _BULKY or (key == "reasoning" and not reasoning) or value in (None, "", [], {}):
            continue
        parts.append(f"{key}: {_value(value)}")
    return "; ".join(parts)


def _selected_messages(store, job_id: int, *, iteration: int | None, agent: str | None, kind: str | None) -> list:
    """The job's messages the options select; an --iteration, --agent or --kind the job has none of
    is refused."""
    messages = store.messages(job_id, iteration)
    if iteration is not None and not messages:
        held = sorted({m.iteration for m in store.messages(job_id, None)})
        fail(f"--iteration: job {job_id} has no iteration {iteration}; "
             + (f"its iterations: {held[0]} to {held[-1]}" if held else "it has no messages yet"))
    if agent is not None or kind is not None:
        agents = sorted({m.agent for m in messages})
        kinds = sorted({m.kind for m in messages})
        if agent is not None and agent not in agents:
            fail(f"--agent: no messages from {agent[:40]!r} in job {job_id}; agents: {', '.join(agents) or 'none'}")
        if kind is not None and kind not in kinds:
            fail(f"--kind: no messages of kind {kind[:40]!r} in job {job_id}; kinds: {', '.join(kinds) or 'none'}")
        messages = [m for m in messages if (agent is None or m.agent == agent) and (kind is None or m.kind == kind)]
    return messages


def _show_messages(messages: list, *, full: bool, reasoning: bool) -> None:
    for msg in messages:
        title = f"iteration {msg.iteration} · {msg.agent} · {msg.kind}"
        content = dict(msg.content)
        if not reasoning:
            content.pop("reasoning", None)
        if full:
            console.rule(Text(terminal_text(title, one_line=True, max_chars=120)))
            if msg.text:
                console.print(rich_text(msg.text, max_chars=20_000))
            # Not print_json: it re-renders strings with bidi and C1 characters raw.
            console.print(rich_text(json.dumps(content, indent=2, default=str, ensure_ascii=False),
                                    max_chars=200_000))
            continue
        console.print(Text(terminal_text(title, one_line=True, max_chars=120), style="bold"))
        body = Text()
        if msg.text:
            first, *rest = msg.text.strip().splitlines() or [""]
            body.append_text(rich_text(first, one_line=True, max_chars=300))
            if rest:
                body.append(f" (+{len(rest)} more line{'s' if len(rest) > 1 else ''}; --full shows them)",
                            style="dim")
        line = _compact(content, reasoning)
        if line:
            if body:
                body.append("\n")
            body.append_text(rich_text(line, one_line=True, max_chars=400, style="dim"))
        if body:
            console.print(body, no_wrap=False)


@jobs_app.command("show")
def jobs_show(job_id: int = JobIdArgument,
              messages: bool = typer.Option(False, "--messages", help="Each agent's output per iteration, one "
                                                                      "short entry each."),
              iteration: Optional[int] = typer.Option(None, "--iteration", metavar="N", parser=parse_id,
                                                      help="Only this iteration's messages (implies --messages)."),
              agent: Optional[str] = typer.Option(None, "--agent", metavar="NAME",
                                                  help="Only this agent's messages: analysis, generation, guard, "
                                                       "validation, failure, seed (implies --messages)."),
              kind: Optional[str] = typer.Option(None, "--kind", metavar="KIND",
                                                 help="Only messages of this kind, e.g. llm_call, fallback, "
                                                      "diagnosis (implies --messages)."),
              full: bool = typer.Option(False, "--full", help="Messages in full: text and JSON content "
                                                              "(implies --messages)."),
              reasoning: bool = typer.Option(False, "--reasoning", help="Include stored chain of thought."),
              database: Optional[str] = DatabaseOption) -> None:
    """One job: its trials, its best configuration, and optionally the agents' messages."""
    from optico.report import job_result

    store, url = open_store(database, job=job_id)
    with store:
        store.settle_abandoned_cancels(job_id)  # cancelled while its worker looked alive, and it is gone
        try:
            result = job_result(store, job_id)
            job = store.get_job(job_id)
        except KeyError:
            fail(f"JOB_ID: no job {job_id} in {shown_url(url)}")
        shown = None  # checked before anything is printed: a refused filter prints nothing
        if messages or full or iteration is not None or agent is not None or kind is not None:
            shown = _selected_messages(store, job_id, iteration=iteration, agent=agent, kind=kind)
        console.print(Text.assemble(f"job {job_id}: ", rich_text(result["name"], one_line=True),
                                    f" — {result['workload']}"))
        console.print(Text(f"status: {status_label(job)}", style="yellow" if worker_gone(job) else ""))
        if worker_gone(job):
            console.print(Text(resume_hint(job), style="yellow"))
        for t in store.trials(job_id):
            console.print(trial_block(
                t.index, t.strategy.short(), t.status.value, mfu=t.mfu,
                mem_gib=t.metrics.mem_max_gib if t.metrics else None,
                limit_gib=t.metrics.mem_limit_gib if t.metrics else None, why=t.rationale,
                diagnosis=t.failure.described() if t.failure else None,
                log_path=t.log_path if t.status.value != "ok" else None))
        if shown is not None:
            _show_messages(shown, full=full, reasoning=reasoning)
        summary(result, console)


# Launchers whose trials are measurements of real training (sim predicts, replay repeats a table).
_MEASURING_LAUNCHERS = ("local", "ray")


@jobs_app.command("export")
def jobs_export(job_id: int = JobIdArgument,
                out: Path = typer.Option(..., "--out", metavar="FILE.csv", help="Replay CSV to write."),
                database: Optional[str] = DatabaseOption) -> None:
    """A job's measured trials as a replay CSV: for `optico perfmodel evaluate|calibrate --data`,
    `optico bench --landscape` or a replay launcher. Each row holds the trial's framework
    fingerprint; runs that say nothing about their configuration (lost, infrastructure) are left out."""
    check_output_path(out, "--out")
    from optico.replay_format import COLUMNS
    from optico.replay_rows import spreadsheet_safe, trial_row

    store, url = open_store(database, job=job_id)
    with store:
        try:
            job = store.get_job(job_id)
        except KeyError:
            fail(f"JOB_ID: no job {job_id} in {shown_url(url)}")
        launcher = job.spec.launcher.kind
        if launcher not in _MEASURING_LAUNCHERS:
            fail(f"JOB_ID: job {job_id} ran on the {launcher} launcher, whose trials measure nothing "
                 f"(export a job of the {' or '.join(_MEASURING_LAUNCHERS)} launcher)")
        trials = store.trials(job_id)
    rows = [spreadsheet_safe(r) for t in trials
            if (r := trial_row(job.spec.workload, t, job_id=job_id, job_name=job.spec.name, launcher=launcher))]
    with output_file(out, "--out") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    console.print(Text(f"wrote {len(rows)} of {len(trials)} trials to {terminal_text(str(out), one_line=True)}"
                       f" ({len(trials) - len(rows)} said nothing about their configuration)"))

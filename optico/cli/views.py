"""How jobs, trials and results look on a terminal: any width from 80 columns up, words never cut.

Rows that hold prose (why a configuration was tried, a diagnosis, a stop reason) are blocks of
wrapped text rather than table cells: a table at 80 columns folds FUSED_CROSS_ENTROPY into
three lines. Every stored or generated string goes through `optico.textsafe` (a spec name
may hold `[/x]` or terminal escapes; an LLM may answer anything).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from optico.textsafe import rich_text, terminal_text

INDENT = 4
# Without a lease (before the service's lifecycle), a running job whose heartbeat is older than
# its longest possible trial plus this margin has lost its worker.


def trial_block(index: int, strategy: str, status: str, *, mfu: float | None = None,
                mem_gib: float | None = None, limit_gib: float | None = None, why: str = "",
                diagnosis: str | None = None, log_path: str | None = None) -> RenderableType:
    """One trial: a header line (number, configuration, MFU or failure, memory) and wrapped prose."""
    head = Text.assemble((f"#{index:<3}", "bold"), " ", rich_text(strategy, one_line=True, max_chars=200))
    if status == "ok" and mfu is not None:
        head.append(f"   MFU {mfu:.1%}", style="bold")
        if mem_gib:
            head.append(f"   {mem_gib:.1f}" + (f" / {limit_gib:.1f}" if limit_gib else "") + " GiB")
    else:
        head.append(f"   {terminal_text(status, one_line=True, max_chars=20)}", style="red" if status == "failed"
                    else "")
    lines: list[RenderableType] = [head]
    body = Text()
    if diagnosis:
        body.append("diagnosis: ", style="red")
        body.append_text(rich_text(diagnosis, one_line=True, max_chars=600))
    if why:
        if body:
            body.append("\n")
        body.append_text(rich_text(why, one_line=True, max_chars=600))
    if log_path:
        if body:
            body.append("\n")
        body.append("log: ", style="dim")
        body.append_text(rich_text(log_path, one_line=True, max_chars=500))
    if body:
        lines.append(Padding(body, (0, 0, 0, INDENT), expand=False))
    return Group(*lines)


def flag_lines(args: list[str], width: int) -> list[str]:
    """Megatron-LM flags as shell lines that wrap between flags (a flag keeps its value), each
    but the last ending in a backslash, so the block pastes into a shell."""
    units: list[str] = []
    for arg in args:
        if units and not arg.startswith("-") and units[-1].startswith("-") and " " not in units[-1]:
            units[-1] += f" {arg}"
        else:
            units.append(arg)
    lines, current = [], ""
    room = max(20, width - INDENT - 2)
    for unit in units:
        if current and len(current) + 1 + len(unit) > room:
            lines.append(current)
            current = unit
        else:
            current = f"{current} {unit}" if current else unit
    if current:
        lines.append(current)
    return [line + (" \\" if i < len(lines) - 1 else "") for i, line in enumerate(lines)]


def summary(result: dict[str, Any], console: Console, *, stop_reason: bool = True) -> None:
    """The end of a job: why it stopped (unless `stop_reason` is false: the caller says it elsewhere),
    best against baseline, cost, the best flags."""
    base, best = result["baseline"], result["best"]
    console.rule(Text(f"job {result['job_id']} {terminal_text(result['status'], one_line=True, max_chars=40)}",
                      style="bold"))
    if stop_reason and result.get("stop_reason"):
        console.print(Text.assemble("stopped: ", rich_text(result["stop_reason"], one_line=True)))
    if best:
        tflops = best["tflops_per_gpu"]
        shown = f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.3g}"  # CPU runs measure fractions of a TFLOP/s
        line = Text.assemble("best MFU ", (f"{best['mfu']:.1%}", "bold green"),
                             f" ({shown} TFLOP/s/GPU, trial {best['trial']})")
        if base["mfu"]:
            gain = best["mfu"] / base["mfu"] - 1
            line.append(f" vs baseline {base['mfu']:.1%} ({base['source']}): {gain:+.1%}")
        console.print(line)
        if best.get("memory_note"):
            console.print(Text.assemble(("memory: ", "yellow"), rich_text(best["memory_note"], one_line=True)))
    else:
        console.print(Text("no successful trial", style="red"))
    console.print(f"trials {len(result['trials'])}, failed {result['failed_trials']}, "
                  f"GPU-hours {result['gpu_hours']:.1f}", highlight=False)
    if best:
        console.print("best configuration as Megatron-LM flags:")
        for line in flag_lines(best["megatron_args"], console.width):
            console.print(Text(" " * 2 + line), soft_wrap=True)


if TYPE_CHECKING:  # only for annotations: the views do not open the pool
    from optico.pool.records import JobRecord

# -- job states ------------------------------------------------------------------------------------

def worker_gone(job: JobRecord, now: datetime | None = None) -> bool:
    """A job stored as running (or stopping) whose worker is no longer there: its lease expired (the
    worker renews it on a heartbeat for the whole run, however long a trial takes). Another worker,
    or `optico tune --resume`, takes it over."""
    if not job.status.active:
        return False
    return not job.lease_live(now or datetime.now(timezone.utc))


def status_label(job: JobRecord) -> str:
    return f"{job.status.value} (worker gone)" if worker_gone(job) else job.status.value


def resume_hint(job: Any) -> str:
    return f"job {job.id} lost its worker: resume it with `optico tune --resume {job.id}`"

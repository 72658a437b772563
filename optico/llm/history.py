"""The pool's history as a prompt sees it: small, and the same size at trial 10 and trial 200.

The paper hands the model the whole history table; ours grows every iteration, so a
prompt gets a compact view instead:
- every distinct failure once (category and implicated parameter values), with its
  diagnosis and the runs that hit it — the model must not repeat a known failure;
- the best k successful runs and the last n runs, in index order, as a table whose
  columns are only the parameters that vary (the fixed ones are stated once);
- counts of what was left out.
The view is cut to a token budget (fewer recent rows, fewer best rows, then the oldest
failure kinds) so that prompt size stays flat. Tokens are estimated at four characters
each — the budget is a ceiling to stay under, not an exact count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optico.llm.untrusted import cell
from optico.search_space import SearchSpace
from optico.strategy import PAPER_NAMES, Strategy, display_value
from optico.trial import Trial, TrialStatus


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate (about four characters per token for English and numbers)."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True)
class HistoryView:
    text: str
    total: int
    rows: int
    failure_kinds: int
    failure_kinds_shown: int
    tokens: int

    def stats(self) -> dict[str, int]:
        return {"history_total": self.total, "history_rows": self.rows, "failure_kinds": self.failure_kinds,
                "failure_kinds_shown": self.failure_kinds_shown, "history_tokens_est": self.tokens}


def varying_fields(strategies: list[Strategy], space: SearchSpace) -> list[str]:
    """Tunable fields that take more than one value among `strategies` (at least TP and PP)."""
    fields = []
    for f in space.tunables:
        values = {repr(getattr(s.normalized(), f)) for s in strategies}
        if len(values) > 1 or f in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            fields.append(f)
    return fields


def _failure_key(t: Trial) -> tuple:
    f = t.failure
    if f is None:
        return ("unknown", ())
    if f.params:
        return (f.category.value, tuple(sorted((p, repr(getattr(t.strategy, p, None))) for p in f.params)))
    return (f.category.value, (cell(f.summary, 6),))


def _failure_lines(failed: list[Trial]) -> list[str]:
    """One line per failure kind, oldest kind first."""
    groups: dict[tuple, list[Trial]] = {}
    for t in failed:
        groups.setdefault(_failure_key(t), []).append(t)
    lines = []
    for runs in groups.values():
        f = runs[-1].failure
        diagnosis = cell(f.summary if f else "failed, not diagnosed")
        where = ", ".join(f"#{t.index} ({t.strategy.short()})" for t in runs[-3:])
        more = f" and {len(runs) - 3} earlier" if len(runs) > 3 else ""
        lines.append(f"- {f.category.value if f else 'unknown'}: {diagnosis} — runs {where}{more}")
    return lines


def _row(t: Trial, fields: list[str], reference_sig: str) -> str:
    s = t.strategy.normalized()
    values = [display_value(f, getattr(s, f)) for f in fields]
    if t.status == TrialStatus.OK and t.metrics:
        m = t.metrics
        mem = f"{m.mem_max_gib:.1f}/{m.mem_limit_gib:.1f}" if m.mem_max_gib and m.mem_limit_gib else "-"
        util = f"{m.gpu_util_avg:.0%}" if m.gpu_util_avg is not None else "-"
        status, perf = "ok", [f"{m.mfu:.1%}", f"{m.tflops_per_gpu:.0f}", mem, util]
        note = "current configuration (best so far)" if t.signature == reference_sig else ""
    else:
        f = t.failure
        status = f"failed: {f.category.value}" if f else "failed"
        perf = ["-", "-", "-", "-"]
        note = cell(f.summary if f else "", 20)
    return "| " + " | ".join([str(t.index), *values, status, *perf, note]) + " |"


def _render(trials: list[Trial], failed_lines: list[str], n_failure_kinds: int, fields: list[str],
            reference: Strategy, best_k: int, last_n: int, prior: list[Trial]) -> tuple[str, int]:
    ok = sorted((t for t in trials if t.status == TrialStatus.OK and t.metrics), key=lambda t: -t.metrics.mfu)
    chosen = {t.index for t in ok[:best_k]} | {t.index for t in trials[-last_n:]}
    ref_sig = reference.signature()
    chosen |= {t.index for t in trials if t.signature == ref_sig and t.status == TrialStatus.OK}
    rows = [t for t in trials if t.index in chosen]
    n_ok, n_failed = len(ok), sum(1 for t in trials if t.status == TrialStatus.FAILED)
    header = ["#", *(PAPER_NAMES.get(f, f) for f in fields), "status", "MFU", "TFLOP/s/GPU", "mem GiB max/limit",
              "GPU util", "note"]
    lines = [f"Runs so far: {len(trials)} ({n_ok} ok, {n_failed} failed). Table: the best {min(best_k, n_ok)} "
             f"successful runs and the last {min(last_n, len(trials))} runs, oldest first"
             + (f"; {len(trials) - len(rows)} other runs omitted" if len(trials) > len(rows) else "") + ".",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [_row(t, fields, ref_sig) for t in rows]
    if rows:
        lines.append(f"The last row (#{rows[-1].index}) is the most recent run.")
    if n_failure_kinds:
        lines.append("")
        lines.append(f"Known failures ({n_failure_kinds} kinds, each once; never repeat a parameter-related one — "
                     f"timeouts, hangs and infrastructure faults may be transient):")
        lines += failed_lines
        if len(failed_lines) < n_failure_kinds:
            lines.append(f"- ... {n_failure_kinds - len(failed_lines)} older failure kinds omitted "
                         f"(the validator still rejects them)")
    prior_ok = [t for t in prior if t.status == TrialStatus.OK and t.metrics]
    if prior:
        best = max(prior_ok, key=lambda t: t.metrics.mfu) if prior_ok else None
        lines.append("")
        lines.append(f"Earlier jobs on this workload: {len(prior)} runs"
                     + (f"; best MFU {best.metrics.mfu:.1%} with {best.strategy.short()}." if best else "."))
    return "\n".join(lines), len(rows)


def history_view(trials: list[Trial], *, space: SearchSpace, reference: Strategy, best_k: int = 5,
                 last_n: int = 6, token_budget: int = 2500, prior: list[Trial] | None = None,
                 full: bool = False, last_only: bool = False) -> HistoryView:
    """The compact view of `trials` (oldest first), under `token_budget` estimated tokens.

    `full` (the LLM-led mode, as in the paper): every run, until the budget forces the table down
    to the best `best_k` and the last `last_n`; every failure kind stays, whatever the budget.
    `last_only` (the ablation without the pool's history): the most recent run alone."""
    trials = sorted(trials, key=lambda t: t.index)
    prior = prior or []
    if last_only:
        trials, prior = trials[-1:], []
    if not trials:
        text = "No runs yet."
        return HistoryView(text, 0, 0, 0, 0, estimate_tokens(text))
    fields = varying_fields([t.strategy for t in trials] + [reference], space)
    failure_lines = _failure_lines([t for t in trials if t.status == TrialStatus.FAILED])
    n_kinds = len(failure_lines)
    shown = failure_lines
    floor_best, floor_last = best_k, last_n
    if full:
        best_k = last_n = len(trials)
    while True:
        text, rows = _render(trials, shown, n_kinds, fields, reference, best_k, last_n, prior)
        tokens = estimate_tokens(text)
        if tokens <= token_budget:
            break
        # Recent context goes first, then breadth of successes, then (compact mode only) the oldest
        # failure kinds. A full table sheds its oldest rows a few at a time down to best k + last n.
        if last_n > floor_last:
            last_n = max(floor_last, last_n - max(1, (last_n - floor_last) // 8))
        elif best_k > floor_best:
            best_k = max(floor_best, best_k - max(1, (best_k - floor_best) // 8))
        elif last_n > 2:
            last_n -= 1
        elif best_k > 1:
            best_k -= 1
        elif len(shown) > 1 and not full:
            shown = shown[1:]
        else:
            break
    if last_only:
        text = ("The pool's history is withheld in this run (ablation): only the most recent run is shown.\n"
                + text)
    return HistoryView(text=text, total=len(trials), rows=rows, failure_kinds=n_kinds,
                       failure_kinds_shown=len(shown), tokens=estimate_tokens(text))

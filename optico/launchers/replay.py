"""The replay launcher: answers from a CSV of real measured runs, never from a guess.

A tuner run against it walks a real landscape (the OptiCo paper's Llama3-8B table, a
vendor's recipe sweep): a configuration the file measured comes back with the measured
numbers, an OOM row comes back as an OOM, and anything else comes back as NOT_MEASURED.
`candidates()` tells the loop which strategies the file can answer, so the search is
restricted to them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from optico.launchers.base import Launcher, ProgressCallback
from optico.flops import flops_per_iteration
from optico.replay_csv import read_replay_csv
from optico.replay_format import ReplayDefaults, ReplayRow
from optico.replay_measured import matches, measured_mfu, replayable
from optico.strategy import Strategy
from optico.trial import FailureCategory, LaunchResult, Metrics
from optico.workload import Workload

# A measured run is charged this many timed steps: what a benchmark run of the configuration
# costs (Megatron's benchmark driver and the published tables time 10-50 steps), so that
# GPU-hour budgets mean the same against a replay table as against a cluster.
TIMED_STEPS = 20
# A run that failed (OOM, error) is charged this much wall-clock on every GPU: launch, model
# build and the first step, where OOMs happen. The sources do not record it.
FAILED_RUN_WALL_S = 60.0


def table_digest(path: str | Path) -> str | None:
    """A replay table's identity in a framework fingerprint (`replay_data`): another table is another
    "cluster", whose failures are hints to a job on this one, not facts. None if it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


class ReplayLauncher(Launcher):
    """Replays the rows of one replay CSV (see optico.replay_csv). Skipped rows are never replayed."""

    kind = "replay"

    def __init__(self, path: str | Path, defaults: ReplayDefaults | None = None,
                 rows: list[ReplayRow] | None = None):
        """`rows`: the file's rows as already read with these defaults (a benchmark builds one
        launcher per run of the same table; parsing it again each time cost seconds)."""
        self.path = Path(path)
        self.defaults = defaults or ReplayDefaults()
        self.rows: list[ReplayRow] = rows if rows is not None else read_replay_csv(self.path, self.defaults)
        self.digest = table_digest(self.path)
        # Replayable rows by configuration: a launch looks up one signature, not every row.
        self._by_signature: dict[str, list[ReplayRow]] = {}
        for row in self.rows:
            if replayable(row):
                self._by_signature.setdefault(row.strategy.signature(), []).append(row)

    # -- the protocol ----------------------------------------------------------------------------
    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        found = self.rows_for(workload, strategy)
        if not found:
            return self._not_measured(workload, strategy)
        chosen = representative(found)
        if progress:
            progress(f"[replay] {strategy.short()}: replaying {chosen.where} ({chosen.result})")
        note = _repeats_note(found, chosen)
        fingerprint = self._fingerprint(chosen, found)
        if chosen.result == "ok":
            return self._ok(workload, strategy, chosen, note, fingerprint)
        return self._failed(workload, strategy, chosen, note, fingerprint)

    def candidates(self, workload: Workload) -> list[Strategy]:
        """Strategies of the usable rows that measure `workload`, each signature once, in file order."""
        seen: dict[str, Strategy] = {}
        for row in self.rows:
            if replayable(row) and matches(row, workload):
                seen.setdefault(row.strategy.signature(), row.strategy)
        return list(seen.values())

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "rows": len(self.rows),
                "usable_rows": sum(r.usable for r in self.rows), "defaults": self.defaults.model_dump()}

    # -- lookups ---------------------------------------------------------------------------------
    def rows_for(self, workload: Workload, strategy: Strategy) -> list[ReplayRow]:
        """The usable rows that measured exactly this configuration of this workload."""
        return [r for r in self._by_signature.get(strategy.signature(), []) if matches(r, workload)]

    # -- results ---------------------------------------------------------------------------------
    def _fingerprint(self, row: ReplayRow, found: list[ReplayRow]) -> dict[str, Any]:
        return {"launcher": self.kind, "replay_of": row.where, "file": str(self.path), "line": row.line,
                "source": row.source, "model": row.model_name, "rows_measuring": [r.line for r in found],
                "replay_data": self.digest}

    def _ok(self, w: Workload, s: Strategy, row: ReplayRow, note: str,
            fingerprint: dict[str, Any]) -> LaunchResult:
        world, flops = w.world_size, flops_per_iteration(w, s.tp)
        mfu = measured_mfu(row)  # not None: `replayable` rows only
        tflops = mfu * w.peak_tflops  # model FLOPs, whatever the source counted
        step = row.step_time_s or flops / (tflops * 1e12 * world)
        tokens = row.tokens_per_s_per_gpu or w.global_batch_size * w.seq_length / (step * world)
        metrics = Metrics(step_time_s=step, tflops_per_gpu=tflops, mfu=mfu, tokens_per_s_per_gpu=tokens,
                          mem_max_gib=row.mem_max_gib, mem_limit_gib=w.cluster.spec.memory_gib)
        log = (f"{note}[replay] {row.where}: measured run ({row.source or 'source not given'}): "
               f"step {step:.3f} s, {tflops:.1f} model TFLOP/s/GPU, MFU {mfu:.3f}"
               + (f", max memory {row.mem_max_gib:.2f} GiB" if row.mem_max_gib is not None else "") + "\n")
        return LaunchResult(ok=True, metrics=metrics, log=log, exit_code=0, duration_s=step * TIMED_STEPS,
                            gpu_seconds=step * world * TIMED_STEPS, fingerprint=fingerprint)

    def _failed(self, w: Workload, s: Strategy, row: ReplayRow, note: str,
                fingerprint: dict[str, Any]) -> LaunchResult:
        header = (f"{note}[replay] {row.where}: replayed from a measured run "
                  f"({row.source or 'source not given'}); it ")
        if row.result == "oom":
            alloc = _logits_gib(w, s)
            log = (header + "ran out of GPU memory.\n"
                   f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc:.2f} GiB. "
                   f"GPU 0 has a total capacity of {w.cluster.spec.memory_gib:.2f} GiB.\n"
                   "[replay] the source records only that this configuration ran out of memory; the "
                   "allocation size above is an estimate (fp32 logits of one micro-batch on one TP/CP rank).\n")
            category: FailureCategory | None = FailureCategory.OOM
        else:
            log = header + f"failed: {row.notes or 'no error text recorded'}\n"
            category = None
        return LaunchResult(ok=False, log=log, exit_code=1, duration_s=FAILED_RUN_WALL_S,
                            gpu_seconds=FAILED_RUN_WALL_S * w.world_size, fingerprint=fingerprint,
                            category_hint=category)

    def _not_measured(self, w: Workload, s: Strategy) -> LaunchResult:
        known = len(self.candidates(w))
        log = (f"[replay] {s.short()} was not measured in {self.path.name} for {w.describe()}: "
               f"the file has {known} measured configuration(s) of this workload. Nothing ran; "
               f"a replay never guesses.\n")
        return LaunchResult(ok=False, log=log, category_hint=FailureCategory.NOT_MEASURED,
                            fingerprint={"launcher": self.kind, "file": str(self.path), "replay_of": None,
                                         "replay_data": self.digest})


def representative(found: list[ReplayRow]) -> ReplayRow:
    """The row a configuration measured more than once replays as: the run with the median MFU of
    its successful runs (a re-run measures noise, and neither the first nor the best of them is
    the configuration's speed). A configuration that ran once ran: it replays a success even where
    other rows of it failed. With no success, the first failure."""
    ok = sorted((r for r in found if r.result == "ok"), key=lambda r: (measured_mfu(r) or 0.0, r.line))
    if not ok:
        return found[0]
    return ok[(len(ok) - 1) // 2]  # the lower median: always a measured row, never an average of two


def _repeats_note(found: list[ReplayRow], chosen: ReplayRow) -> str:
    if len(found) == 1:
        return ""
    lines = ", ".join(str(r.line) for r in found)
    ok = [measured_mfu(r) or 0.0 for r in found if r.result == "ok"]
    if len(ok) > 1:
        why = f"the median of its {len(ok)} successful runs (MFU {min(ok):.3f}-{max(ok):.3f})"
    elif ok:
        why = "its one successful run"
    else:
        why = "the first"
    failed = len(found) - len(ok)
    also = f"; {failed} of them failed" if ok and failed else ""
    return f"[replay] {len(found)} rows measure this configuration (lines {lines}){also}; replayed line {chosen.line}, {why}.\n"


def _logits_gib(w: Workload, s: Strategy) -> float:
    """fp32 logits of one micro-batch on one TP and CP rank: the largest single allocation of a step."""
    return s.mbs * (w.seq_length / s.cp) * (w.model.padded_vocab(s.tp) / s.tp) * 4 / 2**30

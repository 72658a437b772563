"""What a replay row measured, on one count: its MFU on Megatron-LM's model FLOPs whatever the
source counted (`measured_mfu`), the stated figures that disagree with its step time, a measurement no
GPU can make, the software it ran, and whether it measures a given workload."""

from __future__ import annotations

import re

from optico.flops import core_attention_flops_per_token, flops_per_iteration, flops_per_token, logits_flops_per_token
from optico.replay_format import ReplayRow
from optico.replay_names import dims
from optico.strategy import Strategy
from optico.workload import Workload

# Full recompute runs each layer's forward twice: forward + recompute + backward (2x forward)
# = 4 forward-equivalents where model FLOPs count 3 (the output layer is not recomputed).
FULL_RECOMPUTE_HFU_RATIO = 4.0 / 3.0

# A stated MFU or TFLOP/s further than this from the step time's MFU is named in the file report.
SET_ASIDE_TOLERANCE = 0.03
# Unknown cells that leave a row's FLOP count as it is (flops_per_iteration reads the workload and TP).
_FLOPS_UNCHANGED_BY = frozenset({"mbs", "pp", "cpu_offloading_num_layers"})


def figures_set_aside(row: ReplayRow) -> list[str]:
    """The MFU and TFLOP/s cells of a row that also gives its step time, where they differ from the step
    time's MFU by more than `SET_ASIDE_TOLERANCE`: the step time is used (`measured_mfu`), and the report
    says the cell was not (the source counted FLOPs otherwise: full attention, the recompute pass)."""
    if not row.read or not row.step_time_s or row.result != "ok" or set(row.unknown) - _FLOPS_UNCHANGED_BY:
        return []
    used = measured_mfu(row)
    out = []
    for column, other in (("mfu", "tflops_per_gpu"), ("tflops_per_gpu", "mfu")):
        # The cell's MFU as `measured_mfu` reads it when the row has no step time (hardware FLOPs included).
        if getattr(row, column) is None:
            continue
        stated = measured_mfu(row.model_copy(update={"step_time_s": None, other: None}))
        if stated and used and abs(stated / used - 1) > SET_ASIDE_TOLERANCE:
            out.append(f"{column}: the step time's MFU used, the cell differs by over {SET_ASIDE_TOLERANCE:.0%}")
    return out


IMPOSSIBLE = "impossible measurement"


def impossible_measurement(row: ReplayRow) -> str | None:
    """Why a complete row's numbers cannot have been measured on its GPU (`optico.plausible`), or None:
    such a row is no data point for a replay, a fit or a score (the reader skips it)."""
    from optico.plausible import measurement_problem

    assert row.workload is not None
    return measurement_problem(
        row.workload, mfu=measured_mfu(row), mem_max_gib=row.mem_max_gib, step_time_s=row.step_time_s,
        tokens_per_s_per_gpu=row.tokens_per_s_per_gpu, tflops_per_gpu=row.tflops_per_gpu, mfu_column=row.mfu)


def peak_tflops(row: ReplayRow) -> float | None:
    """Dense peak TFLOP/s of the row's GPU at the row's precision (the catalog's)."""
    return row.workload.peak_tflops if row.workload else None


def tuned_throughput(row: ReplayRow) -> bool:
    """False for rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs
    in deterministic mode, per the data README): their memory and fit/OOM outcome still count."""
    return "not tuned" not in row.notes.lower()


def stated_flops_ratio(row: ReplayRow, w: Workload, s: Strategy) -> float:
    """Our model FLOPs over the FLOPs the row's source counted for its stated TFLOP/s and MFU: 1 for a
    source on our count; below 1 for one that counted attention without its causal mask
    (`counts_full_attention`: 0.89 for Llama-3 8B at 8K tokens, 0.51 at 1M) or, under full recompute,
    the recompute forward pass (`counts_recompute`: the layers' FLOPs × 4/3, the output layer's once —
    Narayanan et al.'s Eq. 3 exactly for their GPT models)."""
    recomputed = row.counts_recompute and s.recompute == "full"
    if not (row.counts_full_attention or recomputed):
        return 1.0
    m, tp = w.model, s.tp
    ours = flops_per_token(m, w.seq_length, tp)
    theirs = ours + (core_attention_flops_per_token(m, w.seq_length) if row.counts_full_attention else 0.0)
    if recomputed:
        logits = logits_flops_per_token(m, tp)
        theirs = (theirs - logits) * FULL_RECOMPUTE_HFU_RATIO + logits
    return ours / theirs


def measured_mfu(row: ReplayRow, workload: Workload | None = None, strategy: Strategy | None = None) -> float | None:
    """MFU on Megatron-LM's model FLOPs (optico.flops), comparable across sources; for a row with
    unknown cells, as one of its `variants` (`workload`, `strategy`) would have it.

    - From step_time_s when given: flops_per_iteration / (step_time · world · peak). This is the
      only figure computed with our own FLOPs formula, so it is preferred.
    - Else the mfu column, else tflops_per_gpu / peak, brought to our FLOPs count by
      `stated_flops_ratio` (a source that counted the recompute pass or attention without its
      causal mask states a larger figure for the same run).
    - Else tokens_per_s_per_gpu, through our FLOPs per token.
    None for rows that did not run (oom/error), skipped rows and rows with no throughput figure.
    """
    w, s = workload or row.workload, strategy or row.strategy
    if row.result != "ok" or not row.read or w is None or s is None:
        return None
    peak = w.peak_tflops
    if row.step_time_s:
        return flops_per_iteration(w, s.tp) / (row.step_time_s * w.world_size * peak * 1e12)
    if row.mfu is not None:
        return row.mfu * stated_flops_ratio(row, w, s)
    if row.tflops_per_gpu is not None:
        return row.tflops_per_gpu / peak * stated_flops_ratio(row, w, s)
    if row.tokens_per_s_per_gpu is not None:
        return row.tokens_per_s_per_gpu * flops_per_iteration(w, s.tp) / (w.global_batch_size * w.seq_length) \
            / (peak * 1e12)
    return None


_SOFTWARE = re.compile(r"\brelease\s+[\w.]+|\bcontainer\s+[^;,()]+|\bNeMo\s+\d+\.\d+[\w.]*|golden_values_\w+|"
                       r"\bcommit\s+[0-9a-f]{7,}", re.IGNORECASE)


def software(row: ReplayRow) -> str:
    """The software a row was measured with, as its source or notes name it ('release 26.08',
    'container NeMo 24.07', a golden-values file, a commit); '' when they do not say. Rankings
    compare configurations measured with the same software: a newer release of the same recipe
    is faster without any knob changing."""
    found = _SOFTWARE.search(f"{row.notes} {row.source}")
    return found.group(0).strip().lower() if found else ""


def replayable(row: ReplayRow) -> bool:
    """A row the replay launcher can answer from: complete, and either it ran with a throughput
    figure or it failed (an ok row with memory only tells nothing a replay could return)."""
    return row.usable and (row.result != "ok" or measured_mfu(row) is not None)


def matches(row: ReplayRow, workload: Workload) -> bool:
    """Does `row` measure `workload`? Compares only what a CSV row can say: layers, hidden, heads,
    query groups, (per-expert) FFN, vocabulary, experts, top-k, sequence, global batch, precision,
    GPU and world size. Names, kv_channels, SwiGLU and tied embeddings are not compared."""
    w = row.workload
    if w is None or row.unknown:
        return False
    return (dims(w.model) == dims(workload.model)
            and w.seq_length == workload.seq_length
            and w.global_batch_size == workload.global_batch_size
            and w.precision == workload.precision
            and w.cluster.gpu == workload.cluster.gpu
            and w.world_size == workload.world_size)

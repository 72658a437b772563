"""Writing measured runs as replay rows (the format `replay_csv` reads).

One writer for every measurement we make: a GPU sweep's runs (benchmarks/gpu_sweep.py) and a
job's trials (`optico jobs export`). A row must read back as the workload and strategy that ran,
so what the columns cannot say goes into the notes' `args:` list, as Megatron-LM arguments:
the head dimension and the expert widths, untied embeddings (a reader otherwise takes Megatron-LM's
default, tied), the gated MLP (a reader otherwise guesses it from the widths: Llama-3.2-1B's FFN is
4 x hidden, GPT-3's width), the fused cross entropy's kernel when it is not megatron-core's default,
and every knob without a column (fused cross entropy, the partial-recompute method and layer count,
the overlaps, ...).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from optico.knobs import KNOBS
from optico.replay_format import COLUMNS, WIDTH_ARGS
from optico.strategy import Strategy
from optico.trial import FailureCategory, Trial, TrialStatus
from optico.workload import Workload

RowResult = Literal["ok", "oom", "error"]
# A failure that says nothing about the configuration (a dead node, a run never measured) is no row.
_NOT_THE_CONFIGURATION = (FailureCategory.INFRASTRUCTURE, FailureCategory.NOT_MEASURED)


def megatron_args(w: Workload, s: Strategy) -> str:
    """The notes' 'args:' list: untied embeddings, the gated MLP, the widths no column holds, and every
    knob no column states that is not at Megatron-LM's default, as the registry's flag (a reader takes
    the others as defaults)."""
    m = w.model
    args = [f"untie-embeddings-and-output-weights={m.untie_embeddings_and_output_weights}", f"swiglu={m.swiglu}"]
    args += [f"{flag}={value}" for flag, key in WIDTH_ARGS.items() if (value := getattr(m, key)) is not None]
    if w.cross_entropy_fusion_impl != Workload.model_fields["cross_entropy_fusion_impl"].default:
        args.append(f"cross-entropy-fusion-impl={w.cross_entropy_fusion_impl}")
    for k in KNOBS:
        value = getattr(s, k.name)
        if k.csv in COLUMNS or not k.flags or value == k.default:
            continue
        flag = k.flags[0]
        if k.is_bool and k.negates(flag):
            value = not value
        args.append(f"{flag.removeprefix('--')}={value}")
    return "; args: " + ", ".join(args)


# Significant digits of a measured figure in a row: a CPU run's 0.046 TFLOP/s stays a positive number
# (fixed decimals wrote 0.0, which every reader rejects as impossible).
MEASURED_DIGITS = 6


def _rounded(value: float | None) -> float | str:
    return "" if value is None else float(f"{value:.{MEASURED_DIGITS}g}")


def replay_row(w: Workload, s: Strategy, *, result: RowResult, source: str, notes: dict[str, Any],
               metrics: dict[str, float | None] | None = None, memory_meaning: str = "") -> dict[str, Any]:
    """One row: `metrics` holds mfu, tflops_per_gpu, step_time_s, tokens_per_s_per_gpu and
    mem_max_gib for an ok run; `memory_meaning` says what mem_max_gib measured (allocated, reserved)."""
    m = w.model
    metrics = metrics if result == "ok" else None
    row: dict[str, Any] = {
        "source": source,
        "model": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads, "num_query_groups": m.groups,
        "ffn_hidden_size": m.ffn_hidden_size, "vocab_size": m.vocab_size, "seq_length": w.seq_length,
        "num_experts": m.num_experts or "", "topk": m.moe_router_topk if m.num_experts else "",
        "gpu": w.cluster.gpu, "num_gpus": w.world_size,
        "tp": s.tp, "pp": s.pp, "dp": s.dp(w.world_size), "cp": s.cp, "ep": s.ep, "vpp": s.vpp, "mbs": s.mbs,
        "gbs": w.global_batch_size, "recompute": s.recompute, "precision": w.precision,
        "sequence_parallel": str(s.sequence_parallel).lower(),
        "distributed_optimizer": str(s.use_distributed_optimizer).lower(),
        "result": result,
    }
    get = (metrics or {}).get
    row.update({k: _rounded(get(k)) for k in ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu",
                                               "mem_max_gib")})
    prefix = f"{memory_meaning}; " if metrics and memory_meaning else ""
    row["notes"] = prefix + json.dumps(notes, default=str) + megatron_args(w, s)
    assert set(row) == set(COLUMNS), set(row) ^ set(COLUMNS)
    return row


# A spreadsheet opening the CSV runs a cell starting with one of these as a formula ("=cmd|...").
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with every text cell that a spreadsheet would read as a formula prefixed with a quote
    (a job or model name is the user's text; numbers are left alone)."""
    return {k: f"'{v}" if isinstance(v, str) and v.startswith(_FORMULA_STARTS) else v for k, v in row.items()}


def trial_result(t: Trial) -> RowResult | None:
    """What a finished trial says about its configuration; None when it says nothing (lost, still
    running, an infrastructure fault, never measured)."""
    if t.status == TrialStatus.OK and t.metrics is not None:
        return "ok"
    if t.status != TrialStatus.FAILED or t.failure is None or t.failure.category in _NOT_THE_CONFIGURATION:
        return None
    return "oom" if t.failure.category == FailureCategory.OOM else "error"


def trial_row(w: Workload, t: Trial, *, job_id: int, job_name: str, launcher: str) -> dict[str, Any] | None:
    """A job's trial as a replay row (None: see `trial_result`). The trial's memory is the peak its
    launcher reported: torch's max reserved (the driver's result line, Megatron-LM's memory report)."""
    result = trial_result(t)
    if result is None:
        return None
    notes: dict[str, Any] = {"command": f"optico tune (job {job_id} {job_name!r}, trial {t.index}, launcher {launcher})",
                             "fingerprint": t.fingerprint}
    if t.failure is not None:
        notes["error"] = t.failure.summary[:300]
    metrics = t.metrics.model_dump() if t.metrics is not None else None
    return replay_row(w, t.strategy, result=result, source=f"OptiCo job {job_id} ({launcher} launcher)",
                      notes=notes, metrics=metrics, memory_meaning="mem_max_gib = torch max reserved")

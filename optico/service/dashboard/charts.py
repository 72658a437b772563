"""What the dashboard's pages show, as plain data: trial rows and plotly figures (traces + layout).

Pure functions of the pool's records, so the server renders them into the page, the live updates
send the same rows for new trials only, and tests check them without a browser.
"""

from __future__ import annotations

from typing import Any

from optico.perfmodel.constants import Constants
from optico.perfmodel.model import predict
from optico.report import flag_changes
from optico.rules import violations
from optico.textsafe import terminal_text
from optico.trial import Trial, TrialStatus
from optico.workload import Workload

# The MFU chart's traces, in this order; the live update extends them by index.
MFU_TRACES = ("above baseline", "below baseline", "failed", "best so far")
MEMORY_TRACES = ("measured peak", "predicted peak")


def predicted(workload: Workload, trial: Trial, constants: Constants | None) -> Any | None:
    """The model's prediction for the trial's configuration (None if Megatron would refuse it, or without
    constants: the job's calibration file cannot be read)."""
    if constants is None or violations(workload, trial.strategy):
        return None
    return predict(workload, trial.strategy, constants)


def trial_rows(trials: list[Trial], workload: Workload, constants: Constants | None, *, baseline_mfu: float | None,
               previous: Trial | None = None, best_so_far: float | None = None) -> list[dict[str, Any]]:
    """One row per trial: what changed from the previous trial (Megatron-LM flags), why, the metrics or the
    diagnosis, the best MFU so far, the model's predicted peak memory. `previous`/`best_so_far`: the state
    before the first of `trials` (for rows appended live)."""
    rows = []
    limit = workload.cluster.spec.memory_gib
    for t in trials:
        mfu = t.mfu if t.status is TrialStatus.OK else None
        if mfu is not None:
            best_so_far = mfu if best_so_far is None else max(best_so_far, mfu)
        prediction = predicted(workload, t, constants)
        rows.append({
            "index": t.index,
            "status": t.status.value,
            "strategy": t.strategy.short(),
            "changes": flag_changes(previous.strategy, t.strategy) if previous else [],
            "rationale": t.rationale,
            "mfu": mfu,
            "tflops_per_gpu": t.metrics.tflops_per_gpu if t.metrics and mfu is not None else None,
            "mem_max_gib": t.metrics.mem_max_gib if t.metrics else None,
            "mem_limit_gib": (t.metrics.mem_limit_gib if t.metrics and t.metrics.mem_limit_gib else limit),
            "predicted_mem_gib": prediction.mem_gib if prediction else None,
            "diagnosis": t.failure.described() if t.failure and t.status is not TrialStatus.OK else None,
            "category": t.failure.category.value if t.failure and t.status is not TrialStatus.OK else None,
            "best_so_far": best_so_far,
            "above_baseline": None if mfu is None or baseline_mfu is None else mfu >= baseline_mfu,
            "attempts": t.attempts,
        })
        previous = t
    return rows


def mfu_trace_of(row: dict[str, Any]) -> int:
    """Which MFU trace a trial's point belongs to (each trial is exactly one point)."""
    if row["mfu"] is None:
        return MFU_TRACES.index("failed")
    return MFU_TRACES.index("below baseline") if row["above_baseline"] is False else MFU_TRACES.index("above baseline")


def plotly_text(text: str) -> str:
    """`text` shown literally in a Plotly label: Plotly renders a subset of HTML in trace names and hover
    text (<a href>, <b>, <span style>), and a job name, a diagnosis or an LLM's rationale is not ours. Control,
    escape and bidi characters are shown as escapes, as on the pages (a U+202E reorders what follows it)."""
    text = terminal_text(text, one_line=True, max_chars=None)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _hover(row: dict[str, Any]) -> str:
    what = row["diagnosis"] or row["rationale"] or ""
    return f"#{row['index']} {plotly_text(row['strategy'])}<br>{plotly_text(what[:160])}"


def failure_floor(mfus: list[float | None], baseline_mfu: float | None) -> float:
    """Where failures sit on the MFU chart (in %), given the trials' measured MFUs (None for a failure):
    just below the lowest, so the axis keeps the measured spread readable instead of starting at 0."""
    measured = [100 * m for m in mfus if m is not None]
    if baseline_mfu is not None:
        measured.append(100 * baseline_mfu)
    return max(0.0, round(min(measured) - 3.0, 1)) if measured else 0.0


def baseline_marks(baseline_mfu: float | None) -> dict[str, list[dict[str, Any]]]:
    """The MFU chart's dashed baseline and its label (none without a baseline): its layout's `shapes`
    and `annotations`, also sent live when the baseline's trial ends after the page was opened."""
    if baseline_mfu is None:
        return {"shapes": [], "annotations": []}
    y = 100 * baseline_mfu
    return {"shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": y, "y1": y,
                        "line": {"dash": "dash", "color": "#57606a"}}],
            "annotations": [{"xref": "paper", "x": 1, "y": y, "text": "baseline", "showarrow": False,
                             "xanchor": "right", "yanchor": "bottom", "font": {"color": "#57606a"}}]}


def mfu_figure(rows: list[dict[str, Any]], baseline_mfu: float | None) -> dict[str, Any]:
    """MFU per trial: points above and below the baseline, × for failures (at the chart's floor, the diagnosis
    on hover), the baseline dashed, the best so far."""
    traces = [
        {"name": "above baseline", "mode": "markers", "marker": {"color": "#1a7f37", "size": 9}},
        {"name": "below baseline", "mode": "markers", "marker": {"color": "#d4a72c", "size": 9}},
        {"name": "failed", "mode": "markers", "marker": {"color": "#cf222e", "symbol": "x", "size": 11}},
        {"name": "best so far", "mode": "lines", "line": {"color": "#0969da", "shape": "hv"}},
    ]
    for trace in traces:
        trace.update(type="scatter", x=[], y=[], text=[], hoverinfo="text+y")
    floor = failure_floor([row["mfu"] for row in rows], baseline_mfu)
    for row in rows:
        trace = traces[mfu_trace_of(row)]
        trace["x"].append(row["index"])
        trace["y"].append(round(100 * row["mfu"], 3) if row["mfu"] is not None else floor)
        trace["text"].append(_hover(row))
        best = traces[3]
        best["x"].append(row["index"])
        best["y"].append(round(100 * row["best_so_far"], 3) if row["best_so_far"] is not None else None)
        best["text"].append("best so far")
    layout = {"xaxis": {"title": {"text": "trial"}, "dtick": 1 if len(rows) <= 30 else None},
              "yaxis": {"title": {"text": "MFU %"}}, **baseline_marks(baseline_mfu),
              "margin": {"t": 30, "r": 20, "b": 50, "l": 60}, "legend": {"orientation": "h", "y": 1.12}}
    return {"data": traces, "layout": layout}


PREDICTION_CAP = 1.25  # predictions far above the GPU are drawn at 1.25 × its memory (hover says the value)


def shown_prediction(gib: float | None, limit_gib: float) -> float | None:
    return None if gib is None else min(gib, PREDICTION_CAP * limit_gib)


def _predicted_text(gib: float | None) -> str:
    return "" if gib is None else f"predicted {gib:.1f} GiB"


def memory_figure(rows: list[dict[str, Any]], limit_gib: float) -> dict[str, Any]:
    """Peak memory per trial, measured and predicted, against the GPU's limit."""
    measured = {"name": "measured peak", "type": "scatter", "mode": "markers", "x": [], "y": [], "text": [],
                "marker": {"color": "#8250df", "size": 9}}
    model = {"name": "predicted peak", "type": "scatter", "mode": "markers", "x": [], "y": [], "text": [],
             "hoverinfo": "text", "marker": {"color": "#8250df", "size": 9, "symbol": "circle-open"}}
    for row in rows:
        measured["x"].append(row["index"])
        measured["y"].append(row["mem_max_gib"])
        measured["text"].append("")
        model["x"].append(row["index"])
        model["y"].append(shown_prediction(row["predicted_mem_gib"], limit_gib))
        model["text"].append(_predicted_text(row["predicted_mem_gib"]))
    layout = {"xaxis": {"title": {"text": "trial"}}, "yaxis": {"title": {"text": "GiB"}, "rangemode": "tozero"},
              "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": limit_gib, "y1": limit_gib,
                          "line": {"dash": "dash", "color": "#cf222e"}}],
              "annotations": [{"xref": "paper", "x": 1, "y": limit_gib, "text": f"GPU limit {limit_gib:.0f} GiB",
                               "showarrow": False, "xanchor": "right", "yanchor": "bottom",
                               "font": {"color": "#cf222e"}}],
              "margin": {"t": 30, "r": 20, "b": 50, "l": 60}, "legend": {"orientation": "h", "y": 1.12}}
    return {"data": [measured, model], "layout": layout}


def best_so_far(trials: list[Trial]) -> list[float | None]:
    out, best = [], None
    for t in trials:
        if t.status is TrialStatus.OK and t.mfu is not None:
            best = t.mfu if best is None else max(best, t.mfu)
        out.append(best)
    return out


def compare_figure(series: list[tuple[str, list[Trial]]]) -> dict[str, Any]:
    """Several jobs' best-so-far MFU per trial on one chart."""
    data = []
    for label, trials in series:
        values = best_so_far(trials)
        data.append({"type": "scatter", "mode": "lines+markers", "name": plotly_text(label), "line": {"shape": "hv"},
                     "x": [t.index for t in trials], "y": [None if v is None else round(100 * v, 3) for v in values]})
    layout = {"xaxis": {"title": {"text": "trial"}}, "yaxis": {"title": {"text": "best MFU so far %"}},
              "margin": {"t": 30, "r": 20, "b": 50, "l": 60}, "legend": {"orientation": "h", "y": 1.12}}
    return {"data": data, "layout": layout}


# Strategy fields shown as axes of the parallel-coordinates view when they vary within the job.
PARALLEL_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                   "context_parallel_size", "expert_model_parallel_size", "micro_batch_size", "recompute_granularity",
                   "sequence_parallel", "use_distributed_optimizer", "overlap_grad_reduce", "overlap_param_gather",
                   "cross_entropy_loss_fusion")


def parallel_figure(trials: list[Trial]) -> dict[str, Any]:
    """One line per trial across the knobs that vary, coloured by MFU (failures at 0)."""
    dims = []
    for field in PARALLEL_FIELDS:
        values = [getattr(t.strategy, field) for t in trials]
        if len({str(v) for v in values}) < 2:
            continue
        labels = sorted({str(v) for v in values}, key=lambda v: (len(v), v))
        dims.append({"label": field.replace("_model_parallel_size", "").replace("_", " "),
                     "values": [labels.index(str(v)) for v in values],
                     "tickvals": list(range(len(labels))), "ticktext": labels})
    mfu = [round(100 * t.mfu, 2) if t.status is TrialStatus.OK and t.mfu is not None else 0.0 for t in trials]
    dims.append({"label": "MFU %", "values": mfu})
    return {"data": [{"type": "parcoords", "dimensions": dims,
                      "line": {"color": mfu, "colorscale": "Viridis", "showscale": True}}],
            "layout": {"margin": {"t": 50, "r": 40, "b": 30, "l": 60}}}

"""Compare the model's predictions with measured runs (replay CSV files).

Per file and overall: fit/OOM classification accuracy, MFU median absolute
percentage error, peak-memory median APE, and the Spearman rank correlation of MFU
among rows of the same workload (the figure a tuner cares about: does the model
order configurations right; measured with the same software — a newer release of a recipe is
faster with no knob changed). Rows whose inputs are incomplete are skipped and counted with
their reason.

Rows read with unknown cells (`ReplayRow.unknown`: a micro-batch, a GPU count the source does
not give) are predicted for every plausible value; a figure is scored only where those
predictions agree (fit/OOM: the same verdict; MFU and memory: within 5 %), so a row informs
what it determines and nothing it does not.

Rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs in
deterministic mode, per the data README) are scored on memory and fit/OOM only: the model
predicts tuned throughput, and those rows would otherwise dominate every MFU figure.

Memory is compared like for like: a row whose memory header or notes say it measured torch's max
*allocated* memory is compared without the CUDA-context/NCCL overhead torch does
not see, and a row measured on the *last* rank against the last pipeline stage.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from scipy.stats import spearmanr

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import Prediction, predict
from optico.replay_csv import read_replay_csv, reason_kind
from optico.replay_format import ReplayRow
from optico.replay_measured import measured_mfu, software, tuned_throughput
from optico.replay_parse import variants


@dataclass
class RowResult:
    row: ReplayRow
    prediction: Prediction
    measured_mfu: float | None
    predicted_mem_gib: float


@dataclass
class Scores:
    """Figures for one file or for all: fractions, not percentages; None when nothing to score."""

    rows: int = 0
    skipped: int = 0
    partial: int = 0  # read with unknown cells: scored only on the figures they determine
    skip_reasons: dict[str, int] = field(default_factory=dict)
    oom_rows: int = 0
    oom_correct: int = 0
    mfu_unscored: int = 0  # ok rows whose times are not tuned throughput: memory and OOM only
    mfu_apes: list[float] = field(default_factory=list)
    mem_apes: list[float] = field(default_factory=list)
    groups: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))

    def spearman(self) -> float | None:
        """Mean rank correlation over workloads with at least 3 measured configurations, weighted by size."""
        total, weight = 0.0, 0
        for pairs in self.groups.values():
            if len(pairs) < 3 or len({m for m, _ in pairs}) < 2 or len({p for _, p in pairs}) < 2:
                continue
            rho = spearmanr([m for m, _ in pairs], [p for _, p in pairs]).statistic
            total += rho * len(pairs)
            weight += len(pairs)
        return total / weight if weight else None

    def as_dict(self) -> dict[str, Any]:
        """The six figures of `optico perfmodel evaluate --json`."""
        rho = self.spearman()
        return {
            "rows": self.rows, "skipped": self.skipped, "read": self.rows - self.skipped,
            "read_share": (self.rows - self.skipped) / self.rows if self.rows else None,
            "oom_accuracy": self.oom_correct / self.oom_rows if self.oom_rows else None,
            "mfu_median_ape": float(median(self.mfu_apes)) if self.mfu_apes else None,
            "mem_median_ape": float(median(self.mem_apes)) if self.mem_apes else None,
            "spearman": float(rho) if rho is not None else None,
        }

    def details(self) -> dict[str, Any]:
        """How many rows each figure rests on, and why rows were skipped."""
        return {"scored": {"oom": self.oom_rows, "mfu": len(self.mfu_apes), "mem": len(self.mem_apes)},
                "read_with_unknown_cells": self.partial,
                "mfu_unscored_not_tuned": self.mfu_unscored,
                "skip_reasons": dict(Counter(self.skip_reasons).most_common())}

    def merge(self, other: "Scores", prefix: str) -> None:
        self.rows += other.rows
        self.skipped += other.skipped
        self.partial += other.partial
        for k, v in other.skip_reasons.items():
            self.skip_reasons[k] = self.skip_reasons.get(k, 0) + v
        self.oom_rows += other.oom_rows
        self.oom_correct += other.oom_correct
        self.mfu_unscored += other.mfu_unscored
        self.mfu_apes += other.mfu_apes
        self.mem_apes += other.mem_apes
        for key, pairs in other.groups.items():
            self.groups[f"{prefix}/{key}"] += pairs


def _memory_as_measured(row: ReplayRow, pred: Prediction) -> float:
    notes = f"{row.notes} {row.source}".lower()
    mem = pred.memory
    total = mem.stage_totals_gib[-1] if "last rank" in notes and mem.stage_totals_gib else mem.total_gib
    allocated = row.memory_measure == "allocated" or (not row.memory_measure and "allocated" in notes
                                                       and "reserved" not in notes)
    if allocated:
        total -= mem.overhead_gib
    return total


# A figure of a row with unknown cells is scored only when all their plausible values agree on it
# within this relative spread (the row then says something whatever the unknown was).
AGREE = 0.05


def _agreed(values: list[float]) -> float | None:
    """The middle value when `values` agree within AGREE, else None."""
    if not values:
        return None
    lo, hi = min(values), max(values)
    if lo <= 0 or hi / lo - 1.0 > AGREE:
        return None
    return sorted(values)[len(values) // 2]


@dataclass
class RowFigures:
    """What one read row can be scored on: each None where the row does not determine it."""

    fits: bool | None  # the prediction's fit verdict (None: it depends on an unknown cell)
    predicted_mfu: float | None
    measured_mfu: float | None
    predicted_mem_gib: float | None
    key: str  # the workload, for the rank correlation
    stated: Prediction | None  # the prediction of the row as it reads, when it has no unknown cell


def row_figures(row: ReplayRow, c: Constants) -> RowFigures:
    """Predictions for every `variant` of the row, reduced to the figures the row determines."""
    pairs = variants(row)
    preds = [(w, s, predict(w, s, c)) for w, s in pairs]
    verdicts = {p.fits for _, _, p in preds}
    fits = verdicts.pop() if len(verdicts) == 1 else None
    pred_mfu = meas_mfu = mem = None
    if row.result == "ok" and tuned_throughput(row):
        measured = [measured_mfu(row, w, s) for w, s, _ in preds]
        if measured and all(m is not None for m in measured):
            meas_mfu, pred_mfu = _agreed(measured), _agreed([p.mfu for _, _, p in preds])
            if meas_mfu is None or pred_mfu is None:
                meas_mfu = pred_mfu = None
    if row.result == "ok" and row.mem_max_gib:
        mem = _agreed([_memory_as_measured(row, p) for _, _, p in preds])
    # Configurations are ranked against others of the same workload measured with the same software.
    key = f"{row.workload.key()}|{software(row)}" if not row.unknown else f"{row.where}"
    stated = preds[0][2] if not row.unknown and preds else None
    return RowFigures(fits, pred_mfu, meas_mfu, mem, key, stated)


# The columns of `row_record` (`optico perfmodel evaluate --rows`); errors are (predicted − measured)
# / measured: below 0, the model predicts less than was measured.
ROW_COLUMNS: tuple[str, ...] = ("file", "line", "model", "result", "skip_reason", "unknown_cells", "predicted_fits",
                                "measured_mfu", "predicted_mfu", "mfu_error", "measured_mem_gib",
                                "predicted_mem_gib", "mem_error")


def _relative_error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else round((predicted - measured) / measured, 4)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def row_record(row: ReplayRow, figures: RowFigures | None) -> dict[str, Any]:
    """One row's predictions beside its measurements, as `score_rows` scores them: a figure the row
    does not determine (it depends on an unknown cell, the row did not run, its times are not tuned
    throughput) is None, and so is every figure of a skipped row (`figures` None)."""
    record: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    record.update(file=row.file, line=row.line, model=row.model_name, result=row.result,
                  skip_reason=row.skip_reason or "", unknown_cells=" ".join(row.unknown))
    if figures is not None:
        mem_measured = row.mem_max_gib if figures.predicted_mem_gib is not None else None
        record.update(predicted_fits=figures.fits, measured_mfu=_rounded(figures.measured_mfu),
                      predicted_mfu=_rounded(figures.predicted_mfu),
                      mfu_error=_relative_error(figures.predicted_mfu, figures.measured_mfu),
                      measured_mem_gib=_rounded(mem_measured),
                      predicted_mem_gib=_rounded(figures.predicted_mem_gib),
                      mem_error=_relative_error(figures.predicted_mem_gib, mem_measured))
    return record


def _readable(row: ReplayRow) -> bool:
    return row.read and row.workload is not None and row.strategy is not None


def score_rows(rows: list[ReplayRow], c: Constants, on_row: Callable[[], None] | None = None,
               records: list[dict[str, Any]] | None = None) -> tuple[Scores, list[RowResult]]:
    """Scores of `rows` at constants `c`; `on_row` is called after each row (a progress bar: a row
    with unknown cells is predicted once per plausible variant, up to 64, ~1 ms each). With `records`,
    each row's `row_record` is appended to it from the same predictions."""
    scores, results = Scores(rows=len(rows)), []
    for row in rows:
        if on_row is not None:
            on_row()
        if not _readable(row):
            scores.skipped += 1
            key = reason_kind(row.skip_reason or "incomplete")
            scores.skip_reasons[key] = scores.skip_reasons.get(key, 0) + 1
            if records is not None:
                records.append(row_record(row, None))
            continue
        figures = row_figures(row, c)
        if records is not None:
            records.append(row_record(row, figures))
        if row.unknown:
            scores.partial += 1
        if row.result == "ok" and not tuned_throughput(row):
            scores.mfu_unscored += 1
        if row.usable and figures.stated is not None:
            results.append(RowResult(row, figures.stated, figures.measured_mfu,
                                     _memory_as_measured(row, figures.stated)))
        if row.result in ("ok", "oom") and figures.fits is not None:
            scores.oom_rows += 1
            scores.oom_correct += int(figures.fits == (row.result == "ok"))
        if figures.measured_mfu:
            scores.mfu_apes.append(abs(figures.predicted_mfu - figures.measured_mfu) / figures.measured_mfu)
            scores.groups[figures.key].append((figures.measured_mfu, figures.predicted_mfu))
        if figures.predicted_mem_gib is not None:
            scores.mem_apes.append(abs(figures.predicted_mem_gib - row.mem_max_gib) / row.mem_max_gib)
    return scores, results


def evaluate_files(paths: list[str | Path], constants: Constants | None = None, *, strict: bool = False
                   ) -> dict[str, Any]:
    """`{"files": {NAME: {...}}, "overall": {...}, "details": {NAME: ...}}`; figures are fractions."""
    return evaluate_tables([(Path(path).name, read_replay_csv(path, strict=strict)) for path in paths], constants)


def evaluate_tables(tables: list[tuple[str, list[ReplayRow]]], constants: Constants | None = None,
                    on_row: Callable[[], None] | None = None, records: list[dict[str, Any]] | None = None
                    ) -> dict[str, Any]:
    """`evaluate_files` on rows already read: (file name, its rows) per file; `on_row` and `records`
    as in `score_rows`."""
    c = constants or load_constants()
    overall, files, details = Scores(), {}, {}
    for name, rows in tables:
        scores, _ = score_rows(rows, c, on_row, records)
        files[name] = scores.as_dict()
        details[name] = scores.details()
        overall.merge(scores, name)
    details["overall"] = overall.details()
    return {"files": files, "overall": overall.as_dict(), "details": details}

"""Compare the model's predictions with measured runs (replay CSV files).

Per file and overall: fit/OOM classification accuracy, MFU median absolute
percentage error, peak-memory median APE, and the Spearman rank correlation of MFU
among rows of the same workload (the figure a tuner cares about: does the model
order configurations right). Rows whose inputs are incomplete are skipped and
counted with their reason.

Rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs in
deterministic mode, per the data README) are scored on memory and fit/OOM only: the model
predicts tuned throughput, and those rows would otherwise dominate every MFU figure.

Memory is compared like for like: a row whose notes say it measured torch's max
*allocated* memory is compared without the CUDA-context/NCCL overhead torch does
not see, and a row measured on the *last* rank against the last pipeline stage.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from scipy.stats import spearmanr

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import Prediction, predict
from optico.replay_csv import ReplayRow, measured_mfu, read_replay_csv, tuned_throughput


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
            "rows": self.rows, "skipped": self.skipped,
            "oom_accuracy": self.oom_correct / self.oom_rows if self.oom_rows else None,
            "mfu_median_ape": float(median(self.mfu_apes)) if self.mfu_apes else None,
            "mem_median_ape": float(median(self.mem_apes)) if self.mem_apes else None,
            "spearman": float(rho) if rho is not None else None,
        }

    def details(self) -> dict[str, Any]:
        """How many rows each figure rests on, and why rows were skipped."""
        return {"scored": {"oom": self.oom_rows, "mfu": len(self.mfu_apes), "mem": len(self.mem_apes)},
                "mfu_unscored_not_tuned": self.mfu_unscored,
                "skip_reasons": dict(Counter(self.skip_reasons).most_common())}

    def merge(self, other: "Scores", prefix: str) -> None:
        self.rows += other.rows
        self.skipped += other.skipped
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
    if "allocated" in notes and "reserved" not in notes:
        total -= mem.overhead_gib
    return total


def _reason_key(reason: str) -> str:
    """Groups skip reasons by their first clause, so counts stay readable."""
    return reason.split(";")[0].split(":")[0].strip()


def score_rows(rows: list[ReplayRow], c: Constants) -> tuple[Scores, list[RowResult]]:
    scores, results = Scores(rows=len(rows)), []
    for row in rows:
        if row.skip_reason or row.workload is None or row.strategy is None:
            scores.skipped += 1
            key = _reason_key(row.skip_reason or "incomplete")
            scores.skip_reasons[key] = scores.skip_reasons.get(key, 0) + 1
            continue
        pred = predict(row.workload, row.strategy, c)
        mfu = None
        if row.result == "ok":
            if tuned_throughput(row):
                mfu = measured_mfu(row)
            else:
                scores.mfu_unscored += 1
        mem = _memory_as_measured(row, pred)
        results.append(RowResult(row, pred, mfu, mem))
        if row.result in ("ok", "oom"):
            scores.oom_rows += 1
            scores.oom_correct += int(pred.fits == (row.result == "ok"))
        if mfu:
            scores.mfu_apes.append(abs(pred.mfu - mfu) / mfu)
            scores.groups[row.workload.key()].append((mfu, pred.mfu))
        if row.result == "ok" and row.mem_max_gib:
            scores.mem_apes.append(abs(mem - row.mem_max_gib) / row.mem_max_gib)
    return scores, results


def evaluate_files(paths: list[str | Path], constants: Constants | None = None) -> dict[str, Any]:
    """`{"files": {NAME: {...}}, "overall": {...}, "details": {NAME: ...}}`; figures are fractions."""
    c = constants or load_constants()
    overall, files, details = Scores(), {}, {}
    for path in paths:
        rows = read_replay_csv(path)
        scores, _ = score_rows(rows, c)
        name = Path(path).name
        files[name] = scores.as_dict()
        details[name] = scores.details()
        overall.merge(scores, name)
    details["overall"] = overall.details()
    return {"files": files, "overall": overall.as_dict(), "details": details}

"""Fit the performance model's free constants to measured runs.

Least squares (scipy, bounded by each constant's declared range) over three kinds of
residual, each file weighted equally so one large table cannot drown the others:
log(predicted / measured MFU), log(predicted / measured peak memory), and for the
fit/OOM outcome a hinge on the wrong side of the memory limit. MFU residuals skip
rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs in
deterministic mode); those rows still inform memory.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.evaluate import _memory_as_measured, evaluate_files
from optico.perfmodel.model import predict
from optico.replay_csv import ReplayRow, measured_mfu, read_replay_csv

MEM_WEIGHT = 0.7
OOM_WEIGHT = 6.0  # a wrong fit/OOM call costs a whole trial, or hides the optimum


def _untuned(row: ReplayRow) -> bool:
    return "not tuned" in row.notes.lower()


def _usable(paths: list[str | Path]) -> list[tuple[str, ReplayRow, float | None]]:
    out = []
    for path in paths:
        for row in read_replay_csv(path):
            if row.skip_reason or row.workload is None or row.strategy is None:
                continue
            mfu = measured_mfu(row) if row.result == "ok" and not _untuned(row) else None
            out.append((Path(path).name, row, mfu))
    return out


def _residuals(c: Constants, rows: list[tuple[str, ReplayRow, float | None]],
               weights: dict[str, float]) -> np.ndarray:
    res = []
    for name, row, mfu in rows:
        w = weights[name]
        pred = predict(row.workload, row.strategy, c)
        limit = pred.memory.limit_gib
        if mfu:
            res.append(w * math.log(pred.mfu / mfu))
        if row.result == "ok" and row.mem_max_gib:
            res.append(w * MEM_WEIGHT * math.log(_memory_as_measured(row, pred) / row.mem_max_gib))
        needed = pred.memory.needed_gib
        if row.result == "oom":
            res.append(w * OOM_WEIGHT * max(0.0, math.log(limit / needed)))
        elif row.result == "ok":
            res.append(w * OOM_WEIGHT * max(0.0, math.log(needed / limit)))
    return np.array(res)


@dataclass
class Calibration:
    constants: Constants
    before: dict[str, Any]
    after: dict[str, Any]
    fields: list[str]
    cost_before: float
    cost_after: float


def calibrate(paths: list[str | Path], start: Constants | None = None, fields: list[str] | None = None,
              max_nfev: int = 40, file_weights: dict[str, float] | None = None) -> Calibration:
    """Fits `fields` (default: every free constant) to the rows of `paths`; reports evaluate before/after.

    `file_weights` multiplies the weight of the named files (by file name)."""
    start = start or load_constants()
    bounds = Constants.free_fields()
    fields = fields or list(bounds)
    unknown = set(fields) - set(bounds)
    if unknown:
        raise KeyError(f"not calibratable: {', '.join(sorted(unknown))}; known: {', '.join(bounds)}")
    rows = _usable(paths)
    if not rows:
        raise ValueError("no usable rows in the given files")
    counts = Counter(name for name, _, _ in rows)
    weights = {name: (file_weights or {}).get(name, 1.0) / math.sqrt(n) for name, n in counts.items()}
    base = start.model_dump()

    def constants_at(x: np.ndarray) -> Constants:
        return Constants.model_validate({**base, **dict(zip(fields, map(float, x)))})

    def fun(x: np.ndarray) -> np.ndarray:
        return _residuals(constants_at(x), rows, weights)

    x0 = np.array([base[f] for f in fields])
    lo = np.array([bounds[f][0] for f in fields])
    hi = np.array([bounds[f][1] for f in fields])
    r0 = fun(x0)
    fit = least_squares(fun, np.clip(x0, lo, hi), bounds=(lo, hi), max_nfev=max_nfev, diff_step=1e-3)
    fitted = constants_at(fit.x)
    return Calibration(constants=fitted, before=evaluate_files(paths, start), after=evaluate_files(paths, fitted),
                       fields=fields, cost_before=float(0.5 * (r0 @ r0)), cost_after=float(fit.cost))

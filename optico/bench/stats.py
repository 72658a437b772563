"""Statistics over benchmark runs: means with bootstrap intervals, paired differences, ECDFs.

A *run* is one tuner on one landscape with one seed. Runs of a group of landscapes are summarised
by their mean; every landscape has the same number of seeds, so each weighs the same. Intervals are
two-stage percentile bootstraps: the landscapes of the group are resampled, then the seeds within
each landscape drawn. The question the figures answer is how a tuner does on landscapes *of this
kind* — the next workload, not only the four or five drawn here — so the spread between landscapes
is part of the interval; with a handful of landscapes that spread, not the seeds, sets its width.
(Until 2026-11-26 only the seeds were resampled: an interval for these landscapes alone, which
two draws of the same family could both exclude.) Paired comparisons pair the runs of two tuners on
the same landscape and seed (the same hidden landscape, the same run noise).

No figure here is a median of censored values: "trials to 98 %" is shown as the share of runs that
got there by each trial (an ECDF), never as a median with "never" counted as budget + 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

N_BOOT = 2000
LEVEL = 0.95


def _strata(values: Sequence[float], strata: Sequence[Any] | None) -> list[np.ndarray]:
    v = np.asarray(values, dtype=float)
    if strata is None:
        return [np.arange(len(v))]
    keys = list(dict.fromkeys(strata))
    labels = np.array([keys.index(s) for s in strata])
    return [np.flatnonzero(labels == k) for k in range(len(keys))]


def bootstrap_mean(values: Sequence[float], strata: Sequence[Any] | None = None, n_boot: int = N_BOOT,
                   seed: int = 0, resample_strata: bool = True) -> dict[str, float | None]:
    """{"mean", "lo", "hi", "n"}: the mean and a percentile bootstrap interval. With `strata`
    (landscapes), each replicate draws the strata with replacement and then the values within each
    drawn stratum, and weighs a stratum by its size; `resample_strata=False` keeps every stratum
    once (an interval for these strata only)."""
    v = np.asarray(values, dtype=float)
    if not len(v):
        return {"mean": None, "lo": None, "hi": None, "n": 0}
    groups = _strata(v, strata)
    rng = np.random.default_rng(seed)
    sizes = np.array([len(g) for g in groups], dtype=float)
    # n_boot x strata: each stratum's mean under a resampling of its own values
    within = np.stack([v[g][rng.integers(0, len(g), size=(n_boot, len(g)))].mean(axis=1) for g in groups], axis=1)
    if resample_strata and len(groups) > 1:
        drawn = rng.integers(0, len(groups), size=(n_boot, len(groups)))
        boots = (np.take_along_axis(within, drawn, axis=1) * sizes[drawn]).sum(axis=1) / sizes[drawn].sum(axis=1)
    else:
        boots = within @ (sizes / sizes.sum())
    alpha = (1 - LEVEL) / 2
    return {"mean": float(v.mean()), "lo": float(np.quantile(boots, alpha)),
            "hi": float(np.quantile(boots, 1 - alpha)), "n": int(len(v))}


def paired_difference(a: Sequence[float], b: Sequence[float], strata: Sequence[Any] | None = None,
                      seed: int = 0) -> dict[str, float | None]:
    """Mean of a - b over paired runs with its bootstrap interval, the Wilcoxon signed-rank p-value
    over runs (two-sided; 1.0 when every difference is zero), the share of pairs where a > b / a < b
    and, with `strata`, on how many strata (landscapes) a is ahead / behind on average."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    out = bootstrap_mean(d, strata, seed=seed)
    if not len(d):
        return {**out, "p": None, "wins": None, "losses": None, "strata_ahead": None, "strata_behind": None}
    per_stratum = np.array([d[g].mean() for g in _strata(d, strata)])
    out |= {"strata_ahead": int((per_stratum > 1e-12).sum()), "strata_behind": int((per_stratum < -1e-12).sum()),
            "strata": len(per_stratum)}
    nonzero = d[np.abs(d) > 1e-12]
    p = 1.0
    if len(nonzero) >= 1:
        from scipy.stats import wilcoxon

        p = float(wilcoxon(nonzero).pvalue) if len(nonzero) > 1 else 1.0
    return {**out, "p": p, "wins": float(np.mean(d > 1e-12)), "losses": float(np.mean(d < -1e-12))}


def ecdf(first_reaching: Sequence[int | None], budget: int) -> list[float]:
    """share[k-1] = share of runs that reached the threshold within k trials, k = 1..budget
    (`first_reaching` is the trial that got there, None or > budget for never)."""
    n = len(first_reaching)
    if not n:
        return []
    hits = np.array([k if k is not None and k <= budget else budget + 1 for k in first_reaching])
    return [float(np.mean(hits <= k)) for k in range(1, budget + 1)]


def auc(curve: Sequence[float]) -> float:
    """Area under the best-so-far curve, normalised: the mean of best-so-far over trials 1..budget
    (1.0 = the optimum from the first trial on)."""
    return float(np.mean(curve)) if len(curve) else 0.0


def best_within(curve_by_cost: Sequence[tuple[float, float]], cost: float) -> float:
    """The best-so-far value once at most `cost` has been spent; `curve_by_cost` is (cumulative cost
    after a launch, best so far then), in launch order."""
    best = 0.0
    for spent, value in curve_by_cost:
        if spent > cost + 1e-12:
            break
        best = value
    return best

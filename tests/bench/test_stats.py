"""The benchmark's statistics: bootstrap means, paired differences, ECDF, AUC, equal-cost views."""

from __future__ import annotations

import numpy as np
import pytest

from optico.bench.stats import auc, best_within, bootstrap_mean, ecdf, paired_difference


def test_bootstrap_mean_interval_covers_and_collapses():
    rng = np.random.default_rng(0)
    x = rng.normal(0.9, 0.05, size=200)
    out = bootstrap_mean(x)
    assert out["lo"] < out["mean"] < out["hi"] and out["n"] == 200
    assert out["hi"] - out["lo"] == pytest.approx(2 * 1.96 * 0.05 / np.sqrt(200), rel=0.3)
    same = bootstrap_mean([0.5] * 10)
    assert same["lo"] == same["mean"] == same["hi"] == 0.5
    assert bootstrap_mean([])["mean"] is None


def test_strata_keep_their_weight():
    # Two landscapes, equal seeds, no spread within either: kept once each, the interval is the mean of
    # the landscape means; resampled (the default), it spans what another draw of landscapes could give.
    values = [1.0] * 5 + [0.0] * 5
    strata = ["a"] * 5 + ["b"] * 5
    fixed = bootstrap_mean(values, strata, resample_strata=False)
    assert fixed["lo"] == fixed["hi"] == pytest.approx(0.5)
    out = bootstrap_mean(values, strata)
    assert out["mean"] == pytest.approx(0.5) and out["lo"] == 0.0 and out["hi"] == 1.0


def test_interval_for_new_landscapes_is_wider_than_for_these():
    # Four landscapes whose means differ by much more than their seeds do.
    rng = np.random.default_rng(1)
    values = np.concatenate([m + rng.normal(0, 0.002, 20) for m in (0.90, 0.95, 0.97, 0.99)])
    strata = np.repeat(["a", "b", "c", "d"], 20).tolist()
    these = bootstrap_mean(values, strata, resample_strata=False)
    new = bootstrap_mean(values, strata)
    assert these["hi"] - these["lo"] < 0.005
    assert new["hi"] - new["lo"] > 0.03 and new["lo"] < 0.93 < 0.97 < new["hi"]


def test_paired_difference_counts_landscapes_ahead_and_behind():
    a = [1.0] * 6 + [0.5] * 3
    b = [0.9] * 3 + [1.0] * 3 + [0.5] * 3
    d = paired_difference(a, b, ["x"] * 3 + ["y"] * 3 + ["z"] * 3)
    assert (d["strata_ahead"], d["strata_behind"], d["strata"]) == (1, 0, 3)


def test_paired_difference_sign_and_test():
    a = [0.99, 0.98, 1.0, 0.97, 0.99, 1.0, 0.98, 0.99]
    b = [v - 0.02 for v in a]
    d = paired_difference(a, b)
    assert d["mean"] == pytest.approx(0.02) and d["lo"] > 0 and d["wins"] == 1.0 and d["p"] < 0.05
    tie = paired_difference(a, a)
    assert tie["mean"] == 0 and tie["p"] == 1.0 and tie["wins"] == tie["losses"] == 0


def test_ecdf_auc_and_equal_cost():
    assert ecdf([1, 3, None, 25], budget=4) == [0.25, 0.25, 0.5, 0.5]
    assert auc([0.5, 1.0]) == pytest.approx(0.75)
    curve = [(1.0, 0.8), (3.0, 0.9), (3.5, 1.0)]
    assert best_within(curve, 0.5) == 0.0
    assert best_within(curve, 3.0) == 0.9
    assert best_within(curve, 10.0) == 1.0

"""The clairvoyant ceiling, and simulated landscapes that stay within the GPU's peak."""

from __future__ import annotations

import numpy as np
import pytest

from optico.bench.ceiling import clairvoyant_ceiling
from optico.bench.landscapes import MAX_OPTIMUM_MFU, PACKAGED_REPLAY, _rng, replay_defs
from optico.bench.report import markdown
from optico.bench.suite import run_benchmark
from tests.bench.conftest import tiny_sim


def test_a_step_factor_is_its_shared_effects_times_its_own_terms():
    landscape = tiny_sim(0.1).build()
    launcher = landscape.make_launcher()
    for s in landscape.candidates:
        assert launcher.factor(s) == pytest.approx(np.exp(launcher.shared_log_factor(s) + launcher.own_log_factor(s)))
    # Without out-of-form effects a configuration's own term is a shortfall only: never a gain.
    plain = tiny_sim().build().make_launcher()
    assert all(plain.own_log_factor(s) >= 0 for s in landscape.candidates)


def test_fresh_own_terms_are_drawn_like_the_landscape_s():
    landscape = tiny_sim(0.2).build()
    launcher = landscape.make_launcher()
    realized = np.array([launcher.own_log_factor(s) for s in landscape.candidates])
    drawn = launcher.draw_own_log_factors(np.random.default_rng(0), (20_000,))
    # ~40 realized terms against many draws: the spread is the residual's (0.2 * sqrt(0.5) = 0.14).
    assert drawn.std() == pytest.approx(0.2 * np.sqrt(0.5), rel=0.1)
    assert 0.6 < realized.std() / drawn.std() < 1.4
    assert abs(realized.mean() - drawn.mean()) < 3 * drawn.std() / np.sqrt(len(realized))


def test_the_ceiling_falls_as_the_effects_no_model_expresses_grow():
    # The tiny space has 28 configurations that fit: within 1 and 3 launches, not 10 and 20.
    ceilings = [clairvoyant_ceiling(tiny_sim(size).build(), budgets=(1, 3)) for size in (0.0, 0.05, 0.3)]
    for c in ceilings:
        assert 0 < c["best_at_1"] <= c["best_at_3"] <= 1
        assert 0 <= c["reached_98_at_1"] <= c["reached_98_at_3"] <= 1
    plain, small, large = ceilings
    assert plain["best_at_1"] > 0.98  # only small one-sided shortfalls: the clairvoyant all but has the optimum
    assert large["best_at_1"] < small["best_at_1"] and large["reached_98_at_3"] < small["reached_98_at_3"]


def test_the_clairvoyant_order_beats_the_tuner_side_model_s_order():
    """Its choice maximises the expected best of k; the untrained model's top k, under the same draws
    of the own terms, can only do as well or worse."""
    landscape = tiny_sim(0.2).build()
    launcher, model = landscape.make_launcher(), landscape.job_model()
    fitting = [s for s in landscape.candidates if landscape.true_mfu(s) is not None]
    before_own = np.array([landscape.true_mfu(s) * np.exp(launcher.own_log_factor(s)) for s in fitting])
    mfu = before_own * np.exp(-launcher.draw_own_log_factors(_rng("ceiling", landscape.name), (400, len(fitting))))
    by_model = np.argsort([-model.mfu(s) for s in fitting], kind="stable")
    ks = (1, 2, 3, 4, 5)
    model_best = [float((mfu[:, by_model[:k]].max(axis=1) / mfu.max(axis=1)).mean()) for k in ks]
    ceiling = clairvoyant_ceiling(landscape, budgets=ks)
    gaps = [ceiling[f"best_at_{k}"] - m for k, m in zip(ks, model_best)]
    assert min(gaps) >= 0 and max(gaps) > 0.01, gaps


def test_measured_tables_have_no_ceiling():
    assert clairvoyant_ceiling(replay_defs(PACKAGED_REPLAY)[0].build()) is None


def test_no_simulated_configuration_runs_past_the_gpu_s_peak():
    """Two-sided effects of the largest size --sweep accepts would put configurations far above 100 %
    MFU; the landscape is slowed uniformly so its optimum is MAX_OPTIMUM_MFU."""
    landscape = tiny_sim(1.0).build()
    assert landscape.noise["slowdown"] > 0
    assert landscape.optimum_mfu == pytest.approx(MAX_OPTIMUM_MFU)
    assert max(t.mfu for t in landscape.truth.values() if t.mfu is not None) <= MAX_OPTIMUM_MFU + 1e-12
    assert tiny_sim(0.1).build().noise["slowdown"] == 0  # the default size is left as drawn here


def test_the_report_sets_the_goals_against_the_ceiling():
    doc = run_benchmark([tiny_sim(0.1)], ("optico", "model-greedy"), budget=6, seeds=1, jobs=1, fidelity=True)
    ceiling = doc["groups"]["out-of-form"]["ceiling"]
    assert ceiling["landscapes"] == ceiling["of"] == 1
    text = markdown(doc)
    assert "Clairvoyant ceiling" in text and f"best @10 {100 * ceiling['best_at_10']:.1f}" in text
    assert f"a clairvoyant tuner's expected ceiling on these landscapes: {100 * ceiling['best_at_10']:.1f} %" in text


def _group(optico_at_10: float, baseline_at_10: float, ceiling: dict | None) -> dict:
    figures = lambda at_10: {"best_at": {"10": {"mean": at_10}}, "reached_98": {"mean": 0.5},  # noqa: E731
                             "failed_launches": 0.03}
    return {"tuners": {"optico": figures(optico_at_10), "model-greedy": figures(baseline_at_10)},
            "strongest": "model-greedy", "ceiling": ceiling,
            "paired": {"optico": {"model-greedy": {"best_at_10": {"mean": optico_at_10 - baseline_at_10,
                                                                  "lo": -0.01, "hi": 0.01}}}}}


def test_goals_say_when_a_target_is_past_what_any_tuner_can_reach():
    from optico.bench.summary import goals

    doc = {"meta": {"budget": 20}, "groups": {
        "independent": _group(0.995, 0.996, None),
        "out-of-form": _group(0.93, 0.91, {"best_at_10": 0.983, "reached_98_at_20": 0.85})}}
    said = {(g["group"], g["goal"][:12]): g.get("detail") for g in goals(doc)}
    assert said[("independent", "OptiCo - str")] == "model-greedy is at 99.6 %: 1 pt more is past the optimum"
    assert said[("out-of-form", "OptiCo - str")] == ""  # 92 % + 1 pt is below the optimum: no such remark
    assert said[("out-of-form", "OptiCo mean ")].endswith("ceiling on these landscapes: 98.3 %")
    assert said[("out-of-form", ">= 90 % of O")].endswith("ceiling on these landscapes: 85.0 %")
    assert not said[("independent", "OptiCo mean ")]  # no ceiling without the split

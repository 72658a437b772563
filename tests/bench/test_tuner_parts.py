"""The tuner's parts added for issue 13: the residual model, the acquisition, the stopping rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optico.agents import acquisition
from optico.perfmodel.residual import ResidualGP, ResidualPrior


def test_residual_gp_learns_offset_main_effect_and_keeps_uncertainty():
    gp = ResidualGP(3, ResidualPrior(offset=0.1, main=0.05, pair=0.03, config=0.02, noise=0.005))
    X = np.array([[0, 0, 0], [1, 0, 0]])
    y = np.array([0.10, 0.10])
    gp.fit(X, y)
    mean, sd = gp.predict(np.array([[0, 0, 0], [0, 1, 1], [2, 2, 2]]))
    assert mean[0] == pytest.approx(0.10, abs=0.01) and sd[0] < 0.01  # measured: follows the run
    assert 0.0 < mean[2] < mean[1] < 0.10  # shares fewer values: moved less
    assert sd[2] > sd[1] > sd[0]  # and less certain
    prior_mean, prior_sd = ResidualGP(3).predict(np.array([[0, 0, 0]]))
    assert prior_mean[0] == 0 and prior_sd[0] == pytest.approx(ResidualPrior().total)


def test_expected_improvement_matches_monte_carlo():
    rng = np.random.default_rng(1)
    mu, sd, best = math.log(0.5), 0.08, 0.52
    samples = np.exp(rng.normal(mu, sd, 400_000))
    assert acquisition.expected_improvement(mu, sd, best) == pytest.approx(np.maximum(samples - best, 0).mean(),
                                                                            rel=0.02)
    assert acquisition.expected_improvement(mu, 0.0, 0.4) == pytest.approx(0.1)
    assert acquisition.expected_improvement(mu, sd, 0.0) == pytest.approx(samples.mean(), rel=0.01)


def test_policy_switch_is_scoped():
    assert acquisition.POLICY.uncertainty
    with acquisition.switched(uncertainty=False):
        assert not acquisition.POLICY.uncertainty
    assert acquisition.POLICY.uncertainty

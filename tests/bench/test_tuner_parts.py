"""The tuner's parts added for issue 13: the residual model, the acquisition, the stopping rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from optico.agents import acquisition
from optico.perfmodel.online import Belief
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


def _random_configs(rng: np.random.Generator, n: int, fields: int = 5, values: int = 3) -> np.ndarray:
    return np.unique(rng.integers(0, values, size=(n * 3, fields)), axis=0)[:n]


@pytest.mark.parametrize("true_sd, expect", [(0.25, "wider"), (0.005, "narrower")])
def test_residual_gp_scales_its_prior_to_the_errors_it_sees(true_sd, expect):
    """Errors far larger than the prior assumed keep a wide posterior at untried configurations (the
    job goes on exploring); errors far smaller let it shrink. Below ADAPT_FROM points it keeps the prior."""
    from optico.perfmodel import residual

    rng = np.random.default_rng(7)
    X = _random_configs(rng, 12)
    y = rng.normal(0.0, true_sd, len(X))  # per-configuration errors: no structure to learn
    prior = ResidualPrior()
    gp = ResidualGP(5, prior).fit(X, y)
    fixed = ResidualGP(5, prior, adapt=False).fit(X, y)
    untried = np.array([[9, 9, 9, 9, 9]])
    sd, fixed_sd = gp.predict(untried)[1][0], fixed.predict(untried)[1][0]
    assert fixed.scale == (1.0, 1.0) and fixed_sd < prior.total  # the offset is learnt even from noise
    if expect == "wider":
        assert gp.scale[1] > 1.0 and sd > 1.4 * fixed_sd  # the rough part: no structure
    else:
        assert max(gp.scale) < 1.0 and sd < 0.8 * fixed_sd
    few = ResidualGP(5, prior).fit(X[: residual.ADAPT_FROM - 1], y[: residual.ADAPT_FROM - 1])
    assert few.scale == (1.0, 1.0)


def test_residual_gp_averages_over_its_prior_factors():
    """The prediction is the mixture of the GPs under every pair of factors, each weighted by marginal
    likelihood times the hyperprior (computed here independently, with scipy), moment-matched; it is
    never narrower than the most likely pair's at an untried configuration."""
    from scipy.stats import multivariate_normal

    from optico.perfmodel import residual

    rng = np.random.default_rng(3)
    X = _random_configs(rng, 8)
    y = rng.normal(0.05, 0.08, len(X))
    prior = ResidualPrior()
    Z = np.vstack([X[:2], [[9, 9, 9, 9, 9], [0, 9, 1, 9, 2]]])
    weights, means, variances = [], [], []
    for a in residual.SCALES:
        for b in residual.SCALES:
            scaled = prior.scaled(a, b)
            one = ResidualGP(5, scaled, adapt=False).fit(X, y)
            cov = one.kernel(X, X) + scaled.noise**2 * np.eye(len(X))
            hyper = -0.5 * ((math.log(a) / residual.SCALE_HYPERPRIOR_SD) ** 2 + (math.log(b) / residual.SCALE_HYPERPRIOR_SD) ** 2)
            weights.append(multivariate_normal(np.zeros(len(X)), cov).logpdf(y) + hyper)
            mean, sd = one.predict(Z)
            means.append(mean)
            variances.append(sd**2)
    w = np.exp(np.array(weights) - max(weights))
    w /= w.sum()
    mixture_mean = w @ np.array(means)
    mixture_sd = np.sqrt(w @ (np.array(variances) + np.array(means) ** 2) - mixture_mean**2)
    gp = ResidualGP(5, prior).fit(X, y)
    mean, sd = gp.predict(Z)
    assert mean == pytest.approx(mixture_mean, abs=2e-3) and sd == pytest.approx(mixture_sd, rel=0.02)
    most_likely = ResidualGP(5, prior.scaled(*gp.scale), adapt=False).fit(X, y)
    assert sd[2] > most_likely.predict(Z)[1][2]  # the factors' own uncertainty widens the belief


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


class _Belief:
    """A job model stand-in for the acquisition's arithmetic: every configuration log-normal around
    `mfu` with `sd`, fitting with probability `fit` (real strategies are not needed for the maths)."""

    def __init__(self, mfu: float, sd: float, fit: float = 1.0):
        self.mfu_, self.sd, self.fit = mfu, sd, fit

    def belief(self, s):
        return Belief(log_mfu=math.log(self.mfu_), log_mfu_sd=self.sd, fit=self.fit, mem_gib=0.0, mem_log_error=0.0,
                      mem_log_error_sd=0.0)

    def incumbent_mfu(self):
        return 0.5


def test_gain_of_several_launches_exceeds_one_and_matches_one_at_k1():
    belief = _Belief(mfu=0.48, sd=0.06)
    cands = [object() for _ in range(10)]
    one = acquisition.expected_improvement(math.log(0.48), 0.06, 0.5)
    k1 = acquisition.expected_gain_of_launches(belief, cands, 0.5, 1, draws=200_000)
    k10 = acquisition.expected_gain_of_launches(belief, cands, 0.5, 10)
    assert k1 == pytest.approx(one, rel=0.03)
    assert k10 > 4 * k1  # ten independent chances of a gain are worth far more than one
    # A configuration that does not fit measures nothing: half the chance, about half the gain.
    half = acquisition.expected_gain_of_launches(_Belief(0.48, 0.06, fit=0.5), cands[:1], 0.5, 1, draws=200_000)
    assert half == pytest.approx(one / 2, rel=0.05)
    assert acquisition.expected_gain_of_launches(belief, cands, 0.5, 0) == 0.0


def test_a_launch_less_likely_to_fit_than_not_is_worth_nothing():
    """Expected gain alone tries long shots; below even odds of fitting a launch is not worth a trial,
    and the stop does not count on it either."""
    cands = [object() for _ in range(5)]
    for fit, worth in ((acquisition.MIN_FIT_CHANCE - 0.1, False), (acquisition.MIN_FIT_CHANCE + 0.1, True)):
        belief = _Belief(0.6, 0.06, fit=fit)  # far above the incumbent (0.5): a large gain if it fits
        assert (acquisition.expected_gain(belief, cands[0]) > 0) is worth
        assert (acquisition.expected_gain_of_launches(belief, cands, 0.5, 3) > 0) is worth


def test_memory_correction_does_not_reassure_beyond_the_largest_configuration_measured():
    """Runs that used less memory than predicted lower the expected memory everywhere, but the chance
    of fitting a configuration larger than any measured reads the model's own memory (and the
    posterior's spread): a ratio learned on small configurations does not promise large ones a fit."""
    from optico.perfmodel.online import FIT_NOISE, JobModel
    from optico.strategy import strategy_from_mapping
    from optico.trial import Metrics, Trial, TrialStatus
    from optico.workload import PRESETS, Cluster, Workload

    w = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=512, precision="bf16",
                 cluster=Cluster(gpu="a100-80gb"))

    def s(**kw):
        return strategy_from_mapping({"distributed_optimizer": True, **kw})

    model = JobModel(w)
    small, largest = s(tp=4), s(tp=2, sp=True, mbs=2)  # measured
    mid, large = s(tp=1, pp=2), s(tp=2, mbs=2)  # not: one below the largest measured, one above
    assert model.base(small).mem_gib < model.base(mid).mem_gib < model.base(largest).mem_gib \
        < model.base(large).mem_gib
    trials = []
    for i, measured in enumerate((small, largest), start=1):
        mem = 0.8 * model.base(measured).mem_gib  # both used a fifth less than predicted
        trials.append(Trial(id=i, job_id=1, index=i, strategy=measured, signature=measured.signature(),
                            status=TrialStatus.OK,
                            metrics=Metrics(step_time_s=1.0, tflops_per_gpu=150.0, mfu=0.5, tokens_per_s_per_gpu=1.0,
                                            mem_max_gib=mem, mem_limit_gib=model.limit_gib)))
    model.observe(trials)

    def chance(x, corrected: bool) -> float:
        mean, sd = model.mem_log_error(x)
        margin = math.log(model.limit_gib / model.base(x).mem_gib) - (mean if corrected else 0.0)
        return 0.5 * (1.0 + math.erf(margin / (math.sqrt(sd * sd + FIT_NOISE**2) * math.sqrt(2.0))))

    assert model.mem_gib(large) < 0.95 * model.base(large).mem_gib  # the correction lowers it ...
    assert chance(large, corrected=True) > chance(large, corrected=False) + 0.05
    assert model.fit_probability(large) == pytest.approx(chance(large, corrected=False))  # ... but promises nothing
    assert chance(mid, corrected=False) < 0.99
    assert model.fit_probability(mid) == pytest.approx(chance(mid, corrected=True))  # within measured sizes it counts
    assert model.fit_probability(mid) > chance(mid, corrected=False) + 0.005


class _Scaled:
    """Beliefs per candidate, every MFU multiplied by `scale` (the incumbent too)."""

    def __init__(self, mfus: dict, scale: float):
        self.mfus, self.scale = mfus, scale

    def belief(self, s):
        return Belief(log_mfu=math.log(self.mfus[s] * self.scale), log_mfu_sd=0.05, fit=1.0, mem_gib=0.0,
                      mem_log_error=0.0, mem_log_error_sd=0.0)

    def incumbent_mfu(self):
        return 0.5 * self.scale


def test_ranking_does_not_depend_on_the_workloads_mfu_scale():
    """A workload at 0.2 % MFU ranks like one at 50 %: a tie is a share of the incumbent, not an
    absolute MFU (an absolute 5e-4 tied every score at 0.2 % and handed the launch to the smallest move)."""
    small, large = "one standard change", "three changes, a larger expected gain"
    mfus = {small: 0.49, large: 0.52}
    entries = [(small, 1, True), (large, 3, False)]
    for scale in (1.0, 0.004):
        ranked = acquisition.rank(_Scaled(mfus, scale), entries, answer_health=False)
        assert [r[3] for r in ranked] == [large, small], scale
    # a real tie (gains within a share of the incumbent) still goes to the smaller, standard move
    level = {small: 0.5, large: 0.5}
    for scale in (1.0, 0.004):
        assert acquisition.rank(_Scaled(level, scale), entries, answer_health=False)[0][3] == small


class _PerCandidate(_Scaled):
    """`_Scaled` with a chance of fitting and a posterior standard deviation per candidate."""

    def __init__(self, mfus: dict, fits: dict | None = None, sds: dict | None = None):
        super().__init__(mfus, 1.0)
        self.fits, self.sds = fits or {}, sds or {}

    def belief(self, s):
        b = super().belief(s)
        return b._replace(fit=self.fits.get(s, b.fit), log_mfu_sd=self.sds.get(s, b.log_mfu_sd))

    def expected_mfu(self, s):
        b = self.belief(s)
        return math.exp(b.log_mfu) * b.fit


def test_a_long_shot_never_wins_a_tie_against_a_candidate_worth_something():
    """Late in a job every expected gain can be within the tie (0.1 % of the incumbent); the tie used
    to go to the smaller move even when that was a configuration below the fit floor (gain 0)."""
    long_shot, modest = "one standard change, unlikely to fit", "three changes, a small gain"
    mfus = {long_shot: 0.56, modest: 0.4}  # the long shot would be far better, if it fitted
    fits = {long_shot: acquisition.MIN_FIT_CHANCE - 0.2, modest: 1.0}
    model = _PerCandidate(mfus, fits=fits)
    assert acquisition.expected_gain(model, long_shot) == 0.0
    assert 0 < acquisition.expected_gain(model, modest) < acquisition.TIE * model.incumbent_mfu()  # within the tie
    entries = [(long_shot, 1, True), (modest, 3, False)]
    for health in (False, True):
        assert [r[3] for r in acquisition.rank(model, entries, answer_health=health)] == [modest, long_shot]
    # between candidates that are both worth something, a tie still goes to the smaller, standard move
    fits[long_shot] = 1.0
    mfus[long_shot] = 0.4
    assert acquisition.rank(model, entries, answer_health=False)[0][3] == long_shot


def test_the_ranking_widens_the_posterior_and_the_stop_does_not():
    """Where the gain picks, the posterior is too narrow (eleventh freeze): the ranking reads it widened
    by PICK_SD_WIDENING, so a candidate the trials have not pinned down goes before a sure small gain;
    the expected gain the stop reads is the posterior's own."""
    sure, unsure = "at the incumbent, pinned down", "a little below it, unsure"
    model = _PerCandidate({sure: 0.5, unsure: 0.47}, sds={sure: 0.005, unsure: 0.045})
    assert acquisition.PICK_SD_WIDENING > 1
    # on the posterior as fitted the sure candidate is worth more ...
    assert acquisition.expected_gain(model, sure) > acquisition.expected_gain(model, unsure)
    assert acquisition.expected_gain(model, unsure) == pytest.approx(
        acquisition.expected_improvement(math.log(0.47), 0.045, 0.5))
    # ... widened, the unsure one is, and that is the order of the ranking
    entries = [(sure, 1, True), (unsure, 1, True)]
    assert [r[3] for r in acquisition.rank(model, entries, answer_health=False)] == [unsure, sure]
    with acquisition.switched(uncertainty=False):  # the ablation: expected MFU, no widening to read
        assert acquisition.rank(model, entries, answer_health=False)[0][3] == sure


def test_feature_terms_carry_a_component_error_to_configurations_with_more_or_less_of_it():
    # Log memory error of a configuration whose activations are the share `a` of its memory, when
    # the model undercounts activations by 30 %: log(1 + 0.3·a). The knob kernel alone spreads the
    # measured errors by shared knob values; the feature term also scales them by each share.
    prior = ResidualPrior(offset=0.08, main=0.05, pair=0.03, config=0.02, noise=0.01)
    X = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0]])
    shares = np.array([0.05, 0.4, 0.1, 0.35])
    y = np.log1p(0.3 * shares)
    features = np.column_stack([shares, np.zeros(4), np.zeros(4)])
    with_terms = ResidualGP(3, prior, feature_sd=(0.2, 0.2, 2.0)).fit(X, y, features)
    without = ResidualGP(3, prior).fit(X, y)
    untried = np.array([[2, 2, 1]])
    for share in (0.6, 0.02):  # more activations than any measured, and fewer
        mean, _ = with_terms.predict(untried, np.array([[share, 0.0, 0.0]]))
        plain, _ = without.predict(untried)
        truth = np.log1p(0.3 * share)
        assert abs(mean[0] - truth) < 0.5 * abs(plain[0] - truth)
    # Features are required once the model reads them.
    with pytest.raises(ValueError):
        with_terms.predict(untried)

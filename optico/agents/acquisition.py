"""Which untried configuration to run next: expected improvement under the residual model.

The job model (`optico.perfmodel.online.JobModel`) gives, for every configuration, a log-normal
belief about its MFU: the analytic model's prediction moved by what the trials taught the residual
model, with the residual model's standard deviation. A configuration is worth a launch by how much
it is expected to beat the incumbent (the best measured configuration, smoothed by the same
posterior), times the chance it fits in memory:

    gain(x) = P(fit x) · E[max(0, MFU(x) - best)]     (0 when P(fit x) < MIN_FIT_CHANCE)

(for log MFU ~ N(mu, sd^2): exp(mu + sd^2/2)·Phi(d + sd) - best·Phi(d), d = (mu - log best)/sd).
Near the incumbent and far from every measurement the standard deviation is large, so a layout the
model puts a few percent below the best still gets tried when the trials cannot rule it out; once
the measurements around it agree with the model, its gain falls to nothing. The ranking reads the
standard deviation widened by `PICK_SD_WIDENING` (the posterior is too narrow where the gain picks);
the same gain, on the posterior as fitted, decides when to stop (`optico.agents.stopping`).

`POLICY` turns parts off for the benchmark's ablations: the uncertainty (rank by expected MFU, the
argmax of the corrected model), the health rules (the paper's "answer the diagnosed state first").
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np

from optico.perfmodel.online import Belief, JobModel
from optico.strategy import Strategy

# Scores closer than this share of the incumbent's MFU are a tie: the smaller move wins. Relative, so
# a workload at 0.2 % MFU ranks as finely as one at 50 % (it was 5e-4 MFU absolute: at 0.2 % MFU every
# score tied, and the ties went to the smallest move whatever its gain). 1e-3 is the old value at 50 %.
TIE = 1e-3
# A move that answers the diagnosed health state goes first when its score is at least this share
# of the best score (a rule must not hide a clearly better move).
HEALTH_SHARE = 0.75
# A launch must be more likely to fit than not. Expected gain already weighs the chance of fitting,
# but on its own it tries long shots whose gain, if they fit, is large: on the development
# landscapes they were a failed launch nine times in ten, and failed launches count against a tuner.
MIN_FIT_CHANCE = 0.5
# The ranking widens the residual model's standard deviation by this factor. Where the expected gain
# picks, the posterior is too narrow: a pick is where it is most optimistic, and there the standardized
# errors had a standard deviation of 1.14-1.31 on development landscapes (docs/benchmarks.md, "Is the
# stop's expected gain calibrated?"). 1.4 and 2.0 did about as well there (eleventh freeze). The stop
# reads the posterior as fitted: widened there too, it never ended an out-of-form job.
PICK_SD_WIDENING = 1.4


@dataclass(frozen=True)
class Policy:
    """Parts of the tuner the benchmark's ablations can turn off."""

    uncertainty: bool = True  # rank by expected gain under the residual model (off: expected MFU)
    health_rules: bool = True  # moves answering the diagnosed health state first
    convergence_stop: bool = True  # stop once the next launches are not expected to pay


POLICY = Policy()


@contextmanager
def switched(**changes: bool) -> Iterator[Policy]:
    """Runs a block with some of `POLICY` changed (the benchmark's ablations)."""
    global POLICY
    old = POLICY
    POLICY = replace(old, **changes)
    try:
        yield POLICY
    finally:
        POLICY = old


def _phi(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def expected_improvement(mu: float, sd: float, best: float) -> float:
    """E[max(0, exp(Y) - best)] for Y ~ N(mu, sd^2); best <= 0 gives the mean of exp(Y)."""
    if best <= 0:
        return math.exp(mu + sd * sd / 2)
    if sd < 1e-9:
        return max(0.0, math.exp(mu) - best)
    d = (mu - math.log(best)) / sd
    return max(0.0, math.exp(mu + sd * sd / 2) * _phi(d + sd) - best * _phi(d))


def _gain(b: Belief, best: float, sd_factor: float = 1.0) -> float:
    if b.fit < MIN_FIT_CHANCE:
        return 0.0
    return b.fit * expected_improvement(b.log_mfu, b.log_mfu_sd * sd_factor, best)


def expected_gain(model: JobModel, s: Strategy, best: float | None = None, sd_factor: float = 1.0) -> float:
    """P(fit) times the expected MFU improvement of `s` over `best` (default: the incumbent), with the
    posterior's standard deviation times `sd_factor`."""
    return _gain(model.belief(s), model.incumbent_mfu() if best is None else best, sd_factor)


def expected_gain_of_launches(model: JobModel, candidates: Sequence[Strategy], best: float, k: int,
                              draws: int = 4000) -> float:
    """Expected improvement over `best` of the best of `k` launches: the `k` candidates with the
    largest single-launch gain, each an independent draw from its posterior (log-normal MFU, times
    whether it fits). Monte Carlo with fixed random numbers, so the same belief gives the same
    answer. Independence overstates the gain of configurations the residual model ties together;
    the stopping rule looks a few launches ahead (`LOOKAHEAD`), not a whole budget, to keep that small."""
    beliefs = [b for b in map(model.belief, candidates) if b.fit >= MIN_FIT_CHANCE]
    top = heapq.nlargest(max(0, k), beliefs, key=lambda b: _gain(b, best))
    if not top or best <= 0:
        return 0.0
    rng = np.random.default_rng(0)
    mu, sd, fits = (np.array([getattr(b, f) for b in top]) for f in ("log_mfu", "log_mfu_sd", "fit"))
    mfu = np.exp(mu + sd * rng.standard_normal((draws, len(top)))) * (rng.random((draws, len(top))) < fits)
    return float(np.maximum(mfu.max(axis=1) - best, 0.0).mean())


def score(model: JobModel, s: Strategy, best: float) -> float:
    """What a launch of `s` is worth now: expected gain with the posterior widened by
    `PICK_SD_WIDENING`, or expected MFU without the uncertainty."""
    return expected_gain(model, s, best, PICK_SD_WIDENING) if POLICY.uncertainty else model.expected_mfu(s)


def rank(model: JobModel, entries: Sequence[tuple[Strategy, int, bool]],
         answer_health: bool) -> list[tuple[float, int, bool, Strategy]]:
    """`entries`: admissible (candidate, number of changed knobs, answers the diagnosis). Returns
    (score, changes, standard, candidate), best first: near-ties go to a candidate worth anything
    over one worth nothing, then to standard moves, then to fewer changes; with `answer_health` (a
    diagnosed state) standard moves scoring at least HEALTH_SHARE of the best come first, as the
    paper's procedure answers the state first."""
    best = model.incumbent_mfu()
    scored = [(score(model, cand, best), n, standard, cand) for cand, n, standard in entries]
    # Before any run the scores are expected MFUs: the best of them sets the scale instead.
    tie = TIE * (best if best > 0 else max((x[0] for x in scored), default=0.0)) or 1e-12
    # A candidate worth nothing (below the fit floor, or no chance to beat the incumbent) never wins a
    # tie against one worth something: late in a job every gain can be within the tie, and the smaller
    # move that won it was then often a long shot unlikely to fit (ninth freeze, docs/benchmarks.md).
    scored.sort(key=lambda x: (-round(x[0] / tie), x[0] <= 0, not x[2], x[1]))
    if answer_health and POLICY.health_rules and scored:
        top = scored[0][0]
        scored.sort(key=lambda x: not (x[2] and x[0] >= top * HEALTH_SHARE))
    return scored

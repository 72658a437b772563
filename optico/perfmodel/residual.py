"""What the performance model cannot express, learned from a job's own trials.

The analytic model is right about the physics it writes down and wrong, by a few to ~15 %, about
everything else: a kernel that is slow for one shape, two flags that interact, a cluster that is
uniformly faster. `ResidualGP` is a Gaussian process on the model's log error

    r(x) = log(measured MFU(x) / predicted MFU(x))

over configurations x (one code per tuned knob). Its kernel is additive in what two configurations
share, so one covariance expresses four kinds of error at once:

    k(x, x') = v_offset                         every configuration: the model is off by a constant
             + v_main · m / F                   the same value of a knob: a main effect
             + v_pair · C(m, 2) / C(F, 2)       the same values of a pair of knobs: an interaction
             + v_config · [m = F]               the configuration itself: its own residual

with m the number of the F tuned knobs on which x and x' agree (a Hamming-type kernel: knob values
are labels, TP 2 is not "between" TP 1 and 4 for a residual). Observations carry run-to-run noise.
A caller may add numeric features of each configuration with a linear kernel beside it
(`feature_sd`, the prior standard deviations of their coefficients): the memory model passes the
share of each memory component, so an error in one component moves each configuration by its share.
The posterior mean corrects the model where trials say it is wrong; the posterior standard deviation
says how wrong it may still be at an untried configuration, which is what the acquisition
(`optico.agents.acquisition`) and the stopping rule (`optico.agents.stopping`) spend trials on.

Prior variances are set from the model's error on real data (`optico perfmodel evaluate`: MFU off
by ~9 % median, ~15 % at the tail) and were fixed on development landscapes before the benchmark's
test seeds were drawn (docs/benchmarks.md, "Calibration and test separation"). They are a starting
point, not a promise: once a job has `ADAPT_FROM` measurements, the GP scales the prior standard
deviations (not the noise) by factors from `SCALES`, one for the smooth part (offset and main
effects, shared by many configurations) and one for the rough part (pairs and the configuration's own
residual), weighing each pair of factors by how likely the job's own log errors make it (marginal
likelihood times a log-normal hyperprior around 1). The prediction averages over those factors
(Bayesian model averaging, moment-matched to one normal) rather than taking the most likely pair:
with a dozen trials several scales explain the errors about as well, and committing to one made the
posterior too narrow (on development landscapes the stop's expected gain was a third of what the next
launches then found; averaged, two thirds). A workload the model describes well keeps the prior or
shrinks it, and stops sooner; one with effects the model has no term for (a kernel slow for one
shape, pairs of flags that interact) keeps the uncertainty those effects imply, so the acquisition
goes on trying what the model cannot rule out and the job does not stop early.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import comb, log, pi
from typing import NamedTuple

import numpy as np
from scipy.linalg import cho_solve, solve_triangular


@dataclass(frozen=True)
class ResidualPrior:
    """Prior standard deviations of the model's log-MFU error, by kind (see the module docstring)."""

    offset: float = 0.12  # the whole workload: model constants off for this cluster
    main: float = 0.06  # one knob's value
    pair: float = 0.05  # two knobs' values together
    config: float = 0.03  # one configuration alone
    noise: float = 0.015  # run-to-run noise of one measurement

    @property
    def total(self) -> float:
        """Prior standard deviation at an untried configuration."""
        return float(np.sqrt(self.offset**2 + self.main**2 + self.pair**2 + self.config**2))

    def scaled(self, smooth: float, rough: float) -> "ResidualPrior":
        """Offset and main effects multiplied by `smooth`, pairs and the configuration's own residual
        by `rough`; the run-to-run noise kept."""
        return replace(self, offset=self.offset * smooth, main=self.main * smooth, pair=self.pair * rough,
                       config=self.config * rough)


# The factors a job's trials may scale each part of the prior by, the measurements needed before they
# may, and the hyperprior's spread (log scale: a factor of 2 is one standard deviation from the prior).
SCALES: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
ADAPT_FROM = 4
SCALE_HYPERPRIOR_SD = log(2.0)
# Factor pairs less likely than this share of the most likely one are left out of the average.
MIXTURE_CUTOFF = 1e-3


class _Fit(NamedTuple):
    """The GP under one pair of prior factors: its weight in the average and what predicts with it."""

    weight: float
    prior: ResidualPrior
    smooth: float  # the factor on the smooth part, which the feature terms share
    chol: np.ndarray  # Cholesky factor of the observations' covariance
    alpha: np.ndarray  # that covariance's inverse times the observations


class ResidualGP:
    """Posterior of the model's log error over a set of configurations (integer codes per knob).

    `fit(X, y)` takes the measured configurations' codes (n x F) and log errors; `predict(Z)` the
    posterior mean and standard deviation at any configurations (N x F), noise excluded. Knobs that
    never vary (every row equal) carry no information and are dropped by the caller via `columns`.
    """

    def __init__(self, n_fields: int, prior: ResidualPrior | None = None, adapt: bool = True,
                 feature_sd: tuple[float, ...] = ()):
        self.base_prior = self.prior = prior or ResidualPrior()
        self.adapt = adapt
        # Prior standard deviations of the coefficients of per-configuration features (a linear kernel
        # beside the knob kernel; the caller passes the features to `fit` and `predict`).
        self.feature_sd = np.asarray(feature_sd, dtype=float)
        self._features = np.empty((0, len(self.feature_sd)))
        self.scale = (1.0, 1.0)  # the most likely (smooth, rough) factors of the last fit; 1 before `ADAPT_FROM` points
        self.F = max(1, n_fields)
        self._X = np.empty((0, self.F), dtype=np.int64)
        self._mixture: list[_Fit] = []  # the fits the prediction averages over; empty before any point

    @staticmethod
    def agreements(A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """m(A_i, B_j): on how many knobs each pair of configurations agrees (len(A) x len(B))."""
        return (A[:, None, :] == B[None, :, :]).sum(axis=2).astype(float)

    def kernel_of(self, m: np.ndarray, prior: ResidualPrior | None = None,
                  shared: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """k from the agreement counts `m` (see the module docstring). `shared`: `self.pair_terms(m)`,
        when the caller evaluates several priors on the same `m`."""
        p, F = prior or self.prior, self.F
        pairs, same = shared if shared is not None else self.pair_terms(m)
        return (p.offset**2 + p.main**2 * m / F + p.pair**2 * pairs + p.config**2 * same)

    def pair_terms(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The parts of the kernel no prior scales: the share of knob pairs agreed on, and whether
        the configurations agree on every knob."""
        F = self.F
        return m * (m - 1) / 2 / max(1, comb(F, 2)), m == F

    def kernel(self, A: np.ndarray, B: np.ndarray) -> np.ndarray:
        """k(A_i, B_j) for every pair (len(A) x len(B))."""
        return self.kernel_of(self.agreements(A, B))

    def feature_kernel(self, A: np.ndarray, B: np.ndarray, smooth: float = 1.0) -> np.ndarray | float:
        """The linear kernel on features: sum_j (sd_j · smooth)^2 · A_ij · B_kj (0 without features)."""
        if not len(self.feature_sd):
            return 0.0
        return (A * (self.feature_sd * smooth) ** 2) @ B.T

    def _factor(self, m: np.ndarray, y: np.ndarray, prior: ResidualPrior, smooth: float = 1.0,
                shared: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, float]:
        """(Cholesky factor, alpha, log marginal likelihood) of the observations (agreements `m`) under
        `prior`, the feature terms scaled by `smooth`."""
        K = (self.kernel_of(m, prior, shared) + self.feature_kernel(self._features, self._features, smooth)
             + (prior.noise**2 + 1e-9) * np.eye(len(y)))
        chol = np.linalg.cholesky(K)
        alpha = cho_solve((chol, True), y, check_finite=False)
        lml = -0.5 * float(y @ alpha) - float(np.log(np.diag(chol)).sum()) - 0.5 * len(y) * log(2 * pi)
        return chol, alpha, lml

    def fit(self, X: np.ndarray, y: np.ndarray, features: np.ndarray | None = None) -> "ResidualGP":
        X = np.asarray(X, dtype=np.int64).reshape(-1, self.F)
        y = np.asarray(y, dtype=float)
        self._X = X
        self._features = self._features_of(features, len(y))
        self.prior, self.scale = self.base_prior, (1.0, 1.0)
        if not len(y):
            self._mixture = []
            return self
        grid = [(a, b) for a in SCALES for b in SCALES] if self.adapt and len(y) >= ADAPT_FROM else [(1.0, 1.0)]
        m = self.agreements(X, X)  # the same for every factor tried
        shared = self.pair_terms(m)

        def log_posterior(factors: tuple[float, float]) -> tuple[float, np.ndarray, np.ndarray]:
            chol, alpha, lml = self._factor(m, y, self.base_prior.scaled(*factors), factors[0], shared)
            return lml - 0.5 * sum((log(f) / SCALE_HYPERPRIOR_SD) ** 2 for f in factors), chol, alpha

        fits = {f: log_posterior(f) for f in grid}
        self.scale = max(fits, key=lambda f: fits[f][0])
        self.prior = self.base_prior.scaled(*self.scale)
        top = fits[self.scale][0]
        weights = {f: float(np.exp(fits[f][0] - top)) for f in grid}
        kept = {f: w for f, w in weights.items() if w >= MIXTURE_CUTOFF}
        total = sum(kept.values())
        self._mixture = [_Fit(w / total, self.base_prior.scaled(*f), f[0], fits[f][1], fits[f][2])
                         for f, w in kept.items()]
        return self

    def _features_of(self, features: np.ndarray | None, n: int) -> np.ndarray:
        if not len(self.feature_sd):
            return np.empty((n, 0))
        if features is None:
            raise ValueError("this residual model reads features: pass them")
        return np.asarray(features, dtype=float).reshape(n, len(self.feature_sd))

    def predict(self, Z: np.ndarray, features: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(posterior mean, posterior standard deviation) of the log error at each row of Z (with its
        features, when the model reads features)."""
        Z = np.asarray(Z, dtype=np.int64).reshape(-1, self.F)
        phi = self._features_of(features, len(Z))
        own = (phi * phi * self.feature_sd**2).sum(axis=1)  # the feature terms' prior variance (0 without)
        if not self._mixture:
            return np.zeros(len(Z)), np.sqrt(self.prior.total**2 + own)
        m = self.agreements(Z, self._X)
        shared = self.pair_terms(m)  # the same for every fit of the mixture
        mean, second_moment = np.zeros(len(Z)), np.zeros(len(Z))
        for fit in self._mixture:
            Ks = self.kernel_of(m, fit.prior, shared) + self.feature_kernel(phi, self._features, fit.smooth)
            fit_mean = Ks @ fit.alpha
            # Triangular solves: the factor is lower triangular (a general solve costs ~5x on the pool).
            v = solve_triangular(fit.chol, Ks.T, lower=True, check_finite=False)
            fit_var = np.maximum(fit.prior.total**2 + own * fit.smooth**2 - (v * v).sum(axis=0), 1e-10)
            mean += fit.weight * fit_mean
            second_moment += fit.weight * (fit_var + fit_mean * fit_mean)
        return mean, np.sqrt(np.maximum(second_moment - mean * mean, 1e-10))

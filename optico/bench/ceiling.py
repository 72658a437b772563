"""How well any tuner could do on a simulated landscape: a clairvoyant ceiling.

A simulated landscape's step time is the simulator's times effects shared between configurations
(main effects, pairwise interactions: a tuner can learn them from trials of other configurations)
and terms each configuration has alone (its shortfall and, out of form, its residual: drawn
independently per configuration, so no trial of another configuration says anything about them).

The clairvoyant knows everything but those own terms: every shared effect, the hidden constants,
which configurations fit. Its best choice of k launches is the k configurations with the highest MFU
before their own terms (the own terms are independent and identically distributed in log space, so
the highest means maximise the expected best of k, with or without feedback). What it reaches is an
expectation over the own terms: they are drawn afresh `DRAWS` times, and each draw gives a landscape
of the same kind with its own optimum. No tuner that learns only from launches can expect more, so
this bounds what the goals can ask of a landscape family (docs/benchmarks.md, "How far 98 % sits").

Replayed and third-party landscapes have no such split: they get no ceiling.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optico.bench.landscapes import HiddenSimLauncher, Landscape, _rng
from optico.bench.metrics import THRESHOLD

DRAWS = 400


def clairvoyant_ceiling(landscape: Landscape, budgets: Sequence[int] = (10, 20),
                        draws: int = DRAWS) -> dict[str, float] | None:
    """Expected best @k (fraction of each draw's optimum) and the share of draws reaching 98 % of it
    within k launches, for each k of `budgets`; None for a landscape without the split."""
    launcher = landscape.make_launcher()
    if not isinstance(launcher, HiddenSimLauncher):
        return None
    fitting = [s for s in landscape.candidates if landscape.true_mfu(s) is not None]
    if not fitting:
        return None
    # The truth divided by exp(own terms): the MFU before them, what the clairvoyant ranks by.
    before_own = np.array([landscape.true_mfu(s) * np.exp(launcher.own_log_factor(s)) for s in fitting])
    order = np.argsort(-before_own, kind="stable")
    own = launcher.draw_own_log_factors(_rng("ceiling", landscape.name), (draws, len(fitting)))
    mfu = before_own[None, :] * np.exp(-own)
    optimum = mfu.max(axis=1)
    out: dict[str, float] = {}
    for k in budgets:
        best = mfu[:, order[:k]].max(axis=1) / optimum
        out[f"best_at_{k}"] = float(best.mean())
        out[f"reached_98_at_{k}"] = float((best >= THRESHOLD - 1e-12).mean())
    return out

"""One run's figures from its trials (means over runs, and their intervals: `optico.bench.summary`).

A run's *best so far* after k trials is the configuration with the highest **measured** MFU
among its first k trials (what the tuner would deploy), scored by its **true** (noise-free)
MFU as a fraction of the landscape's optimum. A tuner that stopped early keeps its last value.

Per run: `frac_of_opt_at` budgets 5, 10, 20 (a budget beyond the run's takes the final value);
`trials_to_98` — the first k whose best so far reaches 98 % of the optimum; `trials_to_expert`
— the first k whose best so far reaches the expert configuration's true MFU (within
`EXPERT_TOLERANCE`, below the run-to-run noise); either threshold never reached counts as
budget + 1. `failed_frac`: failed launches (OOM, hang, error, not measured) over launches; `oom`:
how many of them ran out of memory (the failures a tuner chooses; hangs come at the landscape's rate).
`gpu_hours`: what the launches cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optico.bench.tuners import TrialOutcome

AT_BUDGETS: tuple[int, ...] = (5, 10, 20)
THRESHOLD = 0.98
EXPERT_TOLERANCE = 0.005  # relative: closer than this to the expert's MFU counts as reaching it


def best_so_far(outcomes: Sequence[TrialOutcome], optimum: float, budget: int) -> list[float]:
    """curve[k-1]: true MFU of the best-measured configuration of the first k trials / optimum."""
    curve: list[float] = []
    best: TrialOutcome | None = None
    for k in range(budget):
        if k < len(outcomes):
            o = outcomes[k]
            if o.ok and o.measured_mfu is not None and (best is None or o.measured_mfu > best.measured_mfu):
                best = o
        curve.append((best.true_mfu or 0.0) / optimum if best is not None else 0.0)
    return curve


def _first_reaching(curve: list[float], level: float, budget: int) -> int:
    return next((k for k, v in enumerate(curve, start=1) if v >= level - 1e-12), budget + 1)


def run_metrics(outcomes: Sequence[TrialOutcome], optimum: float, expert_mfu: float | None,
                budget: int) -> dict[str, Any]:
    """One run's figures (see the module docstring), plus its curve."""
    curve = best_so_far(outcomes, optimum, budget)
    final = curve[-1] if curve else 0.0
    launched = len(outcomes)
    spent, by_cost = 0.0, []
    for k, o in enumerate(outcomes):
        spent += o.gpu_seconds / 3600
        by_cost.append((spent, curve[min(k, budget - 1)] if curve else 0.0))
    reached = _first_reaching(curve, THRESHOLD, budget)
    return {
        "frac_of_opt_at": {str(b): curve[min(b, budget) - 1] if curve else final for b in AT_BUDGETS},
        "auc": float(sum(curve) / len(curve)) if curve else 0.0,
        "first_98": reached if reached <= budget else None,
        "failed": sum(not o.ok for o in outcomes),
        "oom": sum(o.failure == "oom" for o in outcomes),
        "curve_gpu_hours": by_cost,
        "trials_to_98": _first_reaching(curve, THRESHOLD, budget),
        "trials_to_expert": None if expert_mfu is None else
        _first_reaching(curve, expert_mfu * (1 - EXPERT_TOLERANCE) / optimum, budget),
        "failed_frac": sum(not o.ok for o in outcomes) / launched if launched else 0.0,
        "gpu_hours": sum(o.gpu_seconds for o in outcomes) / 3600,
        "trials": launched,
        "curve": curve,
    }

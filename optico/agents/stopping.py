"""When to stop a job: once no untried configuration is expected to pay for its launch.

The rule reads the same belief the acquisition ranks by (`optico.agents.acquisition`): for every
configuration the guard would admit, the expected MFU gain over the incumbent under the residual
model's uncertainty, times its chance of fitting. While some configuration is still expected to
beat the incumbent by the job's `converge_tol` (a fraction of the incumbent's MFU), trials are
likely to pay and the budget is spent; below it the job stops as converged. A layout far from
every measurement keeps the model's full prior uncertainty, so it holds a job open until the
trials around it have shown how far the model can be trusted there.
"""

from __future__ import annotations

from collections.abc import Sequence

from optico.agents import acquisition
from optico.guard import Guard
from optico.perfmodel.online import JobModel
from optico.spec import Budget
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus


def converged(model: JobModel, guard: Guard, pool: Sequence[Strategy], trials: list[Trial],
              prior: list[Trial], budget: Budget) -> str | None:
    """A stop reason when the largest expected gain is below `budget.converge_tol` of the incumbent,
    else None (also before `budget.min_trials`, without a successful run, or with nothing left)."""
    if not acquisition.POLICY.convergence_stop or budget.converge_tol is None:
        return None
    if len(trials) < budget.min_trials or not any(t.status == TrialStatus.OK for t in trials):
        return None
    model.observe([*prior, *trials])
    best = model.incumbent_mfu()
    admissible = [s for s in pool if guard.admissible(s, trials, prior)]
    if not admissible or best <= 0:
        return None  # the guard reports exhaustion
    if acquisition.POLICY.uncertainty:
        top = max(acquisition.expected_gain(model, s, best) for s in admissible)
        if top < budget.converge_tol * best:
            return (f"converged: no untried configuration is expected to gain more than {top / best:.2%} over "
                    f"the best ({best:.1%} MFU, smoothed) — below {budget.converge_tol:.1%}")
        return None
    top = max(model.expected_mfu(s) for s in admissible)
    if top < best * (1 + budget.converge_tol):
        return (f"converged: the best untried configuration is predicted at {top:.1%} MFU, no better than "
                f"the best {best:.1%} (+{budget.converge_tol:.1%})")
    return None

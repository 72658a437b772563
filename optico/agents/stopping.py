"""When to stop a job: once the launches left are not expected to pay.

The rule reads the same belief the acquisition ranks by (`optico.agents.acquisition`): the expected
MFU gain over the incumbent under the residual model's uncertainty, times the chance of fitting —
here of the best of the next few launches (`LOOKAHEAD`, or what the budget has left), not of one.
While those launches are expected to beat the incumbent by the job's `converge_tol` (a fraction of
the incumbent's MFU), trials are likely to pay and the budget is spent; below it the job stops as
converged. One launch at a 20 % chance of a 5 % gain is worth little; ten such launches are worth a
lot, which is why a single-launch rule stops too early where the model is roughly right on average
but each configuration has its own error. A layout far from every measurement keeps the model's
full prior uncertainty, so it holds a job open until the trials around it have shown how far the
model can be trusted there.
"""

from __future__ import annotations

from collections.abc import Sequence

from optico.agents import acquisition
from optico.guard import Guard
from optico.perfmodel.online import JobModel
from optico.spec import Budget
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus

# How many launches ahead the stopping rule values (fewer when the budget has fewer left).
LOOKAHEAD = 10


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
    admissible = [s for s, v in zip(pool, guard.check_all(pool, trials, prior)) if v.admitted]
    if not admissible or best <= 0:
        return None  # the guard reports exhaustion
    if acquisition.POLICY.uncertainty:
        k = min(LOOKAHEAD, budget.max_trials - len(trials))
        if k <= 0:
            return None  # the budget itself ends the job
        gain = acquisition.expected_gain_of_launches(model, admissible, best, k)
        if gain < budget.converge_tol * best:
            return converged_text(k, gain / best, best, budget.converge_tol)
        return None
    top = max(model.expected_mfu(s) for s in admissible)
    if top < best * (1 + budget.converge_tol):
        return (f"converged: the best untried configuration is predicted at {top:.1%} MFU, no better than "
                f"the best {best:.1%} (+{budget.converge_tol:.1%})")
    return None


def converged_text(launches: int, gain_share: float, best: float, tol: float) -> str:
    """The stop reason of an expected gain below the threshold: the gain to three significant digits,
    the threshold as set ('gain 0.10 % ... below 0.1 %' read as a contradiction)."""
    return (f"converged: the next {launches} launches are expected to gain {100 * gain_share:.3g}% over the "
            f"best ({best:.1%} MFU, smoothed) — below {100 * tol:g}%")

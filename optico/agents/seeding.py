"""The first configuration of a job when the spec gives no baseline.

Warm start first: the best configuration earlier jobs measured on this workload. Otherwise the
performance model's pick: the configuration with the highest expected MFU, its predicted MFU times
its chance of fitting in memory (the memory model's error before any measurement), among those the
guard would not refuse as out of memory — the configuration model-greedy launches first too.
It used to be a deliberately modest start (the smallest model-parallel layout, Megatron's
recommended flags), which spent the first launch well below what the model already knew, and then
(sixth to eleventh freeze) the fastest configuration expected to fit in 80 % of memory, a hard cut
that passed over a faster layout at 85 % the model gave a good chance of fitting: on the development
landscapes the expected-MFU pick did better (docs/benchmarks.md, "twelfth freeze").
"""

from __future__ import annotations

from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus


def start_configuration(pool: list[Strategy], model: JobModel, prior: list[Trial]) -> tuple[Strategy | None, str]:
    """(strategy, why) for the seed trial; `pool` is every valid strategy the job may run. None (and
    why) when the model expects none of them to fit, not even within the guard's margin: a launch
    would only run out of memory, on a cluster of GPUs."""
    signatures = {s.signature() for s in pool}
    known = [t for t in prior if t.status == TrialStatus.OK and t.metrics and t.signature in signatures]
    if known:
        best = max(known, key=lambda t: t.metrics.mfu)
        return best.strategy, (f"warm start: best of earlier jobs on this workload (job {best.job_id} trial "
                               f"{best.index}, MFU {best.metrics.mfu:.1%}), re-measured")
    fitting = [s for s in pool if not model.predicted_oom(s)]
    if fitting:
        choice = max(fitting, key=model.expected_mfu)
        return choice, (f"the model's pick: highest expected MFU ({model.expected_mfu(choice):.1%}: "
                        f"{model.mfu(choice):.1%} predicted, a {model.fit_probability(choice):.0%} chance of fitting "
                        f"in memory at {model.mem_gib(choice):.1f} GiB)")
    smallest = min(pool, key=model.mem_gib)
    return None, (f"no configuration in the search space is expected to fit: the smallest predicted peak memory "
                  f"is {model.mem_gib(smallest):.1f} GiB ({smallest.short()}) of the GPU's {model.limit_gib:.0f} "
                  f"GiB; widen the search space (larger TP, PP or CP, full recompute, uneven pipeline stages) or "
                  f"use more GPUs")

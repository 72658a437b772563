"""The first configuration of a job when the spec gives no baseline.

Warm start first: the best configuration earlier jobs measured on this workload. Otherwise the
performance model's pick: the configuration it predicts fastest among those it expects to fit with
headroom (`HEADROOM` of GPU memory, room for the memory model's error before any measurement).
It used to be a deliberately modest start (the smallest model-parallel layout, Megatron's
recommended flags), which spent the first launch well below what the model already knew: on the
development landscapes the first trial was at 65 % of the optimum on out-of-form landscapes and
79 % on independent ones, against 79 % and 91 % for the model's pick (docs/benchmarks.md).
"""

from __future__ import annotations

from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus

HEADROOM = 0.80  # fraction of GPU memory the first configuration may be expected to use


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
    for headroom in (HEADROOM, 1.0):
        fitting = [s for s in pool if model.mem_gib(s) <= headroom * model.limit_gib]
        if fitting:
            choice = max(fitting, key=model.mfu)
            return choice, (f"the model's pick: highest predicted MFU ({model.mfu(choice):.1%}) of the configurations "
                            f"expected to fit in {headroom:.0%} of memory ({model.mem_gib(choice):.1f} GiB)")
    smallest = min(pool, key=model.mem_gib)
    need = (f"the smallest predicted peak memory is {model.mem_gib(smallest):.1f} GiB ({smallest.short()}) of the "
            f"GPU's {model.limit_gib:.0f} GiB")
    if model.predicted_oom(smallest):
        return None, (f"no configuration in the search space is expected to fit: {need}; widen the search space "
                      f"(larger TP, PP or CP, full recompute, uneven pipeline stages) or use more GPUs")
    return smallest, f"none is expected to fit with certainty: {need}, within the model's error, so it runs first"

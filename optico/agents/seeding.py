"""The first configuration of a job when the spec gives no baseline.

Warm start first: the best configuration earlier jobs measured on this workload.
Otherwise what an engineer starts from: Megatron's recommended flags (distributed
optimizer, grad/param overlap, sequence parallel with TP), one micro-batch, no
recompute, and the smallest model-parallel size the model expects to fit with
headroom — a safe start, not the model's optimum.
"""

from __future__ import annotations

from optico.guard import recompute_level
from optico.perfmodel.online import JobModel
from optico.strategy import Strategy
from optico.trial import Trial, TrialStatus

HEADROOM = 0.80  # fraction of GPU memory a safe start may use


def _deviation_from_recipe(s: Strategy) -> int:
    recommended = {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
                   "sequence_parallel": s.tp > 1, "virtual_pipeline_model_parallel_size": None,
                   "cross_entropy_loss_fusion": False, "tp_comm_overlap": False}
    return sum(getattr(s, k) != v for k, v in recommended.items())


def heuristic_start(pool: list[Strategy], model: JobModel, prior: list[Trial]) -> tuple[Strategy, str]:
    """(strategy, why) for the seed trial; `pool` is every valid strategy the job may run."""
    signatures = {s.signature() for s in pool}
    known = [t for t in prior if t.status == TrialStatus.OK and t.metrics and t.signature in signatures]
    if known:
        best = max(known, key=lambda t: t.metrics.mfu)
        return best.strategy, (f"warm start: best of earlier jobs on this workload (job {best.job_id} trial "
                               f"{best.index}, MFU {best.metrics.mfu:.1%}), re-measured")
    for headroom in (HEADROOM, 1.0):
        fitting = [s for s in pool if model.mem_gib(s) <= headroom * model.limit_gib]
        if fitting:
            break
    else:
        fitting = pool
    choice = min(fitting, key=lambda s: (s.model_parallel_size * s.ep, s.pp, recompute_level(s), s.mbs,
                                         _deviation_from_recipe(s)))
    return choice, (f"heuristic start: smallest model-parallel size expected to fit in "
                    f"{headroom:.0%} of memory ({model.mem_gib(choice):.1f} GiB), recommended flags")

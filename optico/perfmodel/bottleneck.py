"""The bottleneck class of a configuration, with the numbers that support it."""

from __future__ import annotations

from enum import Enum

from optico.perfmodel.memory import MemoryBreakdown
from optico.perfmodel.timing import TimeBreakdown


class Bottleneck(str, Enum):
    COMPUTE = "compute"
    MEMORY_CAPACITY = "memory-capacity"
    COMMUNICATION = "communication"
    PIPELINE_BUBBLE = "pipeline-bubble"


# Shares of the step above which a cause, rather than compute, limits throughput.
MEMORY_TIGHT = 0.92
COMM_SHARE = 0.20
BUBBLE_SHARE = 0.12


def classify(time: TimeBreakdown, mem: MemoryBreakdown) -> tuple[Bottleneck, list[str]]:
    """The limiting factor and evidence sentences, most important first."""
    step = time.step_time_s
    comm = time.tp_comm_s + time.cp_comm_s + time.ep_comm_s + time.p2p_s + time.dp_comm_s
    shares = {
        "TP communication": time.tp_comm_s / step,
        "CP communication": time.cp_comm_s / step,
        "EP all-to-all": time.ep_comm_s / step,
        "pipeline p2p": time.p2p_s / step,
        "DP gradient sync (exposed)": time.dp_comm_s / step,
        "pipeline bubble and stage imbalance": time.pp_bubble_s / step,
        "recompute": time.recompute_s / step,
    }
    evidence = [f"memory {mem.total_gib:.1f} of {mem.limit_gib:.1f} GiB ({mem.fraction:.0%}) on stage {mem.stage}"]
    evidence += [f"{name} {share:.0%} of the step" for name, share in sorted(shares.items(), key=lambda kv: -kv[1])
                 if share >= 0.02]
    if mem.fraction >= MEMORY_TIGHT:
        return Bottleneck.MEMORY_CAPACITY, evidence
    if time.pp_bubble_s / step >= BUBBLE_SHARE and time.pp_bubble_s >= comm:
        return Bottleneck.PIPELINE_BUBBLE, evidence
    if comm / step >= COMM_SHARE:
        return Bottleneck.COMMUNICATION, evidence
    return Bottleneck.COMPUTE, evidence

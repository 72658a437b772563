"""How a strategy places the model: layers per pipeline stage, tokens per micro-batch,
which links each parallel group crosses."""

from __future__ import annotations

from dataclasses import dataclass

from optico.perfmodel.constants import Constants
from optico.strategy import Strategy
from optico.workload import Workload


def stage_layers(w: Workload, s: Strategy) -> list[int]:
    """Transformer layers on each pipeline stage (uneven first/last stages included)."""
    layers, pp = w.model.num_layers, s.pp
    first, last = s.decoder_first_pipeline_num_layers, s.decoder_last_pipeline_num_layers
    if pp == 1:
        return [layers]
    middle_stages = pp - (1 if first else 0) - (1 if last else 0)
    middle_layers = layers - (first or 0) - (last or 0)
    per_middle = middle_layers // middle_stages if middle_stages else 0
    out = [per_middle] * pp
    if first:
        out[0] = first
    if last:
        out[-1] = last
    if not first and not last:
        out = [layers // pp] * pp
    return out


@dataclass(frozen=True)
class Layout:
    """Derived sizes of one strategy on one workload."""

    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    dp: int
    mbs: int
    microbatches: int
    tokens: int  # tokens one GPU processes per micro-batch (sequence split by CP)
    stages: list[int]
    extra_in_flight: float
    tp_bw: float  # GB/s each parallel group's collectives see
    cp_bw: float
    ep_bw: float
    dp_bw: float
    pp_bw: float

    @property
    def in_flight(self) -> list[float]:
        """Micro-batches whose activations each stage holds at its peak (1F1B / interleaved)."""
        out = []
        for i in range(self.pp):
            k = float(self.pp - i) + (self.extra_in_flight if self.pp > 1 else 0.0)
            if self.vpp > 1:
                k += (self.pp - 1 - i) / self.vpp
            out.append(min(k, float(self.microbatches)))
        return out


def _link_bw(w: Workload, c: Constants, group_span: int) -> float:
    """Bandwidth a collective over `group_span` consecutive ranks sees (GB/s, effective)."""
    cluster, gpu = w.cluster, w.cluster.spec
    if group_span <= cluster.gpus_per_node and w.world_size > 1:
        nominal = gpu.nvlink_gbps if cluster.interconnect == "nvlink" else 25.0
        return nominal * c.nvlink_efficiency
    return cluster.inter_node_gbps * c.network_efficiency


def layout(w: Workload, s: Strategy, c: Constants) -> Layout:
    """Sizes and links, assuming Megatron's rank order (TP fastest, then CP, EP/DP, PP slowest)."""
    world = w.world_size
    dp = max(1, s.dp(world))
    mbs = s.mbs
    micro = max(1, w.global_batch_size // (mbs * dp))
    tokens = (w.seq_length // s.cp) * mbs
    gpn = w.cluster.gpus_per_node
    return Layout(
        tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, vpp=s.vpp, dp=dp, mbs=mbs, microbatches=micro,
        tokens=tokens, stages=stage_layers(w, s), extra_in_flight=c.pp_extra_in_flight,
        tp_bw=_link_bw(w, c, s.tp),
        cp_bw=_link_bw(w, c, s.tp * s.cp),
        ep_bw=_link_bw(w, c, s.tp * s.ep),
        dp_bw=_link_bw(w, c, s.tp * s.cp * dp),
        # Adjacent pipeline stages sit TP·CP·DP ranks apart: another node once that fills one.
        pp_bw=_link_bw(w, c, 2 if world <= gpn or s.tp * s.cp * dp < gpn else gpn + 1),
    )

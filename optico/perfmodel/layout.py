"""How a strategy places the model: layers (and their kinds) per pipeline stage, tokens per
micro-batch, which links each parallel group crosses. The sizes come from `optico.parallel`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from optico.parallel import ParallelDims
from optico.perfmodel.constants import Constants
from optico.strategy import Strategy
from optico.workload import LayerKind, Workload


def stage_layers(w: Workload, s: Strategy) -> list[int]:
    """Transformer layers on each pipeline stage (uneven first/last stages and the embedding or
    loss counted in the split included)."""
    return ParallelDims.of(s, w.world_size).stage_layers(w.model.num_layers)


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
    etp: int = 1
    expert_dp: int = 1
    extra_warmup: int = 0  # chunk forwards megatron-core adds to the interleaved warm-up (EP overlap: 1)
    stage_kinds: list[Counter] = field(default_factory=list)  # per stage: layer kind -> count (MTP included)

    @property
    def in_flight(self) -> list[float]:
        """Micro-batches whose activations each stage holds at its peak (1F1B / interleaved).

        Interleaved, megatron-core's schedule has rank i run 2·(PP−1−i) + (VPP−1)·PP chunk
        forwards in warm-up, plus one in steady state, each a 1/VPP share of the stage's layers
        (on the first stage this is Korthikanti et al.'s PP·(1 + (PP−1)/(PP·VPP)))."""
        out = []
        for i in range(self.pp):
            if self.vpp > 1:
                k = (2 * (self.pp - 1 - i) + (self.vpp - 1) * self.pp + self.extra_warmup + 1) / self.vpp
            else:
                k = float(self.pp - i)
            k += self.extra_in_flight if self.pp > 1 else 0.0
            out.append(min(k, float(self.microbatches)))
        return out

    @property
    def kinds(self) -> set[LayerKind]:
        return {k for stage in self.stage_kinds for k in stage}


def _link_bw(w: Workload, c: Constants, group_span: int) -> float:
    """Bandwidth a collective over `group_span` consecutive ranks sees (GB/s, effective). Where some
    groups straddle two nodes, every rank waits for the slowest group: network bandwidth."""
    cluster, gpu = w.cluster, w.cluster.spec
    if cluster.keeps_in_node(group_span) and w.world_size > 1:
        nominal = gpu.nvlink_gbps if cluster.interconnect == "nvlink" else 25.0
        return nominal * c.nvlink_efficiency
    return cluster.inter_node_gbps * c.network_efficiency


def _ep_remote_share(ep: int, etp: int, gpus_per_node: int, world: int) -> float:
    """Of the tokens a GPU sends to its EP peers, the share bound for other nodes. EP ranks sit
    ETP apart, so a node holds gpus_per_node / ETP of them."""
    if ep <= 1 or etp * ep <= gpus_per_node or world <= gpus_per_node:
        return 0.0
    on_node = max(1, gpus_per_node // etp)
    return (ep - on_node) / (ep - 1)


def _ep_bw(w: Workload, c: Constants, ep: int, etp: int) -> float:
    """What an all-to-all over EP ranks sees (GB/s, effective): over several nodes, the share bound
    for other nodes crosses the network while the rest crosses NVLink at the same time."""
    span = _link_bw(w, c, etp * ep)
    share = _ep_remote_share(ep, etp, w.cluster.gpus_per_node, w.world_size)
    return 1.0 / max(share / span, (1.0 - share) / _link_bw(w, c, 2)) if share else span


def _stage_kinds(w: Workload, dims: ParallelDims) -> list[Counter]:
    kinds = w.model.layer_kinds()
    out = [Counter(kinds[i] for i in idx) for idx in dims.stage_layer_indices(w.model.num_layers)]
    if w.model.mtp_num_layers:  # multi-token prediction runs after the decoder, on the last stage
        out[-1][kinds[-1]] += w.model.mtp_num_layers
    return out


def layout(w: Workload, s: Strategy, c: Constants) -> Layout:
    """Sizes and links, assuming Megatron's rank order (TP fastest, then CP, EP/DP, PP slowest)."""
    world = w.world_size
    dims = ParallelDims.of(s, world)
    dp, mbs = dims.dp, s.mbs
    gpn = w.cluster.gpus_per_node
    etp = s.etp if w.model.is_moe else s.tp
    return Layout(
        tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, vpp=s.vpp, dp=dp, mbs=mbs,
        microbatches=dims.microbatches(w.global_batch_size, mbs),
        tokens=(w.seq_length // s.cp) * mbs, stages=dims.stage_layers(w.model.num_layers),
        extra_in_flight=c.pp_extra_in_flight,
        tp_bw=_link_bw(w, c, s.tp),
        cp_bw=_link_bw(w, c, s.tp * s.cp),
        ep_bw=_ep_bw(w, c, s.ep, etp),
        dp_bw=_link_bw(w, c, s.tp * s.cp * dp),
        # Adjacent pipeline stages sit TP·CP·DP ranks apart: another node once that fills one.
        pp_bw=_link_bw(w, c, 2 if world <= gpn or s.tp * s.cp * dp < gpn else gpn + 1),
        etp=etp, expert_dp=max(1, world // (etp * s.ep * s.pp)), stage_kinds=_stage_kinds(w, dims),
        extra_warmup=int(s.overlap_moe_expert_parallel_comm),
    )

"""Step time of one iteration, by cause.

Per stage and micro-batch: GEMMs at an efficiency that falls for small TP-split
dimensions, flash attention at its own efficiency, memory-bound elementwise work
at HBM bandwidth (replicated across TP ranks unless sequence parallel), TP / CP /
EP collectives on the links their groups span (partly hidden), pipeline p2p,
recompute's extra forward. The pipeline runs M micro-batches at the slowest
stage's pace plus a fill/drain bubble that VPP divides; then the exposed part of
the DP gradient reduce and parameter gather, and the optimizer step.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from optico.perfmodel.constants import Constants
from optico.perfmodel.layers import activation_bytes, allreduce, gemm_time, layer_costs
from optico.perfmodel.layout import Layout
from optico.strategy import Strategy
from optico.workload import Workload


class TimeBreakdown(BaseModel):
    """Seconds per iteration by cause (on the critical path)."""

    model_config = ConfigDict(frozen=True)

    compute_s: float
    recompute_s: float
    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    p2p_s: float
    pp_bubble_s: float
    dp_comm_s: float
    optimizer_s: float
    overhead_s: float
    offload_s: float = 0.0  # activation offloading copies not hidden behind compute
    step_time_s: float
    hardware_flops: float  # per GPU per iteration, recompute included


def step_time(w: Workload, s: Strategy, lay: Layout, c: Constants, params_per_gpu: tuple[float, float]) -> TimeBreakdown:
    """The iteration's time; `params_per_gpu` = (dense, expert) parameters on the largest stage."""
    m, gpu = w.model, w.cluster.spec
    costs = layer_costs(w, s, lay, c, lay.kinds)
    # The host launches kernels asynchronously: it only costs time when it cannot keep ahead of the GPU.
    per_layer = {k: max(cost.gpu, cost.launch) for k, cost in costs.items()}
    T, t = float(lay.tokens), lay.tp
    vocab = m.padded_vocab(t) / t
    eff = min(0.98, (c.fp8_gemm_efficiency if w.precision == "fp8" else c.gemm_efficiency)
              * c.arch_factor(gpu.arch))
    heads = 1 + (m.mtp_num_layers or 0)  # multi-token prediction adds output heads on the last stage
    output = heads * gemm_time(6 * T * m.hidden_size * vocab, (T, m.hidden_size, vocab), gpu.peak(w.precision),
                               eff, c.gemm_knee)
    ce_bytes = (12.0 if s.cross_entropy_loss_fusion else 30.0) * T * vocab * heads
    loss = ce_bytes / (gpu.hbm_gbps * 1e9)
    embed = 6.0 * T * m.hidden_size / (gpu.hbm_gbps * 1e9)

    # P2P: send activations forward and their gradients back, once per stage boundary per chunk.
    p2p = 0.0
    if lay.pp > 1:
        p2p_bytes = 2.0 * T * m.hidden_size / (t if s.sequence_parallel else 1)
        exposed = c.p2p_overlap_exposed if (lay.vpp > 1 and s.overlap_p2p_comm) else c.p2p_exposed
        p2p = 2.0 * lay.vpp * (p2p_bytes / (lay.pp_bw * 1e9) + 2e-5) * exposed

    offload = _offload_exposed(w, s, lay, c, costs)
    stage_times = []
    for i, kinds in enumerate(lay.stage_kinds):
        st = sum(per_layer[k] * n for k, n in kinds.items()) + p2p + (offload if i == 0 else 0.0)
        if i == 0:
            st += embed
        if i == lay.pp - 1:
            st += output + loss
        stage_times.append(st)
    slowest = max(stage_times)
    M = lay.microbatches
    bubble = (sum(stage_times) - slowest) / lay.vpp
    pipeline = M * slowest + bubble

    # DP: grads reduced over DP·CP, experts over expert-DP; params gathered back (dist-opt).
    dense, expert = params_per_gpu
    dp_group = lay.dp * lay.cp
    expert_dp = lay.expert_dp
    if s.use_distributed_optimizer:
        reduce = _half_collective(4.0 * dense, dp_group, lay.dp_bw) + _half_collective(4.0 * expert, expert_dp, lay.dp_bw)
        gather = _half_collective(2.0 * dense, dp_group, lay.dp_bw) + _half_collective(2.0 * expert, expert_dp, lay.dp_bw)
    else:
        reduce = allreduce(4.0 * dense, dp_group, lay.dp_bw) + allreduce(4.0 * expert, expert_dp, lay.dp_bw)
        gather = 0.0
    backward_window = 2.0 / 3.0 * slowest  # grad reduce overlaps the last micro-batch's backward
    forward_window = 1.0 / 3.0 * slowest  # param gather overlaps the next first forward
    if s.overlap_grad_reduce:
        reduce = max(reduce * c.dp_overlap_exposed, reduce - backward_window)
    if s.overlap_param_gather:
        gather = max(gather * c.dp_overlap_exposed, gather - forward_window)
    dp_time = reduce + gather

    # Adam: fp32 master, two moments, grad read, bf16 write — ~30 bytes per owned parameter.
    dense_shard = dp_group if s.use_distributed_optimizer else 1
    expert_shard = expert_dp if s.use_distributed_optimizer else 1
    optimizer = 30.0 * (dense / dense_shard + expert / expert_shard) / (gpu.hbm_gbps * 1e9)

    total = pipeline + dp_time + optimizer + c.step_overhead_s
    slow = lay.stage_kinds[stage_times.index(slowest)]

    def on_slowest(part: str) -> float:
        return M * sum(getattr(costs[k], part) * n for k, n in slow.items())

    hardware_flops = (sum(costs[k].flops * n for kinds in lay.stage_kinds for k, n in kinds.items()) / lay.pp * M
                      + M * 6 * T * m.hidden_size * vocab * heads / lay.pp)
    host_bound = M * sum((per_layer[k] - costs[k].gpu) * n for k, n in slow.items())
    return TimeBreakdown(
        compute_s=on_slowest("compute") + M * (output + loss),
        recompute_s=on_slowest("recompute"),
        tp_comm_s=on_slowest("tp"),
        cp_comm_s=on_slowest("cp"),
        ep_comm_s=on_slowest("ep"),
        p2p_s=M * p2p,
        pp_bubble_s=bubble + M * (slowest - sum(stage_times) / lay.pp),
        dp_comm_s=dp_time,
        optimizer_s=optimizer,
        overhead_s=c.step_overhead_s + host_bound,
        offload_s=M * offload,
        step_time_s=total,
        hardware_flops=hardware_flops,
    )


def _offload_exposed(w: Workload, s: Strategy, lay: Layout, c: Constants, costs: dict) -> float:
    """Activation offloading per micro-batch: the offloaded layers' activations go to the host in the
    forward pass and come back for the backward; a copy hides behind the layer's own compute unless
    the link is slower. PP is 1 when offloading (a coupling), so this is the only stage."""
    n = s.cpu_offloading_num_layers
    if not n:
        return 0.0
    layers = sum(lay.stage_kinds[0].values())
    shown = 0.0
    for kind, count in lay.stage_kinds[0].items():
        stored, _ = activation_bytes(w, s, lay, c, kind)
        copy = 2.0 * stored / (w.cluster.spec.host_gbps * 1e9)  # out and back
        shown += max(0.0, copy - costs[kind].compute) * count
    return shown * min(n, layers) / max(1, layers)


def _half_collective(bytes_: float, n: int, bw_gbps: float) -> float:
    """Ring reduce-scatter or all-gather of `bytes_` in total."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * bytes_ / (bw_gbps * 1e9) + 5e-6 * n

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
    step_time_s: float
    hardware_flops: float  # per GPU per iteration, recompute included


def _gemm_time(flops: float, dims: tuple[float, ...], peak_tflops: float, eff: float, knee: float) -> float:
    smallest = min(dims)
    return flops / (peak_tflops * 1e12 * eff * smallest / (smallest + knee))


def _allreduce(bytes_: float, n: int, bw_gbps: float) -> float:
    """Ring all-reduce (or reduce-scatter + all-gather of the same size)."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * bytes_ / (bw_gbps * 1e9) + 1e-5 * n


def _half_collective(bytes_: float, n: int, bw_gbps: float) -> float:
    """Ring reduce-scatter or all-gather of `bytes_` in total."""
    if n <= 1:
        return 0.0
    return (n - 1) / n * bytes_ / (bw_gbps * 1e9) + 5e-6 * n


class _LayerCost(BaseModel):
    compute: float
    recompute: float
    tp: float
    cp: float
    ep: float
    launch: float  # host time to launch the layer's kernels: a floor under its GPU time
    flops: float  # hardware FLOPs, recompute included


def _layer_cost(w: Workload, s: Strategy, lay: Layout, c: Constants) -> _LayerCost:
    """One transformer layer, one micro-batch, forward + backward, on one GPU."""
    m, gpu, t, T = w.model, w.cluster.spec, lay.tp, float(lay.tokens)
    h, q, kv = m.hidden_size, m.head_dim * m.num_attention_heads, m.head_dim * m.groups
    fp8 = w.precision == "fp8"
    gemm_peak = gpu.peak(w.precision)
    half_peak = gpu.peak("bf16")
    arch = c.arch_factor(gpu.arch)
    eff = min(0.98, (c.fp8_gemm_efficiency if fp8 else c.gemm_efficiency) * arch)
    gate = 3 if m.swiglu else 2

    # Linear layers: 6 FLOPs per parameter per token (forward 2, backward 4).
    qkv = _gemm_time(6 * T * h * (q + 2 * kv) / t, (T, h, (q + 2 * kv) / t), gemm_peak, eff, c.gemm_knee)
    proj = _gemm_time(6 * T * q * h / t, (T, h, q / t), gemm_peak, eff, c.gemm_knee)
    lin_flops = 6 * T * (h * (q + 2 * kv) + q * h) / t
    if m.is_moe:
        experts_here = m.num_experts / lay.ep
        per_expert_tokens = max(1.0, T * m.moe_router_topk * lay.ep / m.num_experts)
        f = m.expert_ffn
        moe_flops = 6 * T * m.moe_router_topk * gate * h * f / t
        moe_eff = eff * (1.0 if s.moe_grouped_gemm else c.moe_gemm_penalty)
        mlp = _gemm_time(moe_flops, (per_expert_tokens, h, f / t), gemm_peak, moe_eff, c.gemm_knee)
        # Looping over local experts launches kernels per expert; a grouped GEMM launches few.
        launch_extra = experts_here * (0.05 if s.moe_grouped_gemm else 0.2)
        lin_flops += moe_flops
        if m.moe_shared_expert_intermediate_size:
            shared = 6 * T * gate * h * m.moe_shared_expert_intermediate_size / t
            mlp += _gemm_time(shared, (T, h, m.moe_shared_expert_intermediate_size / t), gemm_peak, eff, c.gemm_knee)
            lin_flops += shared
    else:
        launch_extra = 0.0
        f = m.ffn_hidden_size
        mlp_flops = 6 * T * gate * h * f / t
        mlp = _gemm_time(mlp_flops, (T, h, f / t), gemm_peak, eff, c.gemm_knee)
        lin_flops += mlp_flops
    linear = qkv + proj + mlp

    # Causal flash attention over the whole sequence for this rank's queries.
    attn_flops = 6 * q * w.seq_length * T / t
    attention = attn_flops / (half_peak * 1e12 * min(0.95, c.attention_efficiency * arch))

    # Memory-bound work: norms and residuals (on h, split only by SP), RoPE, activation function.
    sp = t if s.sequence_parallel else 1
    f_local = (m.expert_ffn * m.moe_router_topk if m.is_moe else m.ffn_hidden_size)
    elements = 18.0 * h / sp + (4.0 * (q + kv) + (8.0 if m.swiglu else 5.0) * f_local) / t
    elementwise = c.elementwise_scale * 2.0 * T * elements / (gpu.hbm_gbps * 1e9)

    compute = linear + attention + elementwise
    flops = lin_flops + attn_flops

    # Recompute: another forward (a third of forward + backward) of what it drops.
    if s.recompute_granularity == "full":
        recompute = (linear + attention + elementwise) / 3.0 + 0.4 * elementwise
        rflops = flops / 3.0
    elif s.recompute_granularity == "selective":
        recompute = attention / 3.0
        rflops = attn_flops / 3.0
    else:
        recompute, rflops = 0.0, 0.0
    if s.recompute_granularity == "full" and s.recompute_method == "block":
        per_chunk = max(1.0, lay.stages[0] / lay.vpp)
        share = min(1.0, (s.recompute_num_layers or 1) / per_chunk)
        recompute, rflops = recompute * share, rflops * share

    # TP: two collectives of the layer's activations forward, two backward (+2 with full recompute).
    act_bytes = 2.0 * T * h
    collectives = 4 + (2 if s.recompute_granularity == "full" else 0)
    tp_time = collectives * _allreduce(act_bytes, t, lay.tp_bw)
    tp_time *= c.tp_overlap_exposed if s.tp_comm_overlap else c.tp_exposed

    # CP: ring exchange of K and V forward, and of K, V, dK, dV backward.
    cp_time = 0.0
    if lay.cp > 1:
        kv_bytes = 2.0 * 2.0 * T * kv / t
        cp_time = 3.0 * (lay.cp - 1) * kv_bytes / (lay.cp_bw * 1e9) * c.cp_exposed

    # EP: dispatch and combine, forward and backward.
    ep_time = 0.0
    if m.is_moe and lay.ep > 1:
        if s.moe_token_dispatcher_type == "allgather":
            volume = 2.0 * T * h * (lay.ep - 1) / sp
        else:
            volume = 2.0 * T * m.moe_router_topk * h * (lay.ep - 1) / lay.ep / sp
        ep_time = 4.0 * volume / (lay.ep_bw * 1e9) * c.ep_exposed
    # The host launches kernels asynchronously: it only costs time when it cannot keep ahead of the GPU.
    launch = c.layer_overhead_s * (1 + launch_extra + (0.3 if s.recompute_granularity == "full" else 0.0))
    return _LayerCost(compute=compute, recompute=recompute, tp=tp_time, cp=cp_time, ep=ep_time,
                      launch=launch, flops=flops + rflops)


def step_time(w: Workload, s: Strategy, lay: Layout, c: Constants, params_per_gpu: tuple[float, float]) -> TimeBreakdown:
    """The iteration's time; `params_per_gpu` = (dense, expert) parameters on the largest stage."""
    m, gpu = w.model, w.cluster.spec
    cost = _layer_cost(w, s, lay, c)
    gpu_per_layer = cost.compute + cost.recompute + cost.tp + cost.cp + cost.ep
    per_layer = max(gpu_per_layer, cost.launch)
    host_bound = per_layer - gpu_per_layer
    T, t = float(lay.tokens), lay.tp
    vocab = m.padded_vocab(t) / t
    eff = min(0.98, (c.fp8_gemm_efficiency if w.precision == "fp8" else c.gemm_efficiency)
              * c.arch_factor(gpu.arch))
    output = _gemm_time(6 * T * m.hidden_size * vocab, (T, m.hidden_size, vocab), gpu.peak(w.precision), eff,
                        c.gemm_knee)
    ce_bytes = (12.0 if s.cross_entropy_loss_fusion else 30.0) * T * vocab
    loss = ce_bytes / (gpu.hbm_gbps * 1e9)
    embed = 6.0 * T * m.hidden_size / (gpu.hbm_gbps * 1e9)

    # P2P: send activations forward and their gradients back, once per stage boundary per chunk.
    p2p = 0.0
    if lay.pp > 1:
        p2p_bytes = 2.0 * T * m.hidden_size / (t if s.sequence_parallel else 1)
        exposed = c.p2p_overlap_exposed if (lay.vpp > 1 and s.overlap_p2p_comm) else c.p2p_exposed
        p2p = 2.0 * lay.vpp * (p2p_bytes / (lay.pp_bw * 1e9) + 2e-5) * exposed

    stage_times = []
    for i, layers in enumerate(lay.stages):
        st = layers * per_layer + p2p
        if i == 0:
            st += embed
        if i == lay.pp - 1:
            st += output + loss
        stage_times.append(st)
    slowest = max(stage_times)
    M = lay.microbatches
    bubble = (sum(stage_times) - slowest) / lay.vpp
    pipeline = M * slowest + bubble

    # DP: grads (fp32) reduced over DP·CP, experts over expert-DP; params gathered back (dist-opt).
    dense, expert = params_per_gpu
    dp_group = lay.dp * lay.cp
    expert_dp = max(1, w.world_size // (lay.ep * lay.tp * lay.pp))
    if s.use_distributed_optimizer:
        reduce = _half_collective(4.0 * dense, dp_group, lay.dp_bw) + _half_collective(4.0 * expert, expert_dp, lay.dp_bw)
        gather = _half_collective(2.0 * dense, dp_group, lay.dp_bw) + _half_collective(2.0 * expert, expert_dp, lay.dp_bw)
    else:
        reduce = _allreduce(4.0 * dense, dp_group, lay.dp_bw) + _allreduce(4.0 * expert, expert_dp, lay.dp_bw)
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
    layers_on_slowest = lay.stages[stage_times.index(slowest)]
    hardware_flops = sum(lay.stages) / lay.pp * cost.flops * M + M * 6 * T * m.hidden_size * vocab / lay.pp
    return TimeBreakdown(
        compute_s=M * layers_on_slowest * cost.compute + M * (output + loss),
        recompute_s=M * layers_on_slowest * cost.recompute,
        tp_comm_s=M * layers_on_slowest * cost.tp,
        cp_comm_s=M * layers_on_slowest * cost.cp,
        ep_comm_s=M * layers_on_slowest * cost.ep,
        p2p_s=M * p2p,
        pp_bubble_s=bubble + M * (slowest - sum(stage_times) / lay.pp),
        dp_comm_s=dp_time,
        optimizer_s=optimizer,
        overhead_s=c.step_overhead_s + M * layers_on_slowest * host_bound,
        step_time_s=total,
        hardware_flops=hardware_flops,
    )

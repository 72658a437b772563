"""One layer of each kind on one GPU for one micro-batch: time by cause, activation bytes, parameters.

A layer kind is (mixer, mlp) (`optico.workload.LayerKind`): a GPT layer has both — attention or
MLA, then a dense MLP or MoE — and a hybrid model's layer one of them (Mamba, attention, MLP,
MoE). Costs add up per sublayer, so a GPT layer costs exactly its two halves.

- Linear layers: 6 FLOPs per parameter per token (forward 2, backward 4) at an efficiency that
  falls for small TP-split dimensions. MLA's down projections are not split by TP.
- Attention core: causal flash attention at its own efficiency (MLA: QK over qk+rope dims,
  AV over v dims). Mamba's chunked scan: Megatron-LM's 7·d_inner·state FLOPs per token, forward.
- Memory-bound work (norms, residuals, RoPE, activations) at HBM bandwidth, replicated over TP
  unless sequence parallel.
- TP: one collective of the sublayer's activations forward and one backward per TP-split
  sublayer (one more with full recompute); MoE experts split by ETP only need them when ETP > 1.
- CP: ring exchange of K and V. EP: token dispatch and combine, forward and backward, the
  share bound for other nodes over the network while the rest crosses NVLink;
  hidden by EP communication overlap down to `ep_overlap_exposed`. MoE's token permutation
  (gathering each routed copy into expert order and back) is memory-bound work at HBM bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass

from optico.perfmodel.constants import Constants
from optico.perfmodel.layout import Layout
from optico.strategy import Strategy
from optico.workload import LayerKind, Workload


@dataclass(frozen=True)
class LayerCost:
    compute: float
    recompute: float
    tp: float
    cp: float
    ep: float
    launch: float  # host time to launch the layer's kernels: a floor under its GPU time
    flops: float  # hardware FLOPs, recompute included

    def __add__(self, other: "LayerCost") -> "LayerCost":
        return LayerCost(*(a + b for a, b in zip(self.astuple(), other.astuple())))

    def astuple(self) -> tuple[float, ...]:
        return (self.compute, self.recompute, self.tp, self.cp, self.ep, self.launch, self.flops)

    @property
    def gpu(self) -> float:
        return self.compute + self.recompute + self.tp + self.cp + self.ep


ZERO = LayerCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def gemm_time(flops: float, dims: tuple[float, ...], peak_tflops: float, eff: float, knee: float) -> float:
    smallest = min(dims)
    return flops / (peak_tflops * 1e12 * eff * smallest / (smallest + knee))


def allreduce(bytes_: float, n: int, bw_gbps: float) -> float:
    """Ring all-reduce (or reduce-scatter + all-gather of the same size)."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n * bytes_ / (bw_gbps * 1e9) + 1e-5 * n


class _Ctx:
    """What every sublayer cost reads, computed once."""

    def __init__(self, w: Workload, s: Strategy, lay: Layout, c: Constants):
        m, gpu = w.model, w.cluster.spec
        self.w, self.s, self.lay, self.c, self.m = w, s, lay, c, m
        self.t, self.T, self.h = lay.tp, float(lay.tokens), m.hidden_size
        self.sp = lay.tp if s.sequence_parallel else 1
        arch = c.arch_factor(gpu.arch)
        self.peak = gpu.peak(w.precision)
        self.attn_rate = gpu.peak("bf16") * 1e12 * min(0.95, c.attention_efficiency * arch)
        self.eff = min(0.98, (c.fp8_gemm_efficiency if w.precision == "fp8" else c.gemm_efficiency) * arch)
        self.hbm = gpu.hbm_gbps * 1e9
        self.gate = 3 if m.swiglu else 2
        full = s.recompute_granularity == "full"
        self.collectives = 2 + (1 if full else 0)
        self.tp_exposed = c.tp_overlap_exposed if s.tp_comm_overlap else c.tp_exposed
        share = 1.0
        if full and s.recompute_method == "block":
            per_chunk = max(1.0, max(lay.stages) / lay.vpp)
            share = min(1.0, (s.recompute_num_layers or 1) / per_chunk)
        self.block_share = share

    def gemm(self, flops: float, dims: tuple[float, ...], eff: float | None = None) -> float:
        return gemm_time(flops, dims, self.peak, self.eff if eff is None else eff, self.c.gemm_knee)

    def elementwise(self, elements: float) -> float:
        return self.c.elementwise_scale * 2.0 * self.T * elements / self.hbm

    def recompute(self, linear: float, core: float, elementwise: float) -> float:
        """Another forward of what recompute drops (a third of forward + backward)."""
        if self.s.recompute_granularity == "full":
            return ((linear + core + elementwise) / 3.0 + 0.4 * elementwise) * self.block_share
        if self.s.recompute_granularity == "selective":
            return core / 3.0
        return 0.0

    def recompute_flops(self, flops: float, core_flops: float) -> float:
        if self.s.recompute_granularity == "full":
            return flops / 3.0 * self.block_share
        if self.s.recompute_granularity == "selective":
            return core_flops / 3.0
        return 0.0

    def tp_time(self, collectives: float) -> float:
        return collectives * allreduce(2.0 * self.T * self.h, self.t, self.lay.tp_bw) * self.tp_exposed


def _mixer(x: _Ctx, mixer: str) -> LayerCost:
    m, T, t, h, s = x.m, x.T, x.t, x.h, x.w.seq_length
    n = m.num_attention_heads
    if mixer == "attention":
        q, kv = m.head_dim * n, m.head_dim * m.groups
        linear = (x.gemm(6 * T * h * (q + 2 * kv) / t, (T, h, (q + 2 * kv) / t))
                  + x.gemm(6 * T * q * h / t, (T, h, q / t)))
        lin_flops = 6 * T * (h * (q + 2 * kv) + q * h) / t
        core_flops = 6 * q * s * T / t
        elements = 9.0 * h / x.sp + 4.0 * (q + kv) / t
        kv_exchange = 2.0 * 2.0 * T * kv / t
    elif mixer == "mla":
        rope, qk, v = m.qk_pos_emb_head_dim, m.qk_head_dim, m.v_head_dim
        q_out, kvl = n * (qk + rope), m.kv_lora_rank
        linear = x.gemm(6 * T * h * (kvl + rope), (T, h, kvl + rope))  # kv down: not split by TP
        lin_flops = 6 * T * h * (kvl + rope)
        if m.q_lora_rank is None:
            linear += x.gemm(6 * T * h * q_out / t, (T, h, q_out / t))
            lin_flops += 6 * T * h * q_out / t
        else:
            ql = m.q_lora_rank
            linear += x.gemm(6 * T * h * ql, (T, h, ql)) + x.gemm(6 * T * ql * q_out / t, (T, ql, q_out / t))
            lin_flops += 6 * T * (h * ql + ql * q_out / t)
        up = n * (qk + v)
        linear += x.gemm(6 * T * kvl * up / t, (T, kvl, up / t)) + x.gemm(6 * T * n * v * h / t, (T, h, n * v / t))
        lin_flops += 6 * T * (kvl * up + n * v * h) / t
        core_flops = 3 * T * s * n * (qk + rope + v) / t
        elements = 9.0 * h / x.sp + 4.0 * (2 * q_out + n * v) / t + 2.0 * kvl
        kv_exchange = 2.0 * T * (q_out + n * v) / t
    else:  # mamba
        d_in, g, st, heads = 2 * h, m.mamba_num_groups, m.mamba_state_dim, m.mamba_heads
        proj_out = 2 * d_in + 2 * g * st + heads
        linear = x.gemm(6 * T * h * proj_out / t, (T, h, proj_out / t)) + x.gemm(6 * T * d_in * h / t, (T, h, d_in / t))
        lin_flops = 6 * T * (h * proj_out + d_in * h) / t
        core_flops = 3 * 7 * T * d_in * st / t  # the scan, forward and backward
        elements = 9.0 * h / x.sp + (3.0 * proj_out + 6.0 * d_in) / t
        kv_exchange = 2.0 * T * h / x.sp
    core = core_flops / x.attn_rate
    elementwise = x.elementwise(elements)
    cp = 0.0
    if x.lay.cp > 1:
        cp = 3.0 * (x.lay.cp - 1) * kv_exchange / (x.lay.cp_bw * 1e9) * x.c.cp_exposed
    selective_core = core if mixer != "mamba" else 0.0  # selective recompute: the attention core
    recompute = x.recompute(linear, core, elementwise) if x.s.recompute_granularity == "full" \
        else x.recompute(0.0, selective_core, 0.0)
    flops = lin_flops + core_flops
    rflops = x.recompute_flops(flops, core_flops if mixer != "mamba" else 0.0)
    launch = x.c.layer_overhead_s * (0.5 + (0.15 if x.s.recompute_granularity == "full" else 0.0))
    return LayerCost(compute=linear + core + elementwise, recompute=recompute, tp=x.tp_time(x.collectives), cp=cp,
                     ep=0.0, launch=launch, flops=flops + rflops)


def _mlp(x: _Ctx, mlp: str) -> LayerCost:
    m, T, t, h, s = x.m, x.T, x.t, x.h, x.s
    lay, c = x.lay, x.c
    launch_extra, ep, tp_collectives = 0.0, 0.0, float(x.collectives)
    if mlp == "dense":
        f = m.ffn_hidden_size
        flops = 6 * T * x.gate * h * f / t
        linear = x.gemm(flops, (T, h, f / t))
        elements = 9.0 * h / x.sp + (8.0 if m.swiglu else 5.0) * f / t
    else:
        experts_here = m.num_experts / lay.ep
        # Tokens per local expert: the EP group's tokens (SP-sharded when ETP < TP) over the experts.
        per_expert_tokens = max(1.0, T * m.moe_router_topk * lay.ep * lay.etp / (m.num_experts * t))
        f = m.expert_ffn
        flops = 6 * T * m.moe_router_topk * x.gate * h * f / t
        moe_eff = x.eff * (1.0 if s.moe_grouped_gemm else c.moe_gemm_penalty)
        linear = x.gemm(flops, (per_expert_tokens, h, f / lay.etp), moe_eff)
        # Looping over local experts launches kernels per expert; a grouped GEMM launches few.
        launch_extra = experts_here * (0.05 if s.moe_grouped_gemm else 0.2)
        shared = m.moe_shared_expert_intermediate_size
        if shared:
            shared_flops = 6 * T * x.gate * h * shared / t
            linear += x.gemm(shared_flops, (T, h, shared / t))
            flops += shared_flops
        # Token permutation: each routed copy of a token (top-k per token) is gathered into expert
        # order and scattered back (permute, unpermute), and re-sorted by local expert around the
        # all-to-all when a GPU holds several experts; each copy reads and writes k·h per token,
        # forward and backward.
        copies = 2.0 + (2.0 if lay.ep > 1 and experts_here > 1 else 0.0)
        permutation = 4.0 * copies * m.moe_router_topk * h / t
        elements = 9.0 * h / x.sp + (8.0 if m.swiglu else 5.0) * f * m.moe_router_topk / t + permutation
        # Experts split by ETP: TP collectives only when ETP > 1 or a shared expert (TP-split) runs.
        if lay.etp == 1 and not shared and t > 1:
            tp_collectives = 0.0
        if lay.ep > 1:
            if s.moe_token_dispatcher_type == "allgather":
                volume = 2.0 * T * h * (lay.ep - 1) / x.sp
            else:
                volume = 2.0 * T * m.moe_router_topk * h * (lay.ep - 1) / lay.ep / x.sp
            exposed = c.ep_overlap_exposed if s.overlap_moe_expert_parallel_comm else c.ep_exposed
            ep = 4.0 * volume / (lay.ep_bw * 1e9) * exposed
    elementwise = x.elementwise(elements)
    recompute = x.recompute(linear, 0.0, elementwise) if s.recompute_granularity == "full" else 0.0
    rflops = x.recompute_flops(flops, 0.0)
    launch = c.layer_overhead_s * (0.5 + launch_extra + (0.15 if s.recompute_granularity == "full" else 0.0))
    return LayerCost(compute=linear + elementwise, recompute=recompute, tp=x.tp_time(tp_collectives), cp=0.0,
                     ep=ep, launch=launch, flops=flops + rflops)


def layer_costs(w: Workload, s: Strategy, lay: Layout, c: Constants, kinds: set[LayerKind]) -> dict[LayerKind, LayerCost]:
    """The cost of one layer of each kind (forward + backward, one micro-batch, one GPU)."""
    x = _Ctx(w, s, lay, c)
    out = {}
    for kind in kinds:
        mixer, mlp = kind
        cost = ZERO
        if mixer:
            cost = cost + _mixer(x, mixer)
        if mlp:
            cost = cost + _mlp(x, mlp)
        out[kind] = cost
    return out


def activation_bytes(w: Workload, s: Strategy, lay: Layout, c: Constants, kind: LayerKind) -> tuple[float, float]:
    """(stored bytes of one layer of `kind`, bytes of the input kept by full recompute) per micro-batch,
    after Korthikanti et al. 2022; s² scores only where the attention backend is unfused."""
    m, t, T, h = w.model, lay.tp, lay.tokens, w.model.hidden_size
    sp = t if s.sequence_parallel else 1
    mixer, mlp = kind
    # fp8 (Transformer Engine) keeps the inputs of the GEMMs in fp8: 1 byte instead of 2.
    gemm_in = 1.0 if w.precision == "fp8" else 2.0
    norm_and_residual = (2.0 + gemm_in) * T * h / sp  # per sublayer: the norm's input (2 B) and output
    stored, dropped_by_selective = 0.0, 0.0
    n = m.num_attention_heads
    if mixer == "attention":
        q, kv = m.head_dim * n, m.head_dim * m.groups
        stored += norm_and_residual + 2.0 * T * (q + 2 * kv) / t + 4.0 * T * n / t  # q, k, v + softmax stats
        dropped_by_selective = gemm_in * T * q / t  # the attention output
    elif mixer == "mla":
        rope, qk, v = m.qk_pos_emb_head_dim, m.qk_head_dim, m.v_head_dim
        q_out = n * (qk + rope)
        compressed = 2.0 * T * (m.kv_lora_rank + rope + (m.q_lora_rank or 0)) * 2  # latents and their norms
        stored += norm_and_residual + compressed + 2.0 * T * (2 * q_out + n * v) / t + 4.0 * T * n / t
        dropped_by_selective = gemm_in * T * n * v / t
    elif mixer == "mamba":
        d_in, g, st, heads = 2 * h, m.mamba_num_groups, m.mamba_state_dim, m.mamba_heads
        proj_out = 2 * d_in + 2 * g * st + heads
        stored += norm_and_residual + 2.0 * T * (proj_out + (d_in + 2 * g * st) + 3 * d_in) / t
    if mlp == "dense":
        gate = (4 if m.swiglu else 2) + gemm_in  # FC1 output (2F when gated), and the activation's output
        stored += norm_and_residual + gate * T * m.ffn_hidden_size / t
    elif mlp == "moe":
        gate = (4 if m.swiglu else 2) + gemm_in
        routed = T * m.moe_router_topk
        stored += norm_and_residual + routed * (2.0 * h + gate * m.expert_ffn) / t + 4.0 * T * m.num_experts / sp
        if m.moe_shared_expert_intermediate_size:
            stored += gate * T * m.moe_shared_expert_intermediate_size / t
    if w.stores_attention_scores and mixer in ("attention", "mla"):
        # Korthikanti et al.'s 5·a·s²·b: scores and softmax (2 B each), dropout mask (1 B); what
        # selective recompute exists to drop.
        dropped_by_selective += 5.0 * T * (w.seq_length // s.cp) * n / t
    if s.recompute_granularity != "selective":
        stored += dropped_by_selective
    return stored * c.activation_scale, 2.0 * T * h / sp  # full recompute keeps each layer's input


def params_per_gpu(w: Workload, lay: Layout, kind: LayerKind) -> tuple[float, float]:
    """(dense, expert) parameters one GPU holds of one layer of `kind`: TP-split parts over TP,
    routed experts over EP·ETP, MLA's down projections and norms whole."""
    m = w.model
    mixer, mlp = kind
    split, replicated = m.mixer_params(mixer)
    dense_mlp, expert = m.mlp_params(mlp)
    return (split + dense_mlp) / lay.tp + replicated, expert / (lay.ep * lay.etp)

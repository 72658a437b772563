"""Model FLOPs per iteration, as Megatron-LM counts them (megatron/training/training.py,
num_floating_point_operations, core_v0.16.1): GQA, SwiGLU, MoE top-k with dense layers and
shared experts, MLA, causal attention, logits; hybrid Mamba/attention models with Megatron's
hybrid formula. Recompute is not counted — these are model FLOPs, the numerator of MFU.

A fact about the workload, not a model of the hardware: the replay reader needs it to turn a
measured step time into MFU, so it lives outside `optico.perfmodel` (which re-exports it).
"""

from __future__ import annotations

from optico.workload import ModelArch, Workload


def _attention_term(m: ModelArch, seq_length: int) -> float:
    """Per token, forward: the self-attention block's multiply-adds ×2 (Megatron's
    standard_self_attn_term without the 3× forward/backward factor)."""
    h, n = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        rope, qk, v = m.qk_pos_emb_head_dim, m.qk_head_dim, m.v_head_dim
        q_term = h * n * (qk + rope) if m.q_lora_rank is None else m.q_lora_rank * (h + n * (qk + rope) + 1)
        return 2 * (q_term + m.kv_lora_rank * (h + n * (qk + v) + 1) + h * rope + n * v * h
                    + seq_length * n * (qk + rope) / 2 + seq_length * n * v / 2)
    q, kv = m.head_dim * n, m.head_dim * m.groups
    return 2 * (h * (q + 2 * kv) + q * seq_length / 2 * 2 + q * h)


def _output_layer_forward(m: ModelArch, tp: int) -> float:
    """Per token, forward: the output layer's (logits') multiply-adds ×2, one output head."""
    return 2 * m.hidden_size * m.padded_vocab(tp)


def _transformer_flops_per_token(m: ModelArch, seq_length: int, tp: int) -> float:
    h, gate = m.hidden_size, 3 if m.swiglu else 2
    kinds = m.layer_kinds()
    mtp = m.mtp_num_layers or 0
    moe_layers = sum(1 for _, mlp in kinds if mlp == "moe") + (mtp if kinds[-1][1] == "moe" else 0)
    layers = m.num_layers + mtp
    dense_layers = layers - moe_layers
    mlp = h * gate * (m.ffn_hidden_size * dense_layers)
    if m.is_moe:
        shared = m.moe_shared_expert_intermediate_size or 0
        mlp += h * gate * (m.expert_ffn * m.moe_router_topk + shared) * moe_layers
    mtp_extra = 2 * mtp * (3 * h + 2 * h * h)
    return 3 * (2 * mlp + layers * _attention_term(m, seq_length) + mtp_extra
                + _output_layer_forward(m, tp) * (mtp + 1))


def _hybrid_flops_per_token(m: ModelArch, seq_length: int, tp: int) -> float:
    """Megatron-LM's hybrid_flops (forward ×3), per token."""
    h, s = m.hidden_size, seq_length
    pattern = m.hybrid_override_pattern or ""
    n_attn, n_mamba, n_mlp, n_moe = (pattern.count(c) for c in "*M-E")
    p = m.head_dim * m.num_attention_heads / h
    g = m.groups
    attn = 4 * h * p * (h + h * g / m.num_attention_heads + s / 2)
    mlp = 4 * (m.ffn_hidden_size / h) * (1.5 if m.swiglu else 1.0) * h * h
    d_in, st, groups, heads = 2 * h, m.mamba_state_dim, m.mamba_num_groups, m.mamba_heads
    mamba = 2 * h * (2 * d_in + 2 * groups * st + heads) + 7 * d_in * st + 2 * d_in * h
    scale = 1.5 if m.swiglu else 1.0
    moe = (4 * h * m.expert_ffn * m.moe_router_topk * scale
           + 4 * h * (m.moe_shared_expert_intermediate_size or 0) * scale) if m.is_moe else 0.0
    logits = _output_layer_forward(m, tp)
    return 3 * (n_attn * attn + n_mlp * mlp + n_mamba * mamba + n_moe * moe + logits)


def flops_per_token(m: ModelArch, seq_length: int, tp: int = 1) -> float:
    """Forward + backward model FLOPs for one token of a sequence of `seq_length`."""
    if m.is_hybrid:
        return _hybrid_flops_per_token(m, seq_length, tp)
    return _transformer_flops_per_token(m, seq_length, tp)


def core_attention_flops_per_token(m: ModelArch, seq_length: int) -> float:
    """The part of `flops_per_token` that the attention scores and their product with V take, causal:
    the part an older count that ignored the causal mask (Megatron-LM before core v0.12, NeMo before
    2025-08, Narayanan et al. 2021's Eq. 3) counted twice. It is the only part that grows with the
    sequence, in proportion, so it is what doubling the sequence adds."""
    return flops_per_token(m, 2 * seq_length) - flops_per_token(m, seq_length)


def logits_flops_per_token(m: ModelArch, tp: int = 1) -> float:
    """The part of `flops_per_token` that the output layer takes (forward and backward; with
    multi-token prediction, each head's)."""
    heads = 1 if m.is_hybrid else (m.mtp_num_layers or 0) + 1
    return 3 * _output_layer_forward(m, tp) * heads


def flops_per_iteration(w: Workload, tp: int = 1) -> float:
    """Model FLOPs of one global batch."""
    return w.global_batch_size * w.seq_length * flops_per_token(w.model, w.seq_length, tp)


def tflops_per_gpu(w: Workload, step_time_s: float, tp: int = 1) -> float:
    return flops_per_iteration(w, tp) / (step_time_s * 1e12 * w.world_size)


def mfu(w: Workload, step_time_s: float, tp: int = 1) -> float:
    return tflops_per_gpu(w, step_time_s, tp) / w.peak_tflops

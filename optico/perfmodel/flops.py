"""Model FLOPs per iteration, as Megatron-LM counts them (megatron/training/training.py,
num_floating_point_operations): GQA, SwiGLU, MoE top-k, causal attention, logits.
Recompute is not counted — these are model FLOPs, the numerator of MFU."""

from __future__ import annotations

from optico.workload import ModelArch, Workload


def flops_per_token(m: ModelArch, seq_length: int, tp: int = 1) -> float:
    """Forward + backward FLOPs for one token of a sequence of `seq_length`."""
    h, q = m.hidden_size, m.head_dim * m.num_attention_heads
    kv = m.head_dim * m.groups
    gate = 3 if m.swiglu else 2
    attention = 6 * (h * (q + 2 * kv) + q * h)
    if m.is_moe:
        mlp = 6 * h * m.expert_ffn * m.moe_router_topk * gate
        if m.moe_shared_expert_intermediate_size:
            mlp += 6 * h * m.moe_shared_expert_intermediate_size * gate
    else:
        mlp = 6 * h * m.ffn_hidden_size * gate
    core_attention = 6 * q * seq_length  # 12·q·s halved by the causal mask
    logits = 6 * h * m.padded_vocab(tp)
    return m.num_layers * (attention + mlp + core_attention) + logits


def flops_per_iteration(w: Workload, tp: int = 1) -> float:
    """Model FLOPs of one global batch."""
    return w.global_batch_size * w.seq_length * flops_per_token(w.model, w.seq_length, tp)


def tflops_per_gpu(w: Workload, step_time_s: float, tp: int = 1) -> float:
    return flops_per_iteration(w, tp) / (step_time_s * 1e12 * w.world_size)


def mfu(w: Workload, step_time_s: float, tp: int = 1) -> float:
    return tflops_per_gpu(w, step_time_s, tp) / w.peak_tflops

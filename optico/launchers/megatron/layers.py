"""Local (no Transformer Engine) building blocks for the benchmark model.

megatron-core's local layer spec computes attention with an explicit [b·n, s, s] score matrix
(DotProductAttention) and its torch norm refuses sequence parallelism. Without TE the
benchmark uses these two modules instead; both work on CUDA and on CPU:

- `SDPAttention`: core attention through ``torch.nn.functional.scaled_dot_product_attention``
  (flash / memory-efficient kernels on GPU), same constructor and call contract as
  megatron's DotProductAttention.
- `LocalNorm`: RMSNorm or LayerNorm whose parameters carry ``sequence_parallel`` so that
  finalize_model_grads all-reduces their gradients over the TP group under SP, as it does for
  TE's norms.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule


class SDPAttention(MegatronModule):
    """Causal self-attention core over torch SDPA.

    Inputs are megatron's [s, b, heads, head_dim] query and [s, b, groups, head_dim] key/value
    (GQA groups are expanded here); the output is [s, b, heads·head_dim] for this TP rank.
    """

    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None, **kwargs: Any):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context parallelism needs Transformer Engine's attention (TEDotProductAttention)")
        tp = pg_collection.tp.size() if pg_collection is not None and hasattr(pg_collection, "tp") \
            else parallel_state.get_tensor_model_parallel_world_size()
        if config.num_attention_heads % tp or config.num_query_groups % tp:
            raise ValueError(f"num_attention_heads ({config.num_attention_heads}) and num_query_groups "
                             f"({config.num_query_groups}) must be divisible by TP ({tp})")
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        self.head_dim = config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.attn_mask_type = attn_mask_type

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params: Any = None, **kwargs: Any):
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention supports neither packed sequences nor attention bias")
        s, b = query.shape[0], query.shape[1]
        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if self.groups != self.heads:
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal and attention_mask is None
        mask = None
        if attention_mask is not None:
            mask = ~attention_mask  # megatron's mask marks positions to drop; SDPA's marks keeps
        p = self.dropout if self.training else 0.0
        if p > 0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                     is_causal=causal, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=causal, scale=self.scale)
        # [b, n, s, d] -> [s, b, n·d]
        return out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.head_dim)


class LocalNorm(torch.nn.Module):
    """RMSNorm or LayerNorm (config.normalization) that supports sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **kwargs: Any):
        super().__init__()
        self.config = config
        self.rms = config.normalization == "RMSNorm"
        self.eps = eps
        self.shape = (hidden_size,)
        device = None
        if torch.cuda.is_available() and not config.use_cpu_initialization:
            device = torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        self.bias = None
        if not self.rms:
            self.bias = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype, device=device))
        for p in self.parameters():
            # finalize_model_grads all-reduces grads of params marked so over TP under SP.
            setattr(p, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)

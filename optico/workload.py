"""The fixed part of a tuning job: model architecture, sequence, batch, precision, cluster."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from optico.gpus import GPUS, GpuSpec, Precision, gpu_key


def positive_up_to(high: int) -> Any:
    """A positive integer of at most `high`: no real model or cluster is refused, and nothing that would
    make the arithmetic or a per-layer list blow up is accepted (a table's row with 10^9 layers)."""
    return Annotated[int, Field(gt=0, le=high)]


# Layer kinds: (mixer, mlp). A GPT layer has both; a hybrid model's pattern letters are one each
# (Megatron's --hybrid-override-pattern: M Mamba, * attention, - MLP, E MoE).
Mixer = Literal["attention", "mla", "mamba"]
Mlp = Literal["dense", "moe"]
AttentionBackend = Literal["auto", "flash", "fused", "unfused", "local"]
CrossEntropyFusionImpl = Literal["native", "te"]
LayerKind = tuple["Mixer | None", "Mlp | None"]
_HYBRID = {"M": ("mamba", None), "*": ("attention", None), "-": (None, "dense"), "E": (None, "moe")}
# Fields added after the first workload-key schema: left out of `Workload.key` at their default, so
# the keys of earlier pools (warm start) stay what they were.
_KEY_V1_OMIT_AT_DEFAULT = ("multi_latent_attention", "mtp_num_layers", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                           "qk_pos_emb_head_dim", "v_head_dim", "moe_layer_freq", "hybrid_override_pattern",
                           "mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads")


class ModelArch(BaseModel):
    """A GPT/Llama-style decoder, in Megatron-LM's argument names; with MLA attention
    (DeepSeek-V3, Moonlight, Kimi-K2), MoE layer patterns (dense first layers) and hybrid
    Mamba/attention layer patterns (Nemotron-H)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    num_layers: positive_up_to(1_024)
    hidden_size: positive_up_to(262_144)
    num_attention_heads: positive_up_to(4_096)
    num_query_groups: positive_up_to(4_096) | None = Field(None, description="GQA groups; None = multi-head attention.")
    kv_channels: positive_up_to(16_384) | None = Field(None, description="Head dimension; None = hidden_size / heads.")
    ffn_hidden_size: positive_up_to(1_048_576) = Field(description="Dense MLP width (per expert for MoE, see moe_ffn_hidden_size).")
    vocab_size: positive_up_to(16_777_216)
    swiglu: bool = True
    untie_embeddings_and_output_weights: bool = True
    num_experts: positive_up_to(4_096) | None = Field(None, description="Routed experts; None = dense model.")
    moe_router_topk: positive_up_to(256) = 2
    moe_ffn_hidden_size: positive_up_to(1_048_576) | None = Field(None, description="Per-expert FFN width; None = ffn_hidden_size.")
    moe_shared_expert_intermediate_size: positive_up_to(1_048_576) | None = None
    moe_layer_freq: positive_up_to(1_024) | list[Literal[0, 1]] = Field(
        1, description="Which layers are MoE: every Nth (N), or a 0/1 list per layer (Megatron-LM's "
                       "--moe-layer-freq); DeepSeek-V3 is three dense layers, then MoE.")
    multi_latent_attention: bool = Field(False, description="MLA: low-rank compressed q and kv (DeepSeek-V2/V3).")
    q_lora_rank: positive_up_to(65_536) | None = Field(None, description="MLA: query compression rank; None = no compression.")
    kv_lora_rank: positive_up_to(65_536) = Field(512, description="MLA: key/value compression rank.")
    qk_head_dim: positive_up_to(16_384) = Field(128, description="MLA: query/key head dimension without the RoPE part.")
    qk_pos_emb_head_dim: positive_up_to(16_384) = Field(64, description="MLA: the RoPE part of the query/key head.")
    v_head_dim: positive_up_to(16_384) = Field(128, description="MLA: value head dimension.")
    mtp_num_layers: positive_up_to(1_024) | None = Field(None, description="Multi-token prediction layers after the "
                                                                   "decoder (DeepSeek-V3: 1), on the last stage.")
    hybrid_override_pattern: str | None = Field(
        None, description="Hybrid model: one letter per layer, M Mamba, * attention, - MLP, E MoE "
                          "(Megatron-LM's --hybrid-override-pattern); None = a GPT decoder.")
    mamba_state_dim: positive_up_to(16_384) = 128
    mamba_head_dim: positive_up_to(16_384) = 64
    mamba_num_groups: positive_up_to(4_096) = 8
    mamba_num_heads: positive_up_to(65_536) | None = Field(None, description="None = 2·hidden / mamba_head_dim.")

    @model_validator(mode="after")
    def _check(self) -> "ModelArch":
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads \
                and not self.multi_latent_attention:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}) unless kv_channels is given")
        if self.num_query_groups and self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                f"num_query_groups ({self.num_query_groups})")
        if self.num_experts and self.moe_router_topk > self.num_experts:
            raise ValueError(
                f"moe_router_topk ({self.moe_router_topk}) must not exceed num_experts ({self.num_experts})")
        if isinstance(self.moe_layer_freq, list) and len(self.moe_layer_freq) != self.num_layers:
            raise ValueError(f"moe_layer_freq has {len(self.moe_layer_freq)} entries for {self.num_layers} layers")
        pattern = self.hybrid_override_pattern
        if pattern is not None:
            bad = set(pattern) - set(_HYBRID)
            if bad:
                raise ValueError(f"hybrid_override_pattern: unknown layer letters {''.join(sorted(bad))} "
                                 f"(M Mamba, * attention, - MLP, E MoE)")
            if len(pattern) != self.num_layers:
                raise ValueError(f"hybrid_override_pattern has {len(pattern)} layers, num_layers is {self.num_layers}")
            if "M" in pattern and self.mamba_heads % self.mamba_num_groups:
                # megatron-core's MambaMixer: every group holds a whole number of heads.
                raise ValueError(f"Mamba heads ({self.mamba_heads}) must be divisible by mamba_num_groups "
                                 f"({self.mamba_num_groups})")
        return self

    @property
    def groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts and self.num_experts > 1)

    @property
    def is_hybrid(self) -> bool:
        return self.hybrid_override_pattern is not None

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def mamba_heads(self) -> int:
        return self.mamba_num_heads or 2 * self.hidden_size // self.mamba_head_dim

    def dense_ffn_widths(self) -> list[tuple[str, int]]:
        """GEMM widths split over TP (not ETP): the dense MLP where the model has one, the shared
        expert. Megatron's column-parallel layers need them divisible by TP."""
        kinds = set(self._layer_kinds)
        out = []
        if any(mlp == "dense" for _, mlp in kinds):
            out.append(("ffn_hidden_size", self.ffn_hidden_size))
        if self.is_moe and self.moe_shared_expert_intermediate_size:
            out.append(("moe_shared_expert_intermediate_size", self.moe_shared_expert_intermediate_size))
        return out

    # -- layers --------------------------------------------------------------------------------
    def layer_kinds(self) -> list[LayerKind]:
        """(mixer, mlp) of every layer, in order."""
        return list(self._layer_kinds)

    @cached_property
    def _layer_kinds(self) -> tuple[LayerKind, ...]:
        return tuple(self._compute_layer_kinds())

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> "ModelArch":
        """A copy; a value cached from the original's fields is dropped, it may not hold for the copy's."""
        copy = super().model_copy(update=update, deep=deep)
        copy.__dict__.pop("_layer_kinds", None)
        return copy

    def _compute_layer_kinds(self) -> list[LayerKind]:
        if self.hybrid_override_pattern is not None:
            return [_HYBRID[c] for c in self.hybrid_override_pattern]
        mixer = "mla" if self.multi_latent_attention else "attention"
        if not self.is_moe:
            return [(mixer, "dense")] * self.num_layers
        freq = self.moe_layer_freq
        pattern = freq if isinstance(freq, list) else [1 if i % freq == 0 else 0 for i in range(self.num_layers)]
        return [(mixer, "moe" if p else "dense") for p in pattern]

    def mixer_params(self, mixer: str | None) -> tuple[float, float]:
        """(TP-split, replicated) parameters of one mixer: attention, MLA or Mamba (norm included)."""
        h = self.hidden_size
        if mixer == "attention":
            q, kv = self.head_dim * self.num_attention_heads, self.head_dim * self.groups
            return float(h * (q + 2 * kv) + q * h), float(h)
        if mixer == "mla":
            n, rope = self.num_attention_heads, self.qk_pos_emb_head_dim
            q_out = n * (self.qk_head_dim + rope)
            split = self.kv_lora_rank * n * (self.qk_head_dim + self.v_head_dim) + n * self.v_head_dim * h
            replicated = h * (self.kv_lora_rank + rope) + self.kv_lora_rank + h
            if self.q_lora_rank is None:
                split += h * q_out
            else:  # the down projections are not split over TP (megatron's MLA)
                split += self.q_lora_rank * q_out
                replicated += h * self.q_lora_rank + self.q_lora_rank
            return float(split), float(replicated)
        if mixer == "mamba":
            d_in, g, st, nh = 2 * h, self.mamba_num_groups, self.mamba_state_dim, self.mamba_heads
            in_proj = h * (2 * d_in + 2 * g * st + nh)
            conv = (d_in + 2 * g * st) * 4
            return float(in_proj + conv + 3 * nh + d_in + d_in * h), float(h)
        return 0.0, 0.0

    def mlp_params(self, mlp: str | None) -> tuple[float, float]:
        """(dense, expert) parameters of one MLP: dense, or MoE (all routed experts as expert
        parameters; router and shared expert as dense)."""
        h, gate = self.hidden_size, 3 if self.swiglu else 2
        if mlp == "dense":
            return float(gate * h * self.ffn_hidden_size + h), 0.0
        if mlp == "moe":
            dense = h * self.num_experts + h
            if self.moe_shared_expert_intermediate_size:
                dense += gate * h * self.moe_shared_expert_intermediate_size
            return float(dense), float(self.num_experts * gate * h * self.expert_ffn)
        return 0.0, 0.0

    def layer_params(self) -> tuple[float, float]:
        """(mixers + norms, MLPs) parameters averaged over the layers (all experts for MoE)."""
        mix, mlp = 0.0, 0.0
        for mixer, kind in self.layer_kinds():
            mix += sum(self.mixer_params(mixer))
            mlp += sum(self.mlp_params(kind))
        return mix / self.num_layers, mlp / self.num_layers

    def padded_vocab(self, tp: int = 1, divisible_by: int = 128) -> int:
        """Megatron pads the vocabulary to a multiple of 128·TP."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def mtp_params(self) -> float:
        """Parameters of the multi-token-prediction layers (each: a decoder layer like the last,
        two norms and the 2h -> h projection; the output layer is shared)."""
        if not self.mtp_num_layers:
            return 0.0
        mixer, mlp = self.layer_kinds()[-1]
        h = self.hidden_size
        return self.mtp_num_layers * (sum(self.mixer_params(mixer)) + sum(self.mlp_params(mlp)) + 2 * h * h + 3 * h)

    def num_params(self) -> float:
        attention, mlp = self.layer_params()
        embed = self.padded_vocab() * self.hidden_size
        outputs = embed if self.untie_embeddings_and_output_weights else 0
        return self.num_layers * (attention + mlp) + embed + outputs + self.hidden_size + self.mtp_params()


def _llama(name: str, layers: int, hidden: int, heads: int, groups: int | None, ffn: int, vocab: int,
           **extra) -> ModelArch:
    return ModelArch(name=name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                     num_query_groups=groups, ffn_hidden_size=ffn, vocab_size=vocab, **extra)


PRESETS: dict[str, ModelArch] = {
    m.name: m
    for m in [
        _llama("llama2-7b", 32, 4096, 32, None, 11008, 32000),
        _llama("llama2-13b", 40, 5120, 40, None, 13824, 32000),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
        _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
        # Llama 3.2 (HF configs): tied embeddings, head dim hidden/heads (64 and 128).
        _llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, untie_embeddings_and_output_weights=False),
        _llama("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, untie_embeddings_and_output_weights=False),
        _llama("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, untie_embeddings_and_output_weights=False),
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
        _llama("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064),
        _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064),
        # Megatron's GPT-3 family: GeLU MLP of 4h, multi-head attention, GPT-2 vocabulary.
        _llama("gpt3-7b", 32, 4096, 32, None, 16384, 50257, swiglu=False),
        # NeMo's GPTConfig5B / GPTConfig20B (its performance tables' 'GPT3-5B', 'GPT3-20B'): tied, as GPTConfig is.
        _llama("gpt3-5b", 24, 4096, 32, None, 16384, 50257, swiglu=False, untie_embeddings_and_output_weights=False),
        _llama("gpt3-20b", 44, 6144, 48, None, 24576, 50257, swiglu=False, untie_embeddings_and_output_weights=False),
        _llama("gpt3-175b", 96, 12288, 96, None, 49152, 50257, swiglu=False),
        # Nemotron-4 (NeMo Nemotron4Config15B / 340B): squared-ReLU MLP, GQA 8 groups, untied, 256k
        # vocabulary; its partial rotary embedding and LayerNorm are not modelled (neither moves time).
        _llama("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, swiglu=False),
        # Nemotron-3 (NeMo Nemotron3Config8B / 22B; the tables' 'Nemotron-8B', 'Nemotron-22B'): the same MLP
        # and vocabulary, multi-head attention.
        _llama("nemotron3-8b", 32, 4096, 32, None, 16384, 256000, swiglu=False),
        _llama("nemotron3-22b", 40, 6144, 48, None, 24576, 256000, swiglu=False),
        _llama("nemotron4-340b", 96, 18432, 96, 8, 73728, 256000, swiglu=False),
        # Qwen3-30B-A3B: 128 experts, top-8, head dim 128 (not hidden/heads).
        _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, kv_channels=128,
               num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768),
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, num_experts=8, moe_router_topk=2),
        _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, num_experts=8, moe_router_topk=2),
        _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, kv_channels=128,
               num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=1536),
        # OpenAI's gpt-oss (HF configs): head dim 64 (not hidden/heads), every layer MoE, top-4; its
        # banded-window attention on every second layer and attention sinks are not modelled.
        _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, kv_channels=64, num_experts=128,
               moe_router_topk=4),
        _llama("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, kv_channels=64, num_experts=32, moe_router_topk=4),
        # xAI's Grok-1 release config: 64 layers, 8 experts top-2, gated expert FFN 32768 (GeGLU).
        _llama("grok-1", 64, 6144, 48, 8, 32768, 131072, num_experts=8, moe_router_topk=2),
        # Llama 4 Maverick (HF config): MoE on every second layer, 128 experts top-1 plus a shared expert.
        _llama("llama4-maverick", 48, 5120, 40, 8, 16384, 202048, kv_channels=128, num_experts=128,
               moe_router_topk=1, moe_ffn_hidden_size=8192, moe_shared_expert_intermediate_size=8192,
               moe_layer_freq=[i % 2 for i in range(48)]),
        # Llama 4 Scout (HF config, Megatron-LM's example arguments): every layer MoE, 16 experts top-1
        # plus a shared expert.
        _llama("llama4-scout", 48, 5120, 40, 8, 16384, 202048, kv_channels=128, num_experts=16,
               moe_router_topk=1, moe_ffn_hidden_size=8192, moe_shared_expert_intermediate_size=8192),
        # MLA models (HF configs / Megatron-Bridge providers): DeepSeek-V3 and Kimi-K2 (first layers
        # dense, one shared expert), Moonlight / DeepSeek-V2-Lite (no query compression).
        _llama("deepseek-v3", 61, 7168, 128, None, 18432, 129280, multi_latent_attention=True, q_lora_rank=1536,
               num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
               moe_layer_freq=[0] * 3 + [1] * 58, mtp_num_layers=1),
        _llama("kimi-k2", 61, 7168, 64, None, 18432, 163840, multi_latent_attention=True, q_lora_rank=1536,
               num_experts=384, moe_router_topk=8, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
               moe_layer_freq=[0] + [1] * 60),
        _llama("moonlight-16b-a3b", 27, 2048, 16, None, 11264, 163840, multi_latent_attention=True,
               num_experts=64, moe_router_topk=6, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2816,
               moe_layer_freq=[0] + [1] * 26),
        _llama("deepseek-v2-lite", 27, 2048, 16, None, 10944, 102400, multi_latent_attention=True,
               num_experts=64, moe_router_topk=6, moe_ffn_hidden_size=1408, moe_shared_expert_intermediate_size=2816,
               moe_layer_freq=[0] + [1] * 26),
        # Hybrid Mamba/attention (NeMo NemotronHConfig*): squared-ReLU MLPs, GQA 8 groups.
        _llama("nemotron-h-8b", 52, 4096, 32, 8, 21504, 131072, swiglu=False,
               hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
        _llama("nemotron-h-47b", 98, 8192, 64, 8, 30720, 131072, swiglu=False, mamba_state_dim=256,
               hybrid_override_pattern="M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
                                       "M-M---MM---M-M*-M-M-M-M-M-"),
        _llama("nemotron-h-56b", 118, 8192, 64, 8, 32768, 131072, swiglu=False, mamba_state_dim=256,
               hybrid_override_pattern="M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-"
                                       "M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"),
        # A tiny model for CPU runs of the real megatron-core driver.
        _llama("tiny-gpt", 4, 64, 4, 2, 128, 1024),
        _llama("tiny-moe", 4, 64, 4, 2, 128, 1024, num_experts=4, moe_router_topk=2),
    ]
}


class Cluster(BaseModel):
    """Where the job runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str = Field(description="A GPU catalog key (see `optico.gpus.GPUS`), e.g. 'h100-sxm'.")
    gpus_per_node: positive_up_to(1_024) = 8
    nodes: positive_up_to(65_536) = 1
    num_gpus: positive_up_to(1_048_576) | None = Field(None, description="GPUs the job uses; None = all of the cluster.")
    interconnect: Literal["nvlink", "pcie"] = "nvlink"
    network_gbps: float | None = Field(None, gt=0, description="Inter-node GB/s per GPU; None = catalog value.")

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, name: str) -> str:
        return gpu_key(name)

    @model_validator(mode="after")
    def _check(self) -> "Cluster":
        total = self.gpus_per_node * self.nodes
        if self.num_gpus is not None and self.num_gpus > total:
            raise ValueError(f"num_gpus ({self.num_gpus}) is more than the cluster has "
                             f"({self.nodes} node(s) x {self.gpus_per_node} GPUs = {total})")
        return self

    @property
    def world_size(self) -> int:
        return self.num_gpus or self.gpus_per_node * self.nodes

    def keeps_in_node(self, span: int) -> bool:
        """Whether every group of `span` consecutive ranks stays inside one node: the span divides the
        node, or the whole job fits in one node (an NVL72 domain). Otherwise some groups straddle two."""
        return span <= self.gpus_per_node and (self.gpus_per_node % span == 0
                                               or self.world_size <= self.gpus_per_node)

    @property
    def nodes_used(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    @property
    def inter_node_gbps(self) -> float:
        return self.network_gbps or self.spec.network_gbps

    @property
    def spec(self) -> GpuSpec:
        return GPUS[self.gpu]


class Framework(BaseModel):
    """The software the job trains with; part of a trial's fingerprint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    megatron_core: str | None = None
    image: str | None = None


class Workload(BaseModel):
    """Everything fixed for a tuning job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelArch
    seq_length: positive_up_to(16_777_216)
    global_batch_size: positive_up_to(1_048_576)
    precision: Precision = "bf16"
    grad_reduce_in_fp32: bool | None = Field(
        None, description="Gradient buffers (accumulation and DP reduction) in fp32. None = Megatron-LM's rule: "
                          "fp32 for bf16/fp8, the parameter dtype for fp16 (--accumulate-allreduce-grads-in-fp32). "
                          "NeMo and Megatron-Bridge performance recipes set it False.")
    attention_backend: AttentionBackend = Field(
        "auto", description="Megatron-LM's --attention-backend; 'local' also stands for --transformer-impl local. "
                            "'unfused' and 'local' keep the s² attention scores in memory; the others do not.")
    cross_entropy_fusion_impl: CrossEntropyFusionImpl = Field(
        "native", description="Megatron's --cross-entropy-fusion-impl: the kernel a fused cross entropy runs. "
                              "'native' (megatron-core's default) keeps a float32 copy of the logits beside "
                              "the float32 softmax, so the fusion costs memory; 'te' (Transformer Engine's, "
                              "which NeMo and Megatron-Bridge recipes set) saves it.")
    cluster: Cluster
    framework: Framework = Framework()

    @model_validator(mode="after")
    def _check(self) -> "Workload":
        if self.precision not in self.cluster.spec.peak_tflops:
            # fp8 GEMMs need fp8 tensor cores (Ada, Hopper, Blackwell, CDNA3), bf16 ones Ampere or later.
            instead = " or ".join(p for p in ("bf16", "fp16") if p in self.cluster.spec.peak_tflops)
            raise ValueError(f"precision: {self.precision} needs a GPU with {self.precision} tensor cores; "
                             f"{self.cluster.gpu} has none (use {instead})")
        if self.precision == "fp8" and self.attention_backend == "local":
            raise ValueError("precision: fp8 needs Transformer Engine; attention_backend local "
                             "(--transformer-impl local) has none")
        if self.cross_entropy_fusion_impl == "te" and self.attention_backend == "local":
            raise ValueError("cross_entropy_fusion_impl: te needs Transformer Engine; attention_backend local "
                             "(--transformer-impl local) has none")
        return self

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def peak_tflops(self) -> float:
        return self.cluster.spec.peak(self.precision)

    @property
    def stores_attention_scores(self) -> bool:
        """Unfused core attention keeps QKᵀ, its softmax and the dropout mask for the backward."""
        return self.attention_backend in ("unfused", "local")

    @property
    def grads_in_fp32(self) -> bool:
        """Whether gradient buffers are fp32 (4 B/param) rather than the 2-byte parameter dtype."""
        return self.precision != "fp16" if self.grad_reduce_in_fp32 is None else self.grad_reduce_in_fp32

    def key(self) -> str:
        """Identity for warm starts: jobs with the same key share what they learned."""
        payload = self.model_dump(mode="json", exclude={"framework": True, "model": {"name"}})
        for name in ("grad_reduce_in_fp32", "attention_backend", "cross_entropy_fusion_impl"):
            if payload[name] == Workload.model_fields[name].default:
                del payload[name]  # the default: keys of earlier pools stay valid
        for name in _KEY_V1_OMIT_AT_DEFAULT:  # likewise for architecture fields added later
            if payload["model"][name] == ModelArch.model_fields[name].default:
                del payload["model"][name]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.model.name} seq {self.seq_length} GBS {self.global_batch_size} {self.precision} "
                f"on {self.cluster.nodes}x{self.cluster.gpus_per_node} {self.cluster.gpu}")

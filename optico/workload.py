"""The fixed part of a tuning job: model architecture, sequence, batch, precision, cluster."""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from optico.gpus import GPUS, GpuSpec, Precision, normalize_gpu_name


class ModelArch(BaseModel):
    """A GPT/Llama-style decoder, in Megatron-LM's argument names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_query_groups: PositiveInt | None = Field(None, description="GQA groups; None = multi-head attention.")
    kv_channels: PositiveInt | None = Field(None, description="Head dimension; None = hidden_size / heads.")
    ffn_hidden_size: PositiveInt = Field(description="Dense MLP width (per expert for MoE, see moe_ffn_hidden_size).")
    vocab_size: PositiveInt
    swiglu: bool = True
    untie_embeddings_and_output_weights: bool = True
    num_experts: PositiveInt | None = Field(None, description="Routed experts; None = dense model.")
    moe_router_topk: PositiveInt = 2
    moe_ffn_hidden_size: PositiveInt | None = Field(None, description="Per-expert FFN width; None = ffn_hidden_size.")
    moe_shared_expert_intermediate_size: PositiveInt | None = None

    @model_validator(mode="after")
    def _check(self) -> "ModelArch":
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
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
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def dense_ffn_widths(self) -> list[tuple[str, int]]:
        """GEMM widths split over TP (not ETP): the dense MLP where the model has one, the shared
        expert. Megatron's column-parallel layers need them divisible by TP."""
        out = []
        if not self.is_moe:
            out.append(("ffn_hidden_size", self.ffn_hidden_size))
        if self.moe_shared_expert_intermediate_size:
            out.append(("moe_shared_expert_intermediate_size", self.moe_shared_expert_intermediate_size))
        return out

    def padded_vocab(self, tp: int = 1, divisible_by: int = 128) -> int:
        """Megatron pads the vocabulary to a multiple of 128·TP."""
        multiple = divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple

    def layer_params(self) -> tuple[float, float]:
        """(attention + norms, MLP) parameters of one transformer layer (all experts for MoE)."""
        h, q = self.hidden_size, self.head_dim * self.num_attention_heads
        kv = self.head_dim * self.groups
        attention = h * (q + 2 * kv) + q * h + 2 * h
        gate = 3 if self.swiglu else 2
        if self.is_moe:
            mlp = self.num_experts * gate * h * self.expert_ffn + h * self.num_experts
            if self.moe_shared_expert_intermediate_size:
                mlp += gate * h * self.moe_shared_expert_intermediate_size
        else:
            mlp = gate * h * self.ffn_hidden_size
        return float(attention), float(mlp)

    def num_params(self) -> float:
        attention, mlp = self.layer_params()
        embed = self.padded_vocab() * self.hidden_size
        outputs = embed if self.untie_embeddings_and_output_weights else 0
        return self.num_layers * (attention + mlp) + embed + outputs + self.hidden_size


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
        _llama("qwen2.5-0.5b", 24, 896, 14, 2, 4864, 151936, untie_embeddings_and_output_weights=False),
        _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
        _llama("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064),
        _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064),
        # Megatron's GPT-3 family: GeLU MLP of 4h, multi-head attention, GPT-2 vocabulary.
        _llama("gpt3-7b", 32, 4096, 32, None, 16384, 50257, swiglu=False),
        _llama("gpt3-175b", 96, 12288, 96, None, 49152, 50257, swiglu=False),
        # Qwen3-30B-A3B: 128 experts, top-8, head dim 128 (not hidden/heads).
        _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, kv_channels=128,
               num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768),
        _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, num_experts=8, moe_router_topk=2),
        # A tiny model for CPU runs of the real megatron-core driver.
        _llama("tiny-gpt", 4, 64, 4, 2, 128, 1024),
        _llama("tiny-moe", 4, 64, 4, 2, 128, 1024, num_experts=4, moe_router_topk=2),
    ]
}


class Cluster(BaseModel):
    """Where the job runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str = Field(description="A GPU catalog key (see `optico.gpus.GPUS`), e.g. 'h100-sxm'.")
    gpus_per_node: PositiveInt = 8
    nodes: PositiveInt = 1
    num_gpus: PositiveInt | None = Field(None, description="GPUs the job uses; None = all of the cluster.")
    interconnect: Literal["nvlink", "pcie"] = "nvlink"
    network_gbps: float | None = Field(None, gt=0, description="Inter-node GB/s per GPU; None = catalog value.")

    @model_validator(mode="after")
    def _check(self) -> "Cluster":
        key = normalize_gpu_name(self.gpu)
        if key not in GPUS:
            raise ValueError(f"unknown GPU {self.gpu!r}; known: {', '.join(sorted(GPUS))}")
        object.__setattr__(self, "gpu", key)
        total = self.gpus_per_node * self.nodes
        if self.num_gpus is not None and self.num_gpus > total:
            raise ValueError(f"num_gpus ({self.num_gpus}) is more than the cluster has "
                             f"({self.nodes} node(s) x {self.gpus_per_node} GPUs = {total})")
        return self

    @property
    def world_size(self) -> int:
        return self.num_gpus or self.gpus_per_node * self.nodes

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
    seq_length: PositiveInt
    global_batch_size: PositiveInt
    precision: Precision = "bf16"
    grad_reduce_in_fp32: bool | None = Field(
        None, description="Gradient buffers (accumulation and DP reduction) in fp32. None = Megatron-LM's rule: "
                          "fp32 for bf16/fp8, the parameter dtype for fp16 (--accumulate-allreduce-grads-in-fp32). "
                          "NeMo and Megatron-Bridge performance recipes set it False.")
    cluster: Cluster
    framework: Framework = Framework()

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def peak_tflops(self) -> float:
        return self.cluster.spec.peak(self.precision)

    @property
    def grads_in_fp32(self) -> bool:
        """Whether gradient buffers are fp32 (4 B/param) rather than the 2-byte parameter dtype."""
        return self.precision != "fp16" if self.grad_reduce_in_fp32 is None else self.grad_reduce_in_fp32

    def key(self) -> str:
        """Identity for warm starts: jobs with the same key share what they learned."""
        payload = self.model_dump(mode="json", exclude={"framework": True, "model": {"name"}})
        if payload["grad_reduce_in_fp32"] is None:
            del payload["grad_reduce_in_fp32"]  # the default: keys of earlier pools stay valid
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        return (f"{self.model.name} seq {self.seq_length} GBS {self.global_batch_size} {self.precision} "
                f"on {self.cluster.nodes}x{self.cluster.gpus_per_node} {self.cluster.gpu}")

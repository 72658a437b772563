"""What is tuned: one Megatron parallel/memory/overlap configuration.

Field names are Megatron-LM's argument names, so a strategy renders to flags
one-to-one. The data-parallel size is derived (world / (TP·PP·CP)), never set.
Validity against a workload lives in `optico.rules`.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

RecomputeGranularity = Literal["full", "selective"]
RecomputeMethod = Literal["uniform", "block"]
Dispatcher = Literal["allgather", "alltoall", "flex"]


class Strategy(BaseModel):
    """A complete configuration of the tuned knobs. Defaults are Megatron-LM's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tensor_model_parallel_size: PositiveInt = 1
    pipeline_model_parallel_size: PositiveInt = 1
    context_parallel_size: PositiveInt = 1
    expert_model_parallel_size: PositiveInt = 1
    virtual_pipeline_model_parallel_size: PositiveInt | None = Field(
        None, description="Model chunks per pipeline rank (interleaved 1F1B); None or 1 = not interleaved.")
    micro_batch_size: PositiveInt = 1
    sequence_parallel: bool = False
    recompute_granularity: RecomputeGranularity | None = None
    recompute_method: RecomputeMethod | None = None
    recompute_num_layers: PositiveInt | None = None
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    cross_entropy_loss_fusion: bool = False
    decoder_first_pipeline_num_layers: PositiveInt | None = None
    decoder_last_pipeline_num_layers: PositiveInt | None = None
    overlap_p2p_comm: bool = True
    batch_p2p_comm: bool = False
    moe_token_dispatcher_type: Dispatcher = "allgather"
    moe_grouped_gemm: bool = False

    # -- derived facts -------------------------------------------------------------
    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.context_parallel_size

    @property
    def ep(self) -> int:
        return self.expert_model_parallel_size

    @property
    def vpp(self) -> int:
        """Chunks per pipeline rank, 1 when not interleaved."""
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def mbs(self) -> int:
        return self.micro_batch_size

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    def dp(self, world_size: int) -> int:
        return world_size // self.model_parallel_size

    def num_microbatches(self, world_size: int, global_batch_size: int) -> int:
        return global_batch_size // (self.mbs * self.dp(world_size))

    @property
    def recompute(self) -> str:
        """'none', 'selective' or 'full' — the paper's AC knob."""
        return self.recompute_granularity or "none"

    # -- identity --------------------------------------------------------------------
    def normalized(self) -> "Strategy":
        """The same configuration written one way: VPP 1 is no VPP; recompute method and
        layer count mean nothing without full recompute."""
        return self._normalized

    @cached_property
    def _normalized(self) -> "Strategy":
        updates: dict[str, Any] = {}
        if self.virtual_pipeline_model_parallel_size == 1:
            updates["virtual_pipeline_model_parallel_size"] = None
        if self.recompute_granularity != "full":
            updates["recompute_method"] = None
            updates["recompute_num_layers"] = None
        elif self.recompute_method is None:
            updates["recompute_method"] = "uniform"
        if self.recompute_granularity == "full" and self.recompute_num_layers is None:
            updates["recompute_num_layers"] = 1
        return self.model_copy(update=updates) if updates else self

    def signature(self) -> str:
        """Canonical identity for duplicate checks: equal for equivalent configurations."""
        return self._signature

    @cached_property
    def _signature(self) -> str:
        payload = json.dumps(self.normalized().model_dump(mode="json"), sort_keys=True)
        return hashlib.sha1(payload.encode()).hexdigest()[:16]

    def changed(self, **updates: Any) -> "Strategy":
        """A validated copy with `updates` applied (model_copy does not validate)."""
        data = self.model_dump()
        data.update(updates)
        return Strategy.model_validate(data).normalized()

    def diff(self, other: "Strategy") -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ: name -> (self's, other's)."""
        a, b = self.normalized().model_dump(), other.normalized().model_dump()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    # -- rendering -------------------------------------------------------------------
    def megatron_args(self) -> list[str]:
        """Megatron-LM command-line flags for this strategy."""
        s = self.normalized()
        args = [
            "--tensor-model-parallel-size", str(s.tp),
            "--pipeline-model-parallel-size", str(s.pp),
            "--context-parallel-size", str(s.cp),
            "--micro-batch-size", str(s.mbs),
        ]
        if s.ep > 1:
            args += ["--expert-model-parallel-size", str(s.ep)]
        if s.virtual_pipeline_model_parallel_size:
            args += ["--num-virtual-stages-per-pipeline-rank", str(s.virtual_pipeline_model_parallel_size)]
        if s.decoder_first_pipeline_num_layers:
            args += ["--decoder-first-pipeline-num-layers", str(s.decoder_first_pipeline_num_layers)]
        if s.decoder_last_pipeline_num_layers:
            args += ["--decoder-last-pipeline-num-layers", str(s.decoder_last_pipeline_num_layers)]
        if s.sequence_parallel:
            args.append("--sequence-parallel")
        if s.recompute_granularity:
            args += ["--recompute-granularity", s.recompute_granularity]
        if s.recompute_method:
            args += ["--recompute-method", s.recompute_method, "--recompute-num-layers", str(s.recompute_num_layers)]
        for flag, on in [
            ("--use-distributed-optimizer", s.use_distributed_optimizer),
            ("--overlap-grad-reduce", s.overlap_grad_reduce),
            ("--overlap-param-gather", s.overlap_param_gather),
            ("--tp-comm-overlap", s.tp_comm_overlap),
            ("--cross-entropy-loss-fusion", s.cross_entropy_loss_fusion),
            ("--moe-grouped-gemm", s.moe_grouped_gemm),
        ]:
            if on:
                args.append(flag)
        if s.virtual_pipeline_model_parallel_size and not s.overlap_p2p_comm:
            args.append("--no-overlap-p2p-communication")
        if s.ep > 1 or s.moe_token_dispatcher_type != "allgather":
            args += ["--moe-token-dispatcher-type", s.moe_token_dispatcher_type]
        return args

    def short(self) -> str:
        """A one-line summary for tables: 'TP2 PP1 CP1 MBS1 AC=none DO'."""
        s = self.normalized()
        parts = [f"TP{s.tp}", f"PP{s.pp}"]
        if s.vpp > 1:
            parts.append(f"VPP{s.vpp}")
        if s.cp > 1:
            parts.append(f"CP{s.cp}")
        if s.ep > 1:
            parts.append(f"EP{s.ep}")
        parts.append(f"MBS{s.mbs}")
        ac = s.recompute
        if s.recompute_granularity == "full":
            ac += f"/{s.recompute_method}{s.recompute_num_layers}"
        parts.append(f"AC={ac}")
        flags = [name for name, on in [("SP", s.sequence_parallel), ("DO", s.use_distributed_optimizer),
                                       ("OG", s.overlap_grad_reduce), ("OP", s.overlap_param_gather),
                                       ("TPO", s.tp_comm_overlap), ("CE", s.cross_entropy_loss_fusion)] if on]
        if s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers:
            parts.append(f"first{s.decoder_first_pipeline_num_layers or '-'}/last{s.decoder_last_pipeline_num_layers or '-'}")
        return " ".join(parts + flags)


FIELDS: tuple[str, ...] = tuple(Strategy.model_fields)

# Short names accepted in specs and printed in suggestions, as the paper writes them.
ALIASES: dict[str, str] = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "vpp": "virtual_pipeline_model_parallel_size",
    "mbs": "micro_batch_size",
    "sp": "sequence_parallel",
    "recompute": "recompute_granularity",
    "distributed_optimizer": "use_distributed_optimizer",
}

PAPER_NAMES: dict[str, str] = {
    "tensor_model_parallel_size": "TP",
    "pipeline_model_parallel_size": "PP",
    "context_parallel_size": "CP",
    "expert_model_parallel_size": "EP",
    "virtual_pipeline_model_parallel_size": "VPP",
    "micro_batch_size": "MICRO_BATCH_SIZE",
    "sequence_parallel": "SEQUENCE_PARALLEL",
    "recompute_granularity": "AC",
    "recompute_method": "AC_METHOD",
    "recompute_num_layers": "AC_LAYERS",
    "use_distributed_optimizer": "DISTRIBUTED_OPTIMIZER",
    "overlap_grad_reduce": "OVERLAP_GRAD_REDUCE",
    "overlap_param_gather": "OVERLAP_PARAM_GATHER",
    "tp_comm_overlap": "TP_COMM_OVERLAP",
    "cross_entropy_loss_fusion": "FUSED_CROSS_ENTROPY",
    "decoder_first_pipeline_num_layers": "FIRST_PP_NUM_LAYERS",
    "decoder_last_pipeline_num_layers": "LAST_PP_NUM_LAYERS",
    "overlap_p2p_comm": "OVERLAP_P2P_COMM",
    "batch_p2p_comm": "BATCH_P2P_COMM",
    "moe_token_dispatcher_type": "MOE_DISPATCHER",
    "moe_grouped_gemm": "MOE_GROUPED_GEMM",
}
_FROM_PAPER = {v.lower(): k for k, v in PAPER_NAMES.items()}


def canonical_field(name: str) -> str:
    """Resolves 'tp', 'TP', 'MICRO_BATCH_SIZE' or a Megatron name to the Strategy field.

    Raises KeyError naming the accepted names when `name` is none of them."""
    key = name.strip().lower().replace("-", "_").lstrip("_")
    if key in Strategy.model_fields:
        return key
    if key in ALIASES:
        return ALIASES[key]
    if key in _FROM_PAPER:
        return _FROM_PAPER[key]
    raise KeyError(f"unknown strategy parameter {name!r}; known: {', '.join(FIELDS)} "
                   f"(short names: {', '.join(ALIASES)})")


def strategy_from_mapping(data: dict[str, Any]) -> Strategy:
    """Builds a Strategy from a mapping that may use short or paper names.

    'recompute: none' is accepted for no recompute."""
    resolved: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = canonical_field(str(raw_key))
        if key == "recompute_granularity" and isinstance(value, str) and value.lower() in ("none", "no", "off"):
            value = None
        resolved[key] = value
    return Strategy.model_validate(resolved).normalized()


def display_value(field: str, value: Any) -> str:
    """How a value is written in suggestions: AC None -> 'none'."""
    if field == "recompute_granularity" and value is None:
        return "none"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

"""One declaration per tuned knob: the registry every other part reads.

A knob is a Megatron-LM argument OptiCo may change. Its `Knob` entry says everything the
project needs to know about it, in one place:

- identity: the `Strategy` field (Megatron-LM's argument name), the OptiCo paper's name, short
  aliases, the replay-CSV column, the Megatron-LM flag(s) it owns and how it renders;
- its domain: the Python type, Megatron-LM's default, the values worth trying on a workload;
- markers: MoE-only, Transformer-Engine-only, part of the parallel layout;
- couplings: `Requires` entries — what must hold while the knob is not at its default, each
  with the sentence a rejected candidate shows; the rules check them and generation repairs
  them by resetting the knob;
- its effect on the performance model: prose for prompts and docs, and `terms` — the
  `TimeBreakdown` / `MemoryBreakdown` fields it moves (a test checks it moves them);
- `memory_order`: a key that grows as the knob saves memory on a workload (the guard's OOM implication).

Adding a knob: one entry here (and, if it touches the model, the term in `optico/perfmodel/`,
and the regenerated table in docs/spec.md). `Strategy`, the rules, the search space, repairs,
flag rendering, the replay reader and the prompts' parameter table read this module.
"""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

from pydantic import NonNegativeInt, PositiveInt

if TYPE_CHECKING:
    from optico.strategy import Strategy
    from optico.workload import Workload

Render = Literal["always", "value", "switch", "negated", "none"] | Callable[["Strategy"], list[str]]

# Signature schema (see `Strategy.signature`). Knobs with `since` <= SIGNATURE_BASE_VERSION are
# hashed with every value, as version 1 did; knobs added later only when not at their default,
# so adding a knob with a default changes no stored signature.
SIGNATURE_BASE_VERSION = 1


@dataclass(frozen=True)
class Violation:
    """One broken rule: the Strategy fields involved and a sentence with the numbers."""

    params: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Requires:
    """A coupling: while the knob is off its default, `holds(strategy, workload)` must be true.

    `involves` are the other fields the rule reads (they are blamed too); `message` is shown
    when it breaks. Repair resets the knob to its default."""

    holds: Callable[["Strategy", "Workload"], bool]
    message: str  # a format string over `s` (the strategy) and `w` (the workload)
    involves: tuple[str, ...] = ()
    source: str = "Megatron-LM validate_args"

    def text(self, s: "Strategy", w: "Workload") -> str:
        return self.message.format(s=s, w=w)


@dataclass(frozen=True)
class Knob:
    name: str
    paper: str
    annotation: Any
    default: Any
    doc: str
    flags: tuple[str, ...] = ()  # Megatron-LM flags this knob owns; the first is the one rendered
    render: Render = "value"
    aliases: tuple[str, ...] = ()
    csv: str | None = None  # replay-CSV column
    since: int = 1  # signature schema version that added it
    moe_only: bool = False
    te_only: bool = False
    layout: bool = False  # part of the parallel layout (placement of layers and ranks)
    tunable: bool = False  # tuned by default when a spec names no tunables
    requires: tuple[Requires, ...] = ()
    effect: str = ""
    terms: tuple[str, ...] = ()
    probe: tuple[dict[str, Any], Any] | None = None  # (context, value) where the effect shows; see tests
    domain: Callable[["Workload"], list[Any]] | None = None
    similarity: float = 0.2  # weight of a difference in this knob when comparing strategies
    memory_order: Callable[["Strategy", "Workload"], float] | None = None
    # The value Megatron's published recipes set (NeMo, Megatron-Bridge): where a default search space
    # is too large, `optico.search_space.TRIM_ORDER` fixes the knob here. None = not a recipe flag.
    recipe: Any = None
    # Where the knob's value changes neither the Megatron-LM command nor what the driver builds (so two
    # strategies differing only here are one launch: `Strategy.launch_key`). None = it always matters.
    inert: Callable[["Strategy"], bool] | None = None
    mcore: tuple[str, str] | None = None  # (config, field) the benchmark driver sets: transformer / ddp
    value_names: dict[Any, str] = field(default_factory=dict)  # how values are written: None -> "none"

    @property
    def is_bool(self) -> bool:
        return self.annotation is bool

    @staticmethod
    def negates(flag: str) -> bool:
        """A `--no-...` flag states the opposite of its knob's value (--no-overlap-p2p-communication)."""
        return flag.startswith("--no-")

    @property
    def choices(self) -> tuple[str, ...]:
        """The words a string-valued knob takes (its Literal), () for any other knob."""
        members = typing.get_args(self.annotation) if typing.get_origin(self.annotation) is not Literal else ()
        literals = [m for m in (self.annotation, *members) if typing.get_origin(m) is Literal]
        return tuple(a for m in literals for a in typing.get_args(m) if isinstance(a, str))

    def active(self, s: "Strategy") -> bool:
        return getattr(s, self.name) != self.default

    def show(self, value: Any) -> str:
        """A value as suggestions and prompts write it: None -> 'none', True -> 'true'."""
        if value in self.value_names:
            return self.value_names[value]
        if value is None:
            return "none"
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    def args(self, s: "Strategy") -> list[str]:
        """Megatron-LM flags for this knob's value in `s` (already normalized)."""
        value = getattr(s, self.name)
        if callable(self.render):
            return self.render(s)
        if not self.flags or self.render == "none":
            return []
        flag = self.flags[0]
        if self.render == "always":
            return [flag, str(value)]
        if self.render == "switch":
            return [flag] if value else []
        if self.render == "negated":
            return [flag] if not value else []
        return [flag, str(value)] if value is not None and value != self.default else []


# -- domains (the values worth trying on a workload, before pairwise validity) -------------------

def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(max(1, limit).bit_length()) if 2**i <= limit]


def _tp_domain(w: "Workload") -> list[int]:
    # TP groups are consecutive ranks: one that straddles two nodes (TP 4 on 6-GPU nodes) sends each
    # layer's all-reduces over the network.
    m = w.model
    return [t for t in _powers_of_two(w.cluster.gpus_per_node)
            if m.num_attention_heads % t == 0 and (m.groups % t == 0 or t % m.groups == 0) and w.world_size % t == 0
            and w.cluster.keeps_in_node(t)]


def _pp_domain(w: "Workload") -> list[int]:
    m = w.model
    return [p for p in range(1, min(16, m.num_layers, w.world_size) + 1)
            if m.num_layers % p == 0 and w.world_size % p == 0]


def _cp_domain(w: "Workload") -> list[int]:
    # Splitting below ~4K tokens per rank leaves attention too small to hide the KV exchange.
    return [c for c in _powers_of_two(min(16, w.world_size, max(1, w.seq_length // 4096)))
            if c == 1 or w.seq_length % (2 * c) == 0]


def _ep_domain(w: "Workload") -> list[int]:
    m = w.model
    if not m.is_moe:
        return [1]
    return [e for e in _powers_of_two(min(w.world_size, m.num_experts)) if m.num_experts % e == 0]


def _etp_domain(w: "Workload") -> list[Any]:
    # None = TP (Megatron's default); 1 = experts unsplit (MoE recipes), which lets EP fold into TP.
    return [None, 1] if w.model.is_moe else [None]


def _vpp_domain(w: "Workload") -> list[Any]:
    stages = [w.model.num_layers // p for p in _pp_domain(w) if p > 1]
    return [None] + [v for v in range(2, 9) if any(n % v == 0 for n in stages)]


def _uneven_domain(w: "Workload") -> list[Any]:
    return [None] + list(range(1, max(2, w.model.num_layers // 2)))


def _ac_layers_domain(w: "Workload") -> list[int]:
    return [n for n in (1, 2, 4, 8) if n <= w.model.num_layers]


def _bools(w: "Workload") -> list[bool]:
    return [False, True]


def _moe_bools(w: "Workload") -> list[bool]:
    return [False, True] if w.model.is_moe else [False]


def recompute_level(s: "Strategy") -> float:
    """Memory saved by recompute, as an order: none < selective < full block (more layers saves
    more) < full uniform."""
    if s.recompute_granularity == "full":
        return 3.0 if s.recompute_method == "uniform" else 2.0 + (s.recompute_num_layers or 1) / 1000
    return 1.0 if s.recompute_granularity == "selective" else 0.0


def _cross_entropy_fusion_saving(s: "Strategy", w: "Workload") -> float:
    """The fusion saves logits memory with Transformer Engine's kernel and costs a float32 copy of
    them with megatron-core's native one (`perfmodel.memory.logits_bytes_per_element`)."""
    fused = float(s.cross_entropy_loss_fusion)
    return fused if w.cross_entropy_fusion_impl == "te" else -fused


# -- couplings shared by several knobs ------------------------------------------------------------

def _pp_gt_1(s: "Strategy", w: "Workload") -> bool:
    return s.pipeline_model_parallel_size > 1


def _no_uneven(s: "Strategy", w: "Workload") -> bool:
    return not (s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers)


_UNEVEN_NEEDS_PP = Requires(_pp_gt_1, "uneven first/last pipeline stages need PP > 1 (PP is {s.pp})",
                            ("pipeline_model_parallel_size",), "megatron-core (pipeline split)")
_SPLIT_VS_UNEVEN = Requires(
    _no_uneven, "embedding/loss in the pipeline split cannot be combined with uneven first/last stages",
    ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"), "megatron-core TransformerConfig")


_P = "megatron-core TransformerConfig"

KNOBS: tuple[Knob, ...] = (
    Knob("tensor_model_parallel_size", "TP", PositiveInt, 1,
        "Tensor parallel size: each layer's GEMMs and attention heads split over TP GPUs of a node.",
         flags=("--tensor-model-parallel-size",), render="always", aliases=("tp",), csv="tp", layout=True,
         tunable=True, domain=_tp_domain, similarity=1.0, mcore=("transformer", "tensor_model_parallel_size"),
         effect="splits weights, GEMMs and activations by TP; adds two all-reduces of the layer's activations "
                "forward and two backward (two more with full recompute)",
         terms=("tp_comm_s", "weights_gib"), probe=({}, 2)),
    Knob("pipeline_model_parallel_size", "PP", PositiveInt, 1,
         "Pipeline parallel size: the layers split into PP consecutive stages.",
         flags=("--pipeline-model-parallel-size",), render="always", aliases=("pp",), csv="pp", layout=True,
         tunable=True, domain=_pp_domain, similarity=1.0, mcore=("transformer", "pipeline_model_parallel_size"),
         effect="splits the layers over stages; adds the fill/drain bubble and p2p sends; the first stage "
                "holds PP micro-batches of activations",
         terms=("pp_bubble_s", "p2p_s", "weights_gib"), probe=({}, 2)),
    Knob("context_parallel_size", "CP", PositiveInt, 1,
         "Context parallel size: the sequence split over CP GPUs (ring attention).",
         flags=("--context-parallel-size",), render="always", aliases=("cp",), csv="cp", layout=True,
         tunable=True, domain=_cp_domain, similarity=1.0, mcore=("transformer", "context_parallel_size"),
         effect="splits activations along the sequence; exchanges K and V around a ring",
         terms=("cp_comm_s", "activations_gib"), probe=({}, 2)),
    Knob("expert_model_parallel_size", "EP", PositiveInt, 1,
         "Expert parallel size: the routed experts split over EP GPUs; tokens travel by all-to-all.",
         flags=("--expert-model-parallel-size",), aliases=("ep",), csv="ep", moe_only=True, layout=True,
         tunable=True, domain=_ep_domain, similarity=1.0, mcore=("transformer", "expert_model_parallel_size"),
         effect="splits expert weights and optimizer state by EP; adds token dispatch/combine traffic",
         terms=("ep_comm_s", "weights_gib"), probe=({}, 2)),
    Knob("virtual_pipeline_model_parallel_size", "VPP", PositiveInt | None, None,
         "Model chunks per pipeline rank (interleaved 1F1B); None or 1 = not interleaved.",
         flags=("--num-virtual-stages-per-pipeline-rank", "--num-layers-per-virtual-pipeline-stage"),
         value_names={None: "none"},
         aliases=("vpp",), csv="vpp", layout=True, tunable=True, domain=_vpp_domain, similarity=0.5,
         requires=(Requires(_pp_gt_1, "VPP ({s.vpp}) needs PP > 1", ("pipeline_model_parallel_size",),
                            "megatron-core parallel_state"),),
         effect="divides the pipeline bubble by VPP; more p2p sends and more micro-batches in flight",
         terms=("pp_bubble_s",), probe=({"pipeline_model_parallel_size": 2}, 2)),
    Knob("micro_batch_size", "MICRO_BATCH_SIZE", PositiveInt, 1,
         "Sequences per micro-batch on each data-parallel rank.",
         flags=("--micro-batch-size",), render="always", aliases=("mbs",), csv="mbs", tunable=True,
         domain=lambda w: [b for b in (1, 2, 4, 8) if b <= w.global_batch_size], similarity=0.7,
         memory_order=lambda s, w: -float(s.micro_batch_size),
         effect="larger GEMMs (higher efficiency) and fewer pipeline steps; activations grow with it",
         terms=("activations_gib",), probe=({}, 2)),
    Knob("sequence_parallel", "SEQUENCE_PARALLEL", bool, False,
         "Sequence parallelism: norms, dropout and residuals split along the sequence over the TP group.",
         flags=("--sequence-parallel",), render="switch", aliases=("sp",), csv="sequence_parallel",
         tunable=True, domain=_bools, similarity=0.5, mcore=("transformer", "sequence_parallel"),
         memory_order=lambda s, w: float(s.sequence_parallel),
         requires=(Requires(lambda s, w: s.tensor_model_parallel_size > 1, "sequence parallelism needs TP > 1 (TP is {s.tp})",
                            ("tensor_model_parallel_size",), _P),
                   Requires(lambda s, w: (w.seq_length // s.context_parallel_size) % s.tensor_model_parallel_size
                            == 0, "sequence parallelism needs seq_length / CP ({w.seq_length}/{s.cp}) divisible by TP ({s.tp})",
                            ("tensor_model_parallel_size", "context_parallel_size"),
                            "megatron-core at run time (scatter to sequence-parallel region)")),
         effect="divides norm/residual activations and their memory-bound time by TP",
         terms=("activations_gib",), probe=({"tensor_model_parallel_size": 2}, True)),
    Knob("recompute_granularity", "AC", Literal["full", "selective"] | None, None,
         "Activation recompute: none, selective (attention core) or full (whole layers).",
         flags=("--recompute-granularity", "--recompute-activations"), aliases=("recompute",), csv="recompute",
         value_names={None: "none"},
         tunable=True, domain=lambda w: [None, "selective", "full"], similarity=0.7,
         mcore=("transformer", "recompute_granularity"), memory_order=lambda s, w: recompute_level(s),
         effect="drops stored activations and runs their forward again in backward",
         terms=("recompute_s", "activations_gib"), probe=({}, "full")),
    Knob("recompute_method", "AC_METHOD", Literal["uniform", "block"] | None, None,
         "Full recompute: uniform (every layer, in chunks of AC_LAYERS) or block (the first AC_LAYERS "
         "layers of each chunk). Means nothing without full recompute.",
         flags=("--recompute-method",), domain=lambda w: ["uniform", "block"],
         mcore=("transformer", "recompute_method"),
         effect="block recomputes only some layers: less recompute time, more memory",
         terms=("recompute_s",), probe=({"recompute_granularity": "full", "recompute_num_layers": 1}, "block")),
    Knob("recompute_num_layers", "AC_LAYERS", PositiveInt | None, None,
         "Full recompute: layers per recompute chunk (uniform) or recomputed layers per chunk (block).",
         flags=("--recompute-num-layers",), domain=_ac_layers_domain, mcore=("transformer", "recompute_num_layers"),
         effect="block: more layers recomputed, less memory and more time",
         terms=("recompute_s",),
         probe=({"recompute_granularity": "full", "recompute_method": "block"}, 4)),
    Knob("use_distributed_optimizer", "DISTRIBUTED_OPTIMIZER", bool, False,
         "The distributed optimizer: Adam state and fp32 master weights sharded over data parallel ranks (ZeRO-1).",
         flags=("--use-distributed-optimizer",), render="switch", aliases=("distributed_optimizer",),
         csv="distributed_optimizer", tunable=True, recipe=True, domain=_bools, similarity=0.5,
         mcore=("ddp", "use_distributed_optimizer"), memory_order=lambda s, w: float(s.use_distributed_optimizer),
         effect="optimizer state / DP; gradients reduce-scattered and parameters all-gathered",
         terms=("optimizer_gib",), probe=({}, True)),
    Knob("overlap_grad_reduce", "OVERLAP_GRAD_REDUCE", bool, False,
         "Overlap the data-parallel gradient reduction with the backward pass.",
         flags=("--overlap-grad-reduce",), render="switch", tunable=True, recipe=True, domain=_bools,
         mcore=("ddp", "overlap_grad_reduce"),
         effect="hides the DP gradient reduce behind the last micro-batch's backward", terms=("dp_comm_s",),
         probe=({}, True)),
    Knob("overlap_param_gather", "OVERLAP_PARAM_GATHER", bool, False,
         "Overlap the distributed optimizer's parameter all-gather with the next forward pass.",
         flags=("--overlap-param-gather",), render="switch", tunable=True, recipe=True, domain=_bools,
         mcore=("ddp", "overlap_param_gather"),
         requires=(Requires(lambda s, w: s.use_distributed_optimizer,
                            "overlap param gather needs the distributed optimizer", ("use_distributed_optimizer",)),
                   Requires(lambda s, w: s.overlap_grad_reduce, "overlap param gather needs overlap grad reduce",
                            ("overlap_grad_reduce",))),
         effect="hides the parameter all-gather behind the first forward", terms=("dp_comm_s",),
         probe=({"use_distributed_optimizer": True, "overlap_grad_reduce": True}, True)),
    Knob("tp_comm_overlap", "TP_COMM_OVERLAP", bool, False,
         "Overlap TP communication with GEMMs (Transformer Engine userbuffers).",
         flags=("--tp-comm-overlap",), render="switch", te_only=True, domain=_bools,
         mcore=("transformer", "tp_comm_overlap"),
         requires=(Requires(lambda s, w: s.sequence_parallel, "TP communication overlap needs sequence parallelism",
                            ("sequence_parallel",)),),
         effect="hides most TP collectives behind GEMMs", terms=("tp_comm_s",),
         probe=({"tensor_model_parallel_size": 2, "sequence_parallel": True}, True)),
    Knob("cross_entropy_loss_fusion", "FUSED_CROSS_ENTROPY", bool, False,
         "Fused cross-entropy loss: fewer copies of the logits at the loss.",
         flags=("--cross-entropy-loss-fusion",), render="switch", tunable=True, recipe=True, domain=_bools,
         mcore=("transformer", "cross_entropy_loss_fusion"),
         memory_order=_cross_entropy_fusion_saving,
         effect="less loss time on the last stage, and less logits memory with Transformer Engine's kernel "
                "(cross_entropy_fusion_impl te); megatron-core's native kernel holds one more float32 copy",
         terms=("logits_gib",), probe=({}, True)),
    Knob("decoder_first_pipeline_num_layers", "FIRST_PP_NUM_LAYERS", PositiveInt | None, None,
         "Layers on the first pipeline stage (uneven pipeline); None = an even split.",
         flags=("--decoder-first-pipeline-num-layers",), csv="first_pp_layers", layout=True,
         domain=_uneven_domain, mcore=("transformer", "num_layers_in_first_pipeline_stage"),
         requires=(_UNEVEN_NEEDS_PP,),
         effect="moves layers off (or onto) the first stage, which also holds the embedding and the most "
                "micro-batches in flight", terms=("activations_gib",),
         probe=({"pipeline_model_parallel_size": 4}, 5)),
    Knob("decoder_last_pipeline_num_layers", "LAST_PP_NUM_LAYERS", PositiveInt | None, None,
         "Layers on the last pipeline stage (uneven pipeline); None = an even split.",
         flags=("--decoder-last-pipeline-num-layers",), csv="last_pp_layers", layout=True,
         domain=_uneven_domain, mcore=("transformer", "num_layers_in_last_pipeline_stage"),
         requires=(_UNEVEN_NEEDS_PP,),
         effect="moves layers off (or onto) the last stage, which also holds the output layer and the loss",
         terms=("compute_s",), probe=({"pipeline_model_parallel_size": 4}, 5)),
    Knob("overlap_p2p_comm", "OVERLAP_P2P_COMM", bool, True,
         "Overlap pipeline sends/receives with compute (interleaved schedule only; Megatron-LM turns it "
         "off without VPP).",
         flags=("--no-overlap-p2p-communication",), domain=_bools,
         # Megatron-LM turns p2p overlap off without VPP by itself: the flag only says something with VPP.
         render=lambda s: ["--no-overlap-p2p-communication"] if s.vpp > 1 and not s.overlap_p2p_comm else [],
         requires=(Requires(lambda s, w: s.vpp == 1 or s.pipeline_model_parallel_size > 2,
                            "VPP without overlapped p2p communication needs PP > 2 (PP is {s.pp})",
                            ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size")),),
         inert=lambda s: s.vpp == 1,
         effect="hides the interleaved schedule's p2p sends", terms=("p2p_s",),
         probe=({"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2}, False)),
    Knob("batch_p2p_comm", "BATCH_P2P_COMM", bool, False,
         "Batch pipeline sends/receives into one call. Megatron-LM derives it (not overlap_p2p_comm) and has "
         "no flag; it must stay off with VPP (the interleaved schedule then diverges silently).",
         render="none", domain=_bools,
         requires=(Requires(lambda s, w: s.vpp == 1, "VPP must not be combined with batched p2p communication",
                            ("virtual_pipeline_model_parallel_size",)),),
         inert=lambda s: s.vpp == 1),  # without VPP, Megatron-LM sets it to not overlap_p2p_comm
    Knob("moe_token_dispatcher_type", "MOE_DISPATCHER", Literal["allgather", "alltoall", "flex"], "allgather",
         "How routed tokens reach their experts: allgather, alltoall, or flex (DeepEP / HybridEP).",
         flags=("--moe-token-dispatcher-type",), moe_only=True, tunable=True,
         # Stated whenever experts are parallel: Megatron-LM's default dispatcher changed between versions.
         render=lambda s: (["--moe-token-dispatcher-type", s.moe_token_dispatcher_type]
                           if s.ep > 1 or s.moe_token_dispatcher_type != "allgather" else []),
         recipe="alltoall", domain=lambda w: ["allgather", "alltoall"] if w.model.is_moe else ["allgather"],
         mcore=("transformer", "moe_token_dispatcher_type"),
         # The dispatcher is only built for MoE layers: a dense model never meets the check.
         requires=(Requires(lambda s, w: s.moe_token_dispatcher_type != "flex" or s.etp * s.ep > 1
                            or not w.model.is_moe,
                            "the flex dispatcher needs ETP·EP > 1 (ETP {s.etp}, EP {s.ep})",
                            ("expert_model_parallel_size", "expert_tensor_parallel_size", "tensor_model_parallel_size"),
                            "megatron-core at run time (MoEFlexTokenDispatcher)"),),
         effect="all-to-all sends each token to its top-k experts only; allgather moves every token to every "
                "EP rank", terms=("ep_comm_s",), probe=({"expert_model_parallel_size": 4}, "alltoall")),
    Knob("moe_grouped_gemm", "MOE_GROUPED_GEMM", bool, False,
         "Run a rank's local experts as one grouped GEMM instead of a loop.",
         flags=("--moe-grouped-gemm",), render="switch", moe_only=True, tunable=True, recipe=True, domain=_moe_bools,
         mcore=("transformer", "moe_grouped_gemm"),
         effect="expert GEMMs at near-dense efficiency with few kernel launches", terms=("compute_s",),
         probe=({}, True)),
    # -- added after signature schema 1: hashed only when not at their default --------------------
    Knob("expert_tensor_parallel_size", "ETP", PositiveInt | None, None,
         "Tensor parallel size inside the experts; None = TP. With ETP 1 (MoE recipes) expert parallelism "
         "folds into the TP and CP ranks: the expert grid is ETP·EP·PP, so EP may exceed DP·CP.",
         flags=("--expert-tensor-parallel-size",), aliases=("etp",), csv="etp", since=2, moe_only=True,
         layout=True, tunable=True, domain=_etp_domain, similarity=0.7,
         mcore=("transformer", "expert_tensor_parallel_size"),
         effect="splits each expert's GEMMs by ETP (smaller, less efficient GEMMs, TP traffic in the experts); "
                "sets the expert data-parallel size world/(ETP·EP·PP) over which expert gradients are reduced",
         terms=("compute_s", "weights_gib"),
         probe=({"tensor_model_parallel_size": 2, "sequence_parallel": True, "expert_model_parallel_size": 2,
                 "use_distributed_optimizer": True}, 1)),
    Knob("overlap_moe_expert_parallel_comm", "EP_COMM_OVERLAP", bool, False,
         "Overlap the expert all-to-all of one micro-batch with another's compute (1F1B A2A overlap).",
         flags=("--overlap-moe-expert-parallel-comm",), since=2, moe_only=True, domain=_moe_bools,
         mcore=("transformer", "overlap_moe_expert_parallel_comm"),
         requires=(Requires(lambda s, w: s.expert_model_parallel_size > 1, "EP communication overlap needs EP > 1 (EP is {s.ep})",
                            ("expert_model_parallel_size",), _P),
                   Requires(lambda s, w: s.moe_token_dispatcher_type in ("alltoall", "flex"),
                            "EP communication overlap needs the alltoall or flex dispatcher",
                            ("moe_token_dispatcher_type",), _P),
                   Requires(lambda s, w: s.recompute_granularity != "full",
                            "EP communication overlap cannot be combined with full recompute",
                            ("recompute_granularity",), _P),
                   Requires(lambda s, w: s.pipeline_model_parallel_size == 1 or s.vpp > 1,
                            "EP communication overlap with PP > 1 ({s.pp}) needs VPP",
                            ("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"), _P)),
         effect="hides most of the expert all-to-all behind another micro-batch's compute",
         terms=("ep_comm_s",),
         probe=({"expert_model_parallel_size": 2, "moe_token_dispatcher_type": "alltoall"}, True)),
    Knob("account_for_embedding_in_pipeline_split", "EMBEDDING_IN_PP_SPLIT", bool, False,
         "Count the embedding as one layer when splitting layers over pipeline stages (the first stage "
         "builds one transformer layer less).",
         flags=("--account-for-embedding-in-pipeline-split",), render="switch", since=2, layout=True,
         domain=_bools, mcore=("transformer", "account_for_embedding_in_pipeline_split"),
         requires=(_SPLIT_VS_UNEVEN,),
         inert=lambda s: s.pipeline_model_parallel_size == 1,  # one stage is first and last: nothing to move
         # No single-knob probe: switching it alone always breaks a split that was valid (L vs L+1).
         effect="one layer fewer on the first stage", terms=("activations_gib",)),
    Knob("account_for_loss_in_pipeline_split", "LOSS_IN_PP_SPLIT", bool, False,
         "Count the output layer and loss as one layer when splitting layers over pipeline stages (the last "
         "stage builds one transformer layer less).",
         flags=("--account-for-loss-in-pipeline-split",), render="switch", since=2, layout=True,
         domain=_bools, mcore=("transformer", "account_for_loss_in_pipeline_split"),
         requires=(_SPLIT_VS_UNEVEN,),
         inert=lambda s: s.pipeline_model_parallel_size == 1,
         effect="one layer fewer on the last stage", terms=("compute_s",)),
    Knob("cpu_offloading_num_layers", "AC_OFFLOAD_LAYERS", NonNegativeInt, 0,
         "Activation offloading: the activations of this many layers go to host memory during the forward "
         "pass and come back for the backward (the paper's AC=offload). 0 = off.",
         flags=("--cpu-offloading-num-layers",), aliases=("offload_layers",), since=2, te_only=True,
         domain=lambda w: [0], memory_order=lambda s, w: float(s.cpu_offloading_num_layers),
         requires=(Requires(lambda s, w: s.cpu_offloading_num_layers < w.model.num_layers,
                            "activation offloading needs fewer offloaded layers ({s.cpu_offloading_num_layers}) than num_layers ({w.model.num_layers})", (), _P),
                   Requires(lambda s, w: s.pipeline_model_parallel_size == 1,
                            "activation offloading does not work with PP > 1 (PP is {s.pp})", ("pipeline_model_parallel_size",),
                            _P),
                   Requires(lambda s, w: s.recompute_granularity is None,
                            "activation offloading cannot be combined with recompute",
                            ("recompute_granularity",), _P)),
         effect="offloaded layers keep no activations on the GPU; the copies over PCIe/C2C are hidden "
                "unless they outlast the layer's compute", terms=("activations_gib",), probe=({}, 4)),
)
BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
NAMES: tuple[str, ...] = tuple(BY_NAME)


# -- lookups ---------------------------------------------------------------------------------------

PAPER_NAMES: dict[str, str] = {k.name: k.paper for k in KNOBS}
ALIASES: dict[str, str] = {alias: k.name for k in KNOBS for alias in k.aliases}
_FROM_PAPER = {k.paper.lower(): k.name for k in KNOBS}
# Knobs that no longer exist: name -> (the default they had, the signature schema that added them).
# Stored rows that name them still read (the value is dropped); a retired knob of schema 1 is
# hashed at its default, as schema 1 did, so signatures stay what they were. None so far.
RETIRED: dict[str, tuple[Any, int]] = {}


def canonical_name(name: str) -> str:
    """Resolves 'tp', 'TP', 'MICRO_BATCH_SIZE', 'overlap-grad-reduce' or a Megatron-LM flag
    ('--micro-batch-size') to the knob's name.

    Raises KeyError naming the accepted names when `name` is none of them."""
    key = name.strip().lower().replace("-", "_").lstrip("_")
    if key in BY_NAME:
        return key
    if key in ALIASES:
        return ALIASES[key]
    if key in _FROM_PAPER:
        return _FROM_PAPER[key]
    flag = "--" + key.replace("_", "-")
    for k in KNOBS:
        if flag in k.flags and k.render != "negated":
            return k.name
    raise KeyError(f"unknown strategy parameter {name!r}; known: {', '.join(NAMES)} "
                   f"(short names: {', '.join(ALIASES)})")


def knob(name: str) -> Knob:
    return BY_NAME[canonical_name(name)]


def owned_flags() -> tuple[set[str], set[str]]:
    """(flags that take a value, switches) every knob owns — what a user's Megatron-LM command must
    not state itself. `--recompute-activations` is the old switch for selective recompute."""
    value, switch = set(), set()
    for k in KNOBS:
        for flag in k.flags:
            if k.is_bool or flag in ("--recompute-activations", "--no-overlap-p2p-communication"):
                switch.add(flag)
            else:
                value.add(flag)
    return value, switch


def couplings_text(k: Knob) -> str:
    parts = [re.sub(r" \([^()]*\{[^()]*\)", "", r.message) for r in k.requires]
    if k.moe_only:
        parts.append("MoE models only")
    if k.te_only:
        parts.append("needs Transformer Engine")
    return "; ".join(parts)


def knob_table(names: list[str] | None = None) -> str:
    """The knobs as prompt text, one line each: paper name (field, flag): meaning, default,
    couplings, effect on the step. `names` limits and orders the lines (default: all)."""
    lines = []
    for name in names or NAMES:
        k = BY_NAME[canonical_name(name)]
        flag = k.flags[0] if k.flags else "no flag (derived by Megatron-LM)"
        line = f"- {k.paper} ({k.name}, {flag}): {k.doc} Default {k.show(k.default)}."
        if k.requires or k.moe_only or k.te_only:
            line += f" Rules: {couplings_text(k)}."
        if k.effect:
            line += f" Effect: {k.effect}."
        lines.append(line)
    return "\n".join(lines)


def markdown_table() -> str:
    """The knob table of docs/spec.md (regenerate with `python -m optico.knobs`)."""
    rows = ["| paper name | field (short) | Megatron-LM flag | default | rules | effect in the model |",
            "|---|---|---|---|---|---|"]
    for k in KNOBS:
        field_name = k.name + (f" (`{'`, `'.join(k.aliases)}`)" if k.aliases else "")
        flag = f"`{k.flags[0]}`" if k.flags else "derived"
        rows.append(f"| {k.paper} | `{field_name.split(' ')[0]}`{field_name[len(k.name):]} | {flag} | "
                    f"{k.show(k.default)} | {couplings_text(k) or '—'} | {k.effect or '—'} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m optico.knobs > the table in docs/spec.md
    print(markdown_table())

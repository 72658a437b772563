"""Validity of a strategy for a workload: the checks megatron-core and Megatron-LM make on the
tuned knobs, and nothing stricter.

Two kinds of rule:
- structural ones here, with the workload's numbers: heads, query groups and FFN widths over
  TP (and expert FFN over ETP), Mamba heads and groups over TP and CP, both parallel grids over
  the world (`optico.parallel`), the batch over MBS·DP, the pipeline split, the interleaved
  schedule's micro-batches, CP's sequence split, experts over EP, sequence parallelism for MoE
  with TP, and what needs Transformer Engine (CP, TE-only knobs) under `attention_backend: local`;
- couplings between knobs, declared once in `optico.knobs` (`Knob.requires`) and checked for
  every knob that is off its default.

Every rule names the parameters it involves and states itself with the numbers ("num_attention_heads
(32) must be divisible by TP (3)"). Sources: megatron-core 0.16 (TransformerConfig and
ModelParallelConfig construction, parallel_state.initialize_model_parallel,
get_num_layers_to_build, the run-time checks listed in docs/perfmodel.md) and Megatron-LM's
validate_args. tests/test_rules_oracle.py holds these rules against megatron-core itself and
lists the deliberate differences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from optico.knobs import KNOBS, Knob, Requires, Violation
from optico.parallel import ParallelDims
from optico.strategy import Strategy
from optico.workload import Workload

__all__ = ["Violation", "InvalidStrategy", "Rule", "RULES", "violations", "check", "is_valid", "couplings"]

_TP, _PP, _CP = "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"
_EP, _ETP, _VPP = "expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size"
_MBS, _SP = "micro_batch_size", "sequence_parallel"
_TE_ONLY: tuple[Knob, ...] = tuple(k for k in KNOBS if k.te_only)


class InvalidStrategy(ValueError):
    """A strategy that Megatron-LM would refuse for this workload."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("; ".join(v.message for v in violations))

    @property
    def params(self) -> list[str]:
        seen: dict[str, None] = {}
        for v in self.violations:
            for p in v.params:
                seen.setdefault(p, None)
        return list(seen)


@dataclass(frozen=True)
class Rule:
    """One check and the Strategy fields it reads: a generator may run it as soon as they are set
    (`optico.candidates`). ETP's default is TP, so rules reading ETP read TP too."""

    reads: frozenset[str]
    check: Callable[[Workload, Strategy, ParallelDims], list[Violation]]


def _heads(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """Heads, query groups and the TP-split GEMM widths (megatron-core: TransformerConfig and the
    column-parallel layers' divide())."""
    m, tp, out = w.model, s.tp, []
    if m.num_attention_heads % tp:
        out.append(Violation((_TP,), f"num_attention_heads ({m.num_attention_heads}) must be divisible by TP ({tp})"))
    if m.groups % tp and tp % m.groups:
        out.append(Violation((_TP,), f"num_query_groups ({m.groups}) must be a multiple or divisor of TP ({tp})"))
    for what, width in m.dense_ffn_widths():
        if width % tp:
            out.append(Violation((_TP,), f"{what} ({width}) must be divisible by TP ({tp})"))
    return out


def _mamba_heads(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """Mamba mixers split their heads and groups over TP, then over CP (megatron-core MambaMixer and
    MambaContextParallel): every rank needs whole heads and whole (or evenly shared) groups."""
    m = w.model
    if not any(mixer == "mamba" for mixer, _ in m.layer_kinds()):
        return []
    heads, groups, tp, cp, out = m.mamba_heads, m.mamba_num_groups, s.tp, s.cp, []
    if heads % tp:
        out.append(Violation((_TP,), f"Mamba heads ({heads}) must be divisible by TP ({tp})"))
    if groups % tp:
        out.append(Violation((_TP,), f"mamba_num_groups ({groups}) must be divisible by TP ({tp})"))
    if out or cp == 1:
        return out
    local_groups = groups // tp
    if (heads // tp) % cp:
        out.append(Violation((_CP, _TP), f"Mamba heads per TP rank ({heads // tp}) must be divisible by CP ({cp})"))
    elif max(local_groups, cp) % min(local_groups, cp):
        out.append(Violation((_CP, _TP), f"Mamba groups per TP rank ({local_groups}) and CP ({cp}) must divide "
                                         f"one another"))
    return out


def _moe_sequence_parallel(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """Megatron-LM's validate_args ("When using MoE and tensor parallelism, sequence parallelism must
    be used") and megatron-core's MoELayer, which raises at the first training step without it."""
    if w.model.is_moe and s.tp > 1 and not s.sequence_parallel:
        return [Violation((_SP, _TP), f"an MoE model with TP > 1 (TP is {s.tp}) needs sequence parallelism")]
    return []


def _transformer_engine(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """`attention_backend: local` stands for --transformer-impl local: no Transformer Engine, so no
    context parallelism (megatron-core's DotProductAttention asserts CP 1) and no TE-only knob."""
    if w.attention_backend != "local":
        return []
    out = []
    if s.cp > 1:
        out.append(Violation((_CP,), f"context parallelism (CP {s.cp}) needs Transformer Engine's attention; "
                                     f"attention_backend is local"))
    for k in _TE_ONLY:
        if k.active(s):
            out.append(Violation((k.name,), f"{k.name} needs Transformer Engine; attention_backend is local"))
    return out


def _expert_width(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    m = w.model
    if m.is_moe and m.expert_ffn % s.etp:
        return [Violation((_ETP, _TP), f"moe_ffn_hidden_size ({m.expert_ffn}) must be divisible by ETP ({s.etp})")]
    return []


def _experts(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    m, ep = w.model, s.ep
    if ep == 1:
        return []
    if not m.is_moe:
        return [Violation((_EP,), f"EP ({ep}) needs an MoE model (num_experts)")]
    if m.num_experts % ep:
        return [Violation((_EP,), f"num_experts ({m.num_experts}) must be divisible by EP ({ep})")]
    return []


def _dense_grid(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    return d.grid_errors()[:1] if w.world_size % d.model_parallel else []


def _expert_grid(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    return [v for v in d.grid_errors() if "ETP·EP·PP" in v.message]


def _batch(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """The micro-batch calculator's check; says nothing while TP·PP·CP does not tile the world."""
    if w.world_size % d.model_parallel or not w.global_batch_size % (s.mbs * d.dp):
        return []
    return [Violation((_MBS, _TP, _PP, _CP), f"global_batch_size ({w.global_batch_size}) must be divisible by "
                                             f"MICRO_BATCH_SIZE·DP ({s.mbs}·{d.dp} = {s.mbs * d.dp})")]


def _interleaved(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    """The interleaved schedule (megatron-core schedules.py): micro-batches divisible by PP."""
    if s.vpp == 1 or s.pp == 1 or w.world_size % d.model_parallel or w.global_batch_size % (s.mbs * d.dp):
        return []
    micro = d.microbatches(w.global_batch_size, s.mbs)
    if micro % s.pp:
        return [Violation((_VPP, _MBS, _PP), f"the interleaved schedule needs the number of micro-batches "
                                             f"({micro}) divisible by PP ({s.pp})")]
    return []


def _context(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    if s.cp > 1 and w.seq_length % (2 * s.cp):
        return [Violation((_CP,), f"seq_length ({w.seq_length}) must be divisible by 2·CP ({2 * s.cp})")]
    return []


def _split(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
    return d.split_errors(w.model.num_layers)


def _coupling_rule(k: Knob, req: Requires) -> Rule:
    def check(w: Workload, s: Strategy, d: ParallelDims) -> list[Violation]:
        if k.active(s) and not req.holds(s, w):
            return [Violation((k.name, *req.involves), req.text(s, w))]
        return []

    return Rule(frozenset({k.name, *req.involves}), check)


_SPLIT_FIELDS = frozenset({_PP, _VPP, "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                           "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"})
STRUCTURAL: tuple[Rule, ...] = (
    Rule(frozenset({_TP}), _heads),
    Rule(frozenset({_TP, _CP}), _mamba_heads),
    Rule(frozenset({_TP, _SP}), _moe_sequence_parallel),
    Rule(frozenset({_CP} | {k.name for k in _TE_ONLY}), _transformer_engine),
    Rule(frozenset({_TP, _ETP}), _expert_width),
    Rule(frozenset({_EP}), _experts),
    Rule(frozenset({_TP, _PP, _CP}), _dense_grid),
    Rule(frozenset({_TP, _PP, _EP, _ETP}), _expert_grid),
    Rule(frozenset({_TP, _PP, _CP, _MBS}), _batch),
    Rule(frozenset({_TP, _PP, _CP, _MBS, _VPP}), _interleaved),
    Rule(frozenset({_CP}), _context),
    Rule(_SPLIT_FIELDS, _split),
)
COUPLINGS: tuple[Rule, ...] = tuple(_coupling_rule(k, req) for k in KNOBS for req in k.requires)
RULES: tuple[Rule, ...] = STRUCTURAL + COUPLINGS


def couplings(w: Workload, s: Strategy) -> list[Violation]:
    """Every `Requires` of every knob that is off its default and broken."""
    dims = ParallelDims.of(s, w.world_size)
    return [v for rule in COUPLINGS for v in rule.check(w, s, dims)]


def violations(w: Workload, s: Strategy) -> list[Violation]:
    """Every rule `s` breaks for `w`; empty when Megatron would accept it."""
    dims = ParallelDims.of(s, w.world_size)
    return [v for rule in RULES for v in rule.check(w, s, dims)]


def check(w: Workload, s: Strategy) -> None:
    """Raises InvalidStrategy listing every broken rule."""
    found = violations(w, s)
    if found:
        raise InvalidStrategy(found)


def is_valid(w: Workload, s: Strategy) -> bool:
    return not violations(w, s)

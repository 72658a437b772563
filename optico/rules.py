"""Validity of a strategy for a workload: Megatron-LM's argument checks that touch the tuned knobs.

Every rule names the parameters it involves and states itself with the numbers, so
a rejected candidate explains why ("num_attention_heads (32) must be divisible by
TP (3)"). Sources: megatron/training/arguments.py (validate_args),
megatron/core/transformer/transformer_config.py, megatron/core/model_parallel_config.py
and the interleaved schedule in megatron/core/pipeline_parallel/schedules.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from optico.strategy import PAPER_NAMES, Strategy
from optico.workload import Workload


@dataclass(frozen=True)
class Violation:
    """One broken rule: the Strategy fields involved and a sentence with the numbers."""

    params: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return self.message


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


def _pipeline_split(w: Workload, s: Strategy) -> list[Violation]:
    """Layers over PP stages and VPP chunks, with optional uneven first/last stages."""
    out: list[Violation] = []
    layers, pp, vpp = w.model.num_layers, s.pp, s.vpp
    first, last = s.decoder_first_pipeline_num_layers, s.decoder_last_pipeline_num_layers
    if layers < pp:
        return [Violation(("pipeline_model_parallel_size",),
                          f"PP ({pp}) must not exceed num_layers ({layers})")]
    if (first or last) and pp == 1:
        return [Violation(("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"),
                          "uneven first/last pipeline stages need PP > 1")]
    if not first and not last:
        if layers % pp:
            out.append(Violation(("pipeline_model_parallel_size",),
                                 f"num_layers ({layers}) must be divisible by PP ({pp})"))
        elif (layers // pp) % vpp:
            out.append(Violation(("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size"),
                                 f"layers per pipeline rank ({layers // pp}) must be divisible by VPP ({vpp})"))
        return out
    middle_layers, middle_stages = layers, pp
    for name, count in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
        if count:
            if count % vpp:
                out.append(Violation((name, "virtual_pipeline_model_parallel_size"),
                                     f"{PAPER_NAMES[name]} ({count}) must be divisible by VPP ({vpp})"))
            middle_layers -= count
            middle_stages -= 1
    if middle_layers < 0 or bool(middle_layers) != bool(middle_stages):
        out.append(Violation(("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                              "pipeline_model_parallel_size"),
                             f"first/last stage layers leave {middle_layers} layers for {middle_stages} "
                             f"middle stages of PP ({pp}) with num_layers ({layers})"))
    elif middle_stages:
        if middle_layers % middle_stages:
            out.append(Violation(("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                                  "pipeline_model_parallel_size"),
                                 f"middle layers ({middle_layers}) must be divisible by the {middle_stages} "
                                 f"middle pipeline stages"))
        elif (middle_layers // middle_stages) % vpp:
            out.append(Violation(("virtual_pipeline_model_parallel_size",),
                                 f"layers per middle pipeline rank ({middle_layers // middle_stages}) must be "
                                 f"divisible by VPP ({vpp})"))
    return out


def violations(w: Workload, s: Strategy) -> list[Violation]:
    """Every rule `s` breaks for `w`; empty when Megatron-LM would accept it."""
    m, out = w.model, []
    tp, pp, cp, ep, vpp, world = s.tp, s.pp, s.cp, s.ep, s.vpp, w.world_size

    # Tensor parallel: heads and GQA groups split over TP ranks.
    if m.num_attention_heads % tp:
        out.append(Violation(("tensor_model_parallel_size",),
                             f"num_attention_heads ({m.num_attention_heads}) must be divisible by TP ({tp})"))
    if m.groups % tp and tp % m.groups:
        out.append(Violation(("tensor_model_parallel_size",),
                             f"num_query_groups ({m.groups}) must be a multiple or divisor of TP ({tp})"))
    # World size and data parallel.
    if world % (tp * pp * cp):
        out.append(Violation(("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"),
                             f"world size ({world}) must be divisible by TP·PP·CP ({tp}·{pp}·{cp} = {tp * pp * cp})"))
        return out  # everything below needs DP
    dp = s.dp(world)
    if w.global_batch_size % (s.mbs * dp):
        out.append(Violation(("micro_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                              "context_parallel_size"),
                             f"global_batch_size ({w.global_batch_size}) must be divisible by "
                             f"MICRO_BATCH_SIZE·DP ({s.mbs}·{dp} = {s.mbs * dp})"))
    out += _pipeline_split(w, s)

    # Interleaved (virtual) pipeline.
    if vpp > 1:
        if pp == 1:
            out.append(Violation(("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size"),
                                 f"VPP ({vpp}) needs PP > 1"))
        elif not s.overlap_p2p_comm and pp <= 2:
            out.append(Violation(("virtual_pipeline_model_parallel_size", "overlap_p2p_comm"),
                                 f"VPP without overlapped p2p communication needs PP > 2 (PP is {pp})"))
        if s.batch_p2p_comm:
            out.append(Violation(("virtual_pipeline_model_parallel_size", "batch_p2p_comm"),
                                 "VPP must not be combined with batched p2p communication"))
        if pp > 1 and not w.global_batch_size % (s.mbs * dp):
            micro = s.num_microbatches(world, w.global_batch_size)
            if micro % pp:
                out.append(Violation(("virtual_pipeline_model_parallel_size", "micro_batch_size",
                                      "pipeline_model_parallel_size"),
                                     f"the interleaved schedule needs the number of micro-batches ({micro}) "
                                     f"divisible by PP ({pp})"))

    # Context parallel.
    if cp > 1 and w.seq_length % (2 * cp):
        out.append(Violation(("context_parallel_size",),
                             f"seq_length ({w.seq_length}) must be divisible by 2·CP ({2 * cp})"))

    # Expert parallel.
    if ep > 1:
        if not m.is_moe:
            out.append(Violation(("expert_model_parallel_size",), f"EP ({ep}) needs an MoE model (num_experts)"))
        else:
            if m.num_experts % ep:
                out.append(Violation(("expert_model_parallel_size",),
                                     f"num_experts ({m.num_experts}) must be divisible by EP ({ep})"))
            if (dp * cp) % ep:
                out.append(Violation(("expert_model_parallel_size", "tensor_model_parallel_size",
                                      "pipeline_model_parallel_size"),
                                     f"EP ({ep}) must divide DP·CP ({dp}·{cp} = {dp * cp})"))
            if tp > 1 and not s.sequence_parallel:
                out.append(Violation(("sequence_parallel", "expert_model_parallel_size", "tensor_model_parallel_size"),
                                     "expert parallelism with TP > 1 needs sequence parallelism"))
    if not m.is_moe and (s.moe_grouped_gemm or s.moe_token_dispatcher_type != "allgather"):
        out.append(Violation(("moe_grouped_gemm", "moe_token_dispatcher_type"), "MoE options need an MoE model"))

    # Sequence parallel and TP communication overlap.
    if s.sequence_parallel and tp == 1:
        out.append(Violation(("sequence_parallel", "tensor_model_parallel_size"), "sequence parallelism needs TP > 1"))
    if s.tp_comm_overlap and not s.sequence_parallel:
        out.append(Violation(("tp_comm_overlap", "sequence_parallel"),
                             "TP communication overlap needs sequence parallelism"))

    # Optimizer and gradient overlap.
    if s.overlap_param_gather and not s.use_distributed_optimizer:
        out.append(Violation(("overlap_param_gather", "use_distributed_optimizer"),
                             "overlap param gather needs the distributed optimizer"))
    if s.overlap_param_gather and not s.overlap_grad_reduce:
        out.append(Violation(("overlap_param_gather", "overlap_grad_reduce"),
                             "overlap param gather needs overlap grad reduce"))

    # Activation recompute.
    if s.recompute_granularity == "selective" and s.recompute_method is not None:
        out.append(Violation(("recompute_method",), "selective recompute takes no recompute method"))
    if s.recompute_granularity == "full" and s.recompute_num_layers:
        per_chunk = max(1, m.num_layers // (pp * vpp))
        if s.recompute_num_layers > per_chunk:
            out.append(Violation(("recompute_num_layers",),
                                 f"AC_LAYERS ({s.recompute_num_layers}) must be between 1 and the layers per "
                                 f"pipeline chunk ({per_chunk})"))
    return out


def check(w: Workload, s: Strategy) -> None:
    """Raises InvalidStrategy listing every broken rule."""
    found = violations(w, s)
    if found:
        raise InvalidStrategy(found)


def is_valid(w: Workload, s: Strategy) -> bool:
    return not violations(w, s)

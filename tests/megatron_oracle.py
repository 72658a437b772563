"""megatron-core as the judge of `optico.rules.violations` (CPU, no process group).

`megatron_refuses(w, s)` runs what megatron-core 0.16 itself runs on a configuration, and
returns the reasons it refuses it (empty = accepted):

1. `TransformerConfig(...)` construction (ModelParallelConfig and TransformerConfig __post_init__);
2. `parallel_state.initialize_model_parallel` with a fake torch.distributed (no groups are
   created; its arithmetic and RankGenerator checks run as they are);
3. `get_num_layers_to_build` on every pipeline rank and virtual stage (the layer split);
4. the checks megatron-core makes at run time, outside construction — transcribed, each with
   where it lives: the micro-batch calculator (called), sequence-parallel scatter, CP's sequence
   split, the interleaved schedule's micro-batch groups, column-parallel widths over TP and ETP,
   the flex dispatcher;
5. Megatron-LM's validate_args (megatron/training/arguments.py at core_v0.16.1) on the tuned
   knobs, transcribed.

Environment needs (Transformer Engine for tp_comm_overlap and activation offloading, DeepEP for
the flex dispatcher, grouped_gemm) are not configuration validity and are not judged here.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from optico.strategy import Strategy
from optico.workload import Workload


class _FakeGroup:
    def __init__(self, ranks: Any = None):
        self.ranks = list(ranks or [])

    def size(self) -> int:
        return len(self.ranks)

    def rank(self) -> int:
        return 0


@contextlib.contextmanager
def fake_distributed(world: list[int]) -> Iterator[None]:
    """torch.distributed as a process of a `world[0]`-rank job, without any communication."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    saved = {name: getattr(dist, name) for name in ("is_initialized", "get_world_size", "get_rank", "new_group")}
    saved_create = ps.create_group
    dist.is_initialized = lambda: True
    dist.get_world_size = lambda group=None: world[0]
    dist.get_rank = lambda group=None: 0
    dist.new_group = lambda ranks=None, **kw: _FakeGroup(ranks)
    ps.create_group = lambda ranks=None, **kw: _FakeGroup(ranks)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
        ps.create_group = saved_create


def _config_kwargs(w: Workload, s: Strategy) -> dict[str, Any]:
    m = w.model
    vpp = s.virtual_pipeline_model_parallel_size if s.vpp > 1 else None
    overlap_p2p = bool(vpp) and s.overlap_p2p_comm  # Megatron-LM: off without the interleaved schedule
    kw: dict[str, Any] = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads,
        num_query_groups=m.groups, kv_channels=m.head_dim, ffn_hidden_size=m.ffn_hidden_size,
        gated_linear_unit=m.swiglu, add_bias_linear=False, bf16=True, params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp, virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=s.cp, expert_model_parallel_size=s.ep,
        expert_tensor_parallel_size=s.expert_tensor_parallel_size, sequence_parallel=s.sequence_parallel,
        recompute_granularity=s.recompute_granularity, recompute_method=s.recompute_method,
        recompute_num_layers=s.recompute_num_layers,
        num_layers_in_first_pipeline_stage=s.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=s.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=s.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=s.account_for_loss_in_pipeline_split,
        overlap_p2p_comm=overlap_p2p, batch_p2p_comm=s.batch_p2p_comm if vpp else not overlap_p2p,
        tp_comm_overlap=s.tp_comm_overlap, cross_entropy_loss_fusion=s.cross_entropy_loss_fusion,
        moe_token_dispatcher_type=s.moe_token_dispatcher_type, moe_grouped_gemm=s.moe_grouped_gemm,
        overlap_moe_expert_parallel_comm=s.overlap_moe_expert_parallel_comm,
        cpu_offloading=s.cpu_offloading_num_layers > 0, cpu_offloading_num_layers=s.cpu_offloading_num_layers,
    )
    if m.is_moe:
        kw.update(num_moe_experts=m.num_experts, moe_router_topk=m.moe_router_topk, moe_ffn_hidden_size=m.expert_ffn,
                  moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
                  moe_layer_freq=m.moe_layer_freq,
                  # Megatron-LM needs pre-softmax routing for top-1 (a model setting, not a tuned knob).
                  moe_router_pre_softmax=m.moe_router_topk == 1)
    return kw


def _construction(w: Workload, s: Strategy) -> tuple[Any, list[str]]:
    from megatron.core.transformer.transformer_config import TransformerConfig

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return TransformerConfig(**_config_kwargs(w, s)), []
    except (ValueError, AssertionError, NotImplementedError, RuntimeError) as err:
        return None, [f"TransformerConfig: {err}"]


def _parallel_state(w: Workload, s: Strategy) -> list[str]:
    from megatron.core import parallel_state as ps

    with fake_distributed([w.world_size]):
        try:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=s.tp, pipeline_model_parallel_size=s.pp,
                virtual_pipeline_model_parallel_size=s.virtual_pipeline_model_parallel_size,
                context_parallel_size=s.cp, expert_model_parallel_size=s.ep,
                expert_tensor_parallel_size=s.expert_tensor_parallel_size, create_gloo_process_groups=False)
            return []
        except (RuntimeError, AssertionError, ValueError) as err:
            return [f"parallel_state: {err}"]
        finally:
            ps.destroy_model_parallel()


def _layer_split(config: Any, s: Strategy) -> list[str]:
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    try:
        for rank in range(s.pp):
            for vp in range(s.vpp):
                get_num_layers_to_build(config, vp_stage=vp if s.vpp > 1 else None, pp_rank=rank)
    except (AssertionError, ValueError) as err:
        return [f"get_num_layers_to_build: {err}"]
    return []


def _run_time(w: Workload, s: Strategy) -> list[str]:
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator

    m, out = w.model, []
    world, mp = w.world_size, s.tp * s.pp * s.cp
    if world % mp:
        return out  # parallel_state refuses it already
    dp = world // mp
    try:  # megatron-core's micro-batch calculator, as Megatron-LM builds it
        calc = ConstantNumMicroBatchesCalculator(w.global_batch_size, s.mbs, dp, False, 0)
        micro = calc.get()
    except AssertionError as err:
        return out + [f"num_microbatches_calculator: {err}"]
    if s.vpp > 1 and s.pp > 1:
        # schedules.forward_backward_pipelining_with_interleaving with
        # microbatch_group_size_per_vp_stage = PP (its default).
        group = s.pp
        if group > micro or group < s.pp or 0 < micro % group < s.pp:
            out.append(f"interleaved schedule: {micro} micro-batches, groups of PP={s.pp}")
    if s.sequence_parallel and (w.seq_length // s.cp) % s.tp:
        out.append("scatter_to_sequence_parallel_region: (seq/CP) not divisible by TP")
    if s.cp > 1 and w.seq_length % (2 * s.cp):
        out.append("get_batch_on_this_cp_rank: seq not divisible by 2·CP")
    kinds = {mlp for _, mlp in m.layer_kinds()}
    if "dense" in kinds and m.ffn_hidden_size % s.tp:
        out.append("ColumnParallelLinear (dense MLP): ffn_hidden_size not divisible by TP")
    if m.is_moe:
        if m.moe_shared_expert_intermediate_size and m.moe_shared_expert_intermediate_size % s.tp:
            out.append("ColumnParallelLinear (shared expert): width not divisible by TP")
        if m.expert_ffn % s.etp:
            out.append("experts: moe_ffn_hidden_size not divisible by ETP")
        if s.moe_token_dispatcher_type == "flex" and s.etp * s.ep <= 1:
            out.append("MoEFlexTokenDispatcher: TPxEP > 1")
        if s.tp > 1 and not s.sequence_parallel:
            out.append("MoELayer.forward (training): TP > 1 without sequence parallelism")
    return out


def _validate_args(w: Workload, s: Strategy) -> list[str]:
    """megatron/training/arguments.py validate_args (core_v0.16.1) on the tuned knobs."""
    m, out = w.model, []
    sequence_parallel = s.sequence_parallel and s.tp > 1  # validate_args turns SP off at TP 1
    if s.overlap_param_gather and not s.use_distributed_optimizer:
        out.append("validate_args: --overlap-param-gather only supported with distributed optimizer")
    if s.overlap_param_gather and not s.overlap_grad_reduce:
        out.append("validate_args: --overlap-param-gather needs --overlap-grad-reduce")
    if s.tp_comm_overlap and not sequence_parallel:
        out.append("validate_args: TP communication overlap needs sequence parallelism")
    if s.vpp > 1:
        if s.overlap_p2p_comm and s.pp <= 1:
            out.append("validate_args: interleaved schedule needs PP > 1")
        if not s.overlap_p2p_comm and s.pp <= 2:
            out.append("validate_args: interleaved schedule without p2p overlap needs PP > 2")
    if m.is_moe and s.tp > 1 and not s.sequence_parallel:
        out.append("validate_args: MoE with TP > 1 needs sequence parallelism")
    if s.ep > 1 and (m.num_experts is None or m.num_experts % s.ep):
        out.append("validate_args: num_experts must be a multiple of EP")
    if s.cp > 1 and w.seq_length % (2 * s.cp):
        out.append("validate_args: seq_length divisible by 2·CP")
    return out


def megatron_refuses(w: Workload, s: Strategy) -> list[str]:
    """Why megatron-core / Megatron-LM refuse `s` on `w` (empty: they run it)."""
    config, reasons = _construction(w, s)
    reasons += _parallel_state(w, s)
    if config is not None:
        reasons += _layer_split(config, s)
    return reasons + _run_time(w, s) + _validate_args(w, s)

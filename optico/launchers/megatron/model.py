"""Builds the benchmark's megatron-core objects from a Workload and a Strategy: the
TransformerConfig, the layer spec, the GPT model chunks wrapped in DDP, and the optimizer.

Import after `cpu_shim.install()` (imports megatron.core). The choices follow Megatron-LM's
defaults for a Llama-style (SwiGLU, RMSNorm, RoPE, untied embeddings) or GPT-style (GeLU,
LayerNorm, biases) decoder; where Megatron-LM derives a setting from another one
(batch_p2p_comm, grad accumulation in fp32, gradient accumulation fusion), the same rule is
applied here and recorded in `Plan.effective`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.enums import ModelType
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from optico.launchers.megatron import compat, cpu_shim
from optico.launchers.megatron.layers import LocalNorm, SDPAttention
from optico.knobs import KNOBS
from optico.parallel import ParallelDims
from optico.strategy import Strategy
from optico.workload import Workload

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


class BenchConfigError(ValueError):
    """A configuration this driver cannot run here (reported as invalid_config); `params`
    names the Strategy fields at fault, when there are any."""

    def __init__(self, message: str, params: list[str] | tuple[str, ...] = ()):
        super().__init__(message)
        self.params = list(params)


@dataclass
class Plan:
    """The run's layout and every setting derived from the strategy (what actually ran)."""

    world_size: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    dp: int
    micro_batch_size: int
    num_microbatches: int
    global_batch_size: int
    seq_length: int
    precision: str
    grad_reduce_in_fp32: bool
    device: str
    use_cpu_initialization: bool
    layer_spec: str = ""
    effective: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def make_plan(w: Workload, s: Strategy, world_size: int, *, device: str,
              use_cpu_initialization: bool | None = None) -> Plan:
    """Derives DP, micro-batches and expert TP; raises BenchConfigError for what cannot run here."""
    s = s.normalized()
    if world_size != w.world_size:
        raise BenchConfigError(f"the workload's cluster has {w.world_size} GPUs but {world_size} processes "
                               f"were started (torchrun --nproc-per-node x --nnodes must equal it)")
    dims = ParallelDims.of(s, world_size)
    if world_size % dims.model_parallel:
        raise BenchConfigError(f"world size ({world_size}) must be divisible by TP·PP·CP ({dims.model_parallel})",
                               ["tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"])
    dp = dims.dp
    if w.global_batch_size % (s.mbs * dp):
        raise BenchConfigError(f"global_batch_size ({w.global_batch_size}) must be divisible by "
                               f"micro_batch_size·DP ({s.mbs}·{dp})", ["micro_batch_size"])
    if s.vpp > 1 and s.batch_p2p_comm:
        # Megatron-LM refuses it; megatron-core runs it and diverges silently.
        raise BenchConfigError("the interleaved schedule (VPP) cannot use batched p2p communication",
                               ["batch_p2p_comm", "virtual_pipeline_model_parallel_size"])
    if s.vpp > 1 and not s.overlap_p2p_comm and s.pp <= 2:
        raise BenchConfigError(f"the interleaved schedule without overlapped p2p communication needs PP > 2 "
                               f"(PP is {s.pp})", ["overlap_p2p_comm", "pipeline_model_parallel_size"])
    if s.cp > 1 and not compat.HAVE_TE:
        raise BenchConfigError(
            f"context parallelism (CP={s.cp}) needs Transformer Engine (TEDotProductAttention), "
            f"which is not available here" + (" (no CUDA)" if device == "cpu" else ""), ["context_parallel_size"])
    if w.precision == "fp8" and not compat.HAVE_TE:
        raise BenchConfigError("fp8 training needs Transformer Engine, which is not available here")
    if s.cross_entropy_loss_fusion and w.cross_entropy_fusion_impl == "te" and not compat.HAVE_TE:
        raise BenchConfigError("cross-entropy fusion with cross_entropy_fusion_impl te needs Transformer Engine, "
                               "which is not available here", ["cross_entropy_loss_fusion"])
    for knob in KNOBS:  # the registry marks what needs Transformer Engine
        if knob.te_only and knob.active(s) and not compat.HAVE_TE:
            raise BenchConfigError(f"{knob.name} needs Transformer Engine, which is not available here",
                                   [knob.name])
    # Megatron-LM: expert tensor parallel size defaults to the TP size.
    etp = s.etp if w.model.is_moe else 1
    plan = Plan(world_size=world_size, tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=etp, vpp=s.vpp, dp=dp,
                micro_batch_size=s.mbs, num_microbatches=dims.microbatches(w.global_batch_size, s.mbs),
                global_batch_size=w.global_batch_size, seq_length=w.seq_length, precision=w.precision,
                grad_reduce_in_fp32=w.grads_in_fp32, device=device,
                use_cpu_initialization=(device == "cpu") if use_cpu_initialization is None else use_cpu_initialization)
    cpu_shim.plan_overrides(plan)
    return plan


def transformer_config(w: Workload, s: Strategy, plan: Plan) -> TransformerConfig:
    """TransformerConfig with every strategy field applied, as Megatron-LM would set it."""
    m, s = w.model, s.normalized()
    dtype = DTYPES[w.precision]
    swiglu = m.swiglu
    vpp = plan.vpp if plan.vpp > 1 else None
    overlap_p2p = bool(vpp) and s.overlap_p2p_comm  # Megatron-LM: off without the interleaved schedule
    batch_p2p = s.batch_p2p_comm if vpp else not overlap_p2p  # Megatron-LM: batch_p2p = not overlap_p2p
    moe_grouped = False
    if m.is_moe and s.moe_grouped_gemm:
        moe_grouped = compat.HAVE_TE or compat.have_legacy_grouped_gemm()
        if not moe_grouped:
            plan.notes.append("moe_grouped_gemm requested but neither Transformer Engine nor grouped_gemm is "
                              "available: experts run as SequentialMLP")
    add_bias = not swiglu and not m.is_moe
    if m.is_moe and not swiglu:
        plan.notes.append("add_bias_linear off for MoE (megatron-core's local experts fail with biases)")
    kw: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.groups,
        kv_channels=m.head_dim,
        ffn_hidden_size=m.ffn_hidden_size,
        gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else F.gelu,
        normalization="RMSNorm" if swiglu else "LayerNorm",
        layernorm_epsilon=1e-5,
        add_bias_linear=add_bias,
        add_qkv_bias=add_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        bf16=w.precision in ("bf16", "fp8"),
        fp16=w.precision == "fp16",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        fp8="hybrid" if w.precision == "fp8" else None,
        # parallelism
        tensor_model_parallel_size=plan.tp,
        pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=plan.cp,
        expert_model_parallel_size=plan.ep,
        expert_tensor_parallel_size=plan.etp,
        sequence_parallel=s.sequence_parallel,
        num_layers_in_first_pipeline_stage=s.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=s.decoder_last_pipeline_num_layers,
        overlap_p2p_comm=overlap_p2p,
        batch_p2p_comm=batch_p2p,
        deallocate_pipeline_outputs=True,
        tp_comm_overlap=s.tp_comm_overlap,
        # memory
        recompute_granularity=s.recompute_granularity,
        recompute_method=s.recompute_method,
        recompute_num_layers=s.recompute_num_layers,
        # fusions (Megatron-LM defaults; the CPU shim turns the torch.compile'd ones off)
        cross_entropy_loss_fusion=s.cross_entropy_loss_fusion,
        cross_entropy_fusion_impl=w.cross_entropy_fusion_impl,
        bias_activation_fusion=swiglu or add_bias,  # Megatron-LM: swiglu fusion; gelu fusion needs a bias
        bias_dropout_fusion=True,
        masked_softmax_fusion=compat.HAVE_TE,
        apply_rope_fusion=compat.HAVE_TE,
        gradient_accumulation_fusion=compat.have_apex_grad_accum_fusion(),
        persist_layer_norm=False,
        use_cpu_initialization=plan.use_cpu_initialization,
        perform_initialization=True,
    )
    if m.is_moe:
        kw.update(
            num_moe_experts=m.num_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.expert_ffn,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_token_dispatcher_type=s.moe_token_dispatcher_type,
            moe_grouped_gemm=moe_grouped,
            moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2,
        )
        if moe_grouped and not compat.HAVE_TE:
            kw["moe_use_legacy_grouped_gemm"] = True  # 0.16 only; dropped below on 0.17+
    # Knobs the registry maps one to one onto a TransformerConfig field and that are not set above
    # (ETP, EP communication overlap, embedding/loss in the pipeline split, activation offloading).
    for knob in KNOBS:
        if knob.mcore and knob.mcore[0] == "transformer" and knob.mcore[1] not in kw \
                and (m.is_moe or not knob.moe_only):
            kw[knob.mcore[1]] = getattr(s, knob.name)
    if s.cpu_offloading_num_layers:
        kw["cpu_offloading"] = True
    kw = cpu_shim.config_overrides(kw, plan.notes)
    kw, dropped = compat.config_kwargs_supported(TransformerConfig, kw)
    te_loss = s.cross_entropy_loss_fusion and w.cross_entropy_fusion_impl != "native"
    if "cross_entropy_fusion_impl" in dropped and te_loss:
        # An older megatron-core would run its native kernel, whose memory the model did not price.
        raise BenchConfigError(f"this megatron-core has no cross_entropy_fusion_impl, so its fused cross entropy "
                               f"cannot run the workload's {w.cross_entropy_fusion_impl} kernel",
                               ["cross_entropy_loss_fusion"])
    if dropped:
        plan.notes.append(f"TransformerConfig of this megatron-core has no {', '.join(dropped)}")
    config = TransformerConfig(**kw)
    plan.effective.update(
        overlap_p2p_comm=overlap_p2p, batch_p2p_comm=batch_p2p, expert_tensor_parallel_size=plan.etp,
        moe_grouped_gemm=moe_grouped if m.is_moe else None,
        gradient_accumulation_fusion=config.gradient_accumulation_fusion,
        recompute_modules=list(config.recompute_modules or []) if s.recompute_granularity == "selective" else None,
        normalization=config.normalization, use_cpu_initialization=plan.use_cpu_initialization,
        # The fused loss's memory depends on its kernel (None: a megatron-core without the choice, native).
        cross_entropy_fusion_impl=getattr(config, "cross_entropy_fusion_impl", None)
        if s.cross_entropy_loss_fusion else None,
    )
    return config


def layer_spec(config: TransformerConfig, plan: Plan):
    """One transformer layer's ModuleSpec: TE modules when TE is usable, else megatron's local
    modules with SDPA attention and the SP-capable norm. Returns (spec, final norm class)."""
    num_experts = config.num_moe_experts
    grouped = bool(getattr(config, "moe_grouped_gemm", False))
    if compat.HAVE_TE:
        from megatron.core.extensions.transformer_engine import TENorm
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        plan.layer_spec = "transformer_engine"
        return get_gpt_layer_with_transformer_engine_spec(num_experts=num_experts, moe_grouped_gemm=grouped), TENorm
    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=grouped,
                                    normalization=config.normalization)
    sub = spec.submodules
    sub.input_layernorm = LocalNorm
    sub.pre_mlp_layernorm = LocalNorm
    sub.self_attention.submodules.core_attention = SDPAttention
    plan.layer_spec = "local+sdpa"
    return spec, LocalNorm


def model_chunks(w: Workload, config: TransformerConfig, plan: Plan) -> list[torch.nn.Module]:
    """The GPT model chunks of this rank (one, or VPP of them), not yet wrapped."""
    m = w.model
    spec, final_norm = layer_spec(config, plan)
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    chunks = []
    for vp_stage in range(plan.vpp):
        stage = vp_stage if plan.vpp > 1 else None
        n_layers = get_num_layers_to_build(config, vp_stage=stage)
        block = TransformerBlockSubmodules(layer_specs=[spec] * n_layers, layer_norm=final_norm)
        model = GPTModel(
            config=config,
            transformer_layer_spec=block,
            vocab_size=m.padded_vocab(plan.tp),
            max_sequence_length=w.seq_length,
            pre_process=pp_rank == 0 and vp_stage == 0,
            post_process=pp_rank == plan.pp - 1 and vp_stage == plan.vpp - 1,
            parallel_output=True,
            share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
            position_embedding_type="rope",
            rotary_percent=1.0,
            vp_stage=stage,
        )
        model.model_type = ModelType.encoder_or_decoder
        model.vp_stage = stage
        chunks.append(model)
    return chunks


def wrap(chunks: list[torch.nn.Module], config: TransformerConfig, s: Strategy, plan: Plan) -> list[DistributedDataParallel]:
    """Moves to the device, wraps in Float16Module and megatron DDP as Megatron-LM's get_model does."""
    from megatron.core import tensor_parallel

    for chunk in chunks:
        for p in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(p)
        if torch.cuda.is_available():
            chunk.cuda(torch.cuda.current_device())
    if config.fp16 or config.bf16:
        chunks = [Float16Module(config, c) for c in chunks]
    s = s.normalized()
    n_params = sum(p.nelement() for c in chunks for p in c.parameters())
    ddp_kwargs: dict[str, Any] = dict(
        # Megatron-LM's rule (fp32 with bf16, fp16 with fp16) unless the workload says otherwise.
        grad_reduce_in_fp32=plan.grad_reduce_in_fp32,
        overlap_grad_reduce=s.overlap_grad_reduce,
        overlap_param_gather=s.overlap_param_gather,
        use_distributed_optimizer=s.use_distributed_optimizer,
        # Megatron-LM: off with fp16's dynamic loss scaling, where inf/NaN grads are its signal.
        check_for_nan_in_grad=not config.fp16,
        # Megatron-LM: 40M-element buckets (at least 1M per DP rank) when overlapping, else one.
        bucket_size=max(40_000_000, 1_000_000 * plan.dp * plan.cp) if s.overlap_grad_reduce else None,
    )
    ddp_kwargs, _ = compat.config_kwargs_supported(DistributedDataParallelConfig, ddp_kwargs)
    ddp_config = DistributedDataParallelConfig(**ddp_kwargs)
    plan.effective["grad_reduce_in_fp32"] = ddp_config.grad_reduce_in_fp32
    plan.effective["params_this_rank"] = n_params
    return [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c, disable_bucketing=i > 0)
            for i, c in enumerate(chunks)]


def optimizer(model: list[DistributedDataParallel], config: TransformerConfig, s: Strategy, *, lr: float = 1e-4):
    """megatron-core's optimizer (Adam, mixed precision, distributed when asked), Megatron-LM's
    defaults for clipping, weight decay and fp16 loss scaling."""
    opt_kwargs = dict(
        optimizer="adam",
        lr=lr,
        min_lr=lr,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=1.0,
        bf16=config.bf16,
        fp16=config.fp16,
        params_dtype=config.params_dtype,
        use_distributed_optimizer=s.use_distributed_optimizer,
        # fp16: Megatron-LM starts at 2**32 and skips ~40 steps halving it; 2**16 reaches the
        # steady state (and its step time) within a few steps.
        initial_loss_scale=2.0 ** 16,
        min_loss_scale=1.0,
        loss_scale_window=1000,
        hysteresis=2,
    )
    opt_kwargs, _ = compat.config_kwargs_supported(OptimizerConfig, opt_kwargs)
    return get_megatron_optimizer(OptimizerConfig(**opt_kwargs), model, use_gloo_process_groups=False)

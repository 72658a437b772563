"""Peak memory per GPU, per pipeline stage.

Weights, gradients and Adam state after Megatron's mixed-precision scheme (bf16
weights, fp32 main grads, fp32 master + two moments: 18 B/param, or 6 + 12/DP with
the distributed optimizer sharding over DP·CP; experts shard over expert-DP). Grads
are 2 B when the workload reduces them in the parameter dtype (fp16 by Megatron-LM's
default, and the NeMo / Megatron-Bridge performance recipes).
Activations after Korthikanti et al. 2022 with flash attention (no s² scores), split
by TP, by SP for the norms and residuals, by CP along the sequence; selective
recompute drops the attention output, full recompute keeps one input per recompute
chunk. The first stage holds PP micro-batches in flight under 1F1B, more when
interleaved; the last holds the logits of one micro-batch at the loss (a fused cross entropy
saves memory with Transformer Engine's kernel and costs a float32 copy with megatron-core's
native one, `logits_bytes_per_element`). Each stage is the sum
of its layers by kind (`perfmodel.layers`: attention/MLA/Mamba mixers, dense/MoE MLPs, the
multi-token-prediction layer on the last stage); activation offloading moves the offloaded
layers' activations to host memory (one layer in transit stays).
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from optico.perfmodel.constants import Constants
from optico.perfmodel.layers import activation_bytes, params_per_gpu
from optico.perfmodel.layout import Layout
from optico.strategy import Strategy
from optico.workload import Workload

GIB = 1024**3
# megatron-core's native fused cross entropy (`cross_entropy_fusion_impl='native'`, its default) holds
# one more float32 copy of the logits than the unfused loss: +4.0 B per logit element on every pair
# with and without the fusion in the H100 sweep (calibration data: MBS 1, 2, 4, 8). Measured, not
# profiled: we read it as its jit-fused steps returning new tensors where the unfused loss works in place.
NATIVE_FUSED_EXTRA_BYTES = 4.0


class MemoryBreakdown(BaseModel):
    """The peak stage's memory in GiB, by kind."""

    model_config = ConfigDict(frozen=True)

    stage: int
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float
    overhead_gib: float
    total_gib: float
    limit_gib: float
    reclaimable_gib: float = 0.0  # allocator slack PyTorch frees and retries with before an OOM
    stage_totals_gib: list[float] = []

    @property
    def needed_gib(self) -> float:
        """What must fit: the peak without the caching allocator's reclaimable slack."""
        return self.total_gib - self.reclaimable_gib

    @property
    def fraction(self) -> float:
        return self.total_gib / self.limit_gib


def _params_on_stage(w: Workload, s: Strategy, lay: Layout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one GPU of `stage` holds."""
    m = w.model
    dense, expert = 0.0, 0.0
    for kind, count in lay.stage_kinds[stage].items():
        d, e = params_per_gpu(w, lay, kind)
        dense += d * count
        expert += e * count
    if stage == lay.pp - 1 and m.mtp_num_layers:
        dense += m.mtp_num_layers * (2 * m.hidden_size * m.hidden_size / lay.tp + 3 * m.hidden_size)
    embed = m.padded_vocab(lay.tp) * m.hidden_size / lay.tp
    if stage == 0:
        dense += embed
    if stage == lay.pp - 1 and (m.untie_embeddings_and_output_weights or lay.pp > 1):
        dense += embed  # the output layer, or the tied copy Megatron keeps on the last stage
    return dense, expert


def layer_activation_bytes(w: Workload, s: Strategy, lay: Layout, c: Constants) -> tuple[float, float]:
    """(stored bytes, kept input) of an average layer of the model, per micro-batch."""
    kinds = Counter(w.model.layer_kinds())
    total = [0.0, 0.0]
    for kind, count in kinds.items():
        stored, kept = activation_bytes(w, s, lay, c, kind)
        total[0] += stored * count
        total[1] += kept * count
    return total[0] / w.model.num_layers, total[1] / w.model.num_layers


def stage_activation_bytes(w: Workload, s: Strategy, lay: Layout, c: Constants, stage: int) -> float:
    """Activations held at the stage's peak: in-flight micro-batches plus one layer being
    recomputed/backpropagated. Offloaded layers (activation offloading) keep theirs in host memory."""
    per_kind = {kind: activation_bytes(w, s, lay, c, kind) for kind in lay.stage_kinds[stage]}
    layers = sum(lay.stage_kinds[stage].values())
    if not layers:
        return 0.0
    full = sum(per_kind[k][0] * n for k, n in lay.stage_kinds[stage].items()) / layers  # an average layer
    kept_input = sum(per_kind[k][1] * n for k, n in lay.stage_kinds[stage].items()) / layers
    offloaded = min(s.cpu_offloading_num_layers, layers)
    on_gpu = layers - offloaded
    if s.recompute_granularity == "full":
        n = s.recompute_num_layers or 1
        chunk_layers = layers / lay.vpp
        if s.recompute_method == "block":
            # The first n layers of each chunk are checkpointed one layer at a time
            # (TransformerBlock._checkpointed_forward), so one layer is rematerialized at once.
            recomputed = min(n, chunk_layers) * lay.vpp
            per_microbatch = recomputed * kept_input + (layers - recomputed) * full
            working = full
        else:
            chunks = max(1.0, layers / n)
            per_microbatch = chunks * kept_input
            working = full * n
    else:
        per_microbatch = on_gpu * full + (full if offloaded else 0.0)  # one offloaded layer in transit
        working = full
    if stage == 0:
        per_microbatch += 2.0 * lay.tokens * w.model.hidden_size / (lay.tp if s.sequence_parallel else 1)
    return per_microbatch * lay.in_flight[stage] + working


def logits_bytes_per_element(w: Workload, s: Strategy, c: Constants) -> float:
    """Bytes held per logit element at the loss: Transformer Engine's fused kernel saves memory,
    megatron-core's native one costs it."""
    if not s.cross_entropy_loss_fusion:
        return c.logits_bytes
    if w.cross_entropy_fusion_impl == "te":
        return c.logits_bytes_fused
    return c.logits_bytes + NATIVE_FUSED_EXTRA_BYTES


def memory(w: Workload, s: Strategy, lay: Layout, c: Constants) -> MemoryBreakdown:
    """The highest stage's memory."""
    m = w.model
    limit = w.cluster.spec.memory_gib
    dense_shard = lay.dp * lay.cp if s.use_distributed_optimizer else 1
    expert_shard = lay.expert_dp if s.use_distributed_optimizer else 1
    best: MemoryBreakdown | None = None
    totals: list[float] = []
    for stage in range(lay.pp):
        dense, expert = _params_on_stage(w, s, lay, stage)
        params = dense + expert
        weights = (3.0 if w.precision == "fp8" else 2.0) * params  # fp8 adds a cached fp8 copy
        grads = (4.0 if w.grads_in_fp32 else 2.0) * params
        optimizer = 12.0 * (dense / dense_shard + expert / expert_shard)
        raw_acts = stage_activation_bytes(w, s, lay, c, stage)
        acts = raw_acts * (1 + c.mem_fragmentation)
        logits = 0.0
        if stage == lay.pp - 1:
            per_element = logits_bytes_per_element(w, s, c)
            # The main head's logits (multi-token prediction holds its own at the same time).
            logits = lay.tokens * m.padded_vocab(lay.tp) / lay.tp * per_element * (1 + (m.mtp_num_layers or 0))
        total = (weights + grads + optimizer + acts + logits) / GIB + c.mem_overhead_gib
        totals.append(total)
        candidate = MemoryBreakdown(
            stage=stage, weights_gib=weights / GIB, grads_gib=grads / GIB, optimizer_gib=optimizer / GIB,
            activations_gib=acts / GIB, logits_gib=logits / GIB, overhead_gib=c.mem_overhead_gib,
            total_gib=total, limit_gib=limit, reclaimable_gib=raw_acts * c.mem_fragmentation / GIB)
        if best is None or candidate.total_gib > best.total_gib:
            best = candidate
    assert best is not None
    return best.model_copy(update={"stage_totals_gib": totals})

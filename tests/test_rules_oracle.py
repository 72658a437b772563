"""`optico.rules.violations` held against megatron-core's own checks (tests/megatron_oracle.py).

Thousands of sampled (workload, strategy) pairs — dense, MoE (some with dense first layers and
shared experts), odd layer counts, GQA, uneven stages, the embedding/loss in the split, ETP,
every coupled flag — each judged by both. The rules must never accept what megatron refuses,
and may refuse what it accepts only for a reason listed in DELIBERATE, each with why.
"""

from __future__ import annotations

import importlib.util
import random
from collections import Counter
from typing import Any

import pytest

from optico.rules import violations
from optico.strategy import Strategy
from optico.workload import Cluster, ModelArch, Workload

pytestmark = pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None,
                                reason="needs megatron-core (make install-test)")

SAMPLES = 2500
SEED = 16

# Where the rules are stricter than megatron-core on purpose: rule text -> why.
DELIBERATE: dict[str, str] = {
    "uneven first/last pipeline stages need PP > 1":
        "with PP 1 megatron-core takes the stage sizes anyway: the one stage builds the LAST_PP_NUM_LAYERS layers "
        "(8 layers, first 4, last 6 builds 6), or they mean nothing; the rules refuse both, so a knob that "
        "changes nothing is never tried twice and one that drops layers never runs",
    "VPP must not be combined with batched p2p communication":
        "megatron-core runs it, and the interleaved schedule then silently diverges (FIELD-NOTES: checked on CPU "
        "with gloo); Megatron-LM never sets it (it derives batch_p2p_comm = not overlap_p2p_comm)",
}


def _model(rng: random.Random) -> ModelArch:
    heads = rng.choice([8, 12, 16, 24, 32])
    groups = rng.choice([None, 1, 2, 4, 8, heads])
    if groups and heads % groups:
        groups = None
    hidden = heads * rng.choice([32, 64])
    layers = rng.choice([4, 6, 8, 12, 13, 16, 24, 30, 32, 61])
    ffn = rng.choice([4 * hidden, 3 * hidden, 2 * hidden + 24, 5461])
    data: dict[str, Any] = dict(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                num_query_groups=groups, ffn_hidden_size=ffn, vocab_size=rng.choice([1024, 50257]))
    if rng.random() < 0.45:
        experts = rng.choice([4, 8, 16, 64])
        data.update(num_experts=experts, moe_router_topk=rng.choice([1, 2, 4]) if experts >= 4 else 1,
                    moe_ffn_hidden_size=rng.choice([hidden, hidden // 2 + 8, 2 * hidden]))
        if rng.random() < 0.3:
            data["moe_shared_expert_intermediate_size"] = rng.choice([hidden, hidden + 8])
        if rng.random() < 0.3:
            dense = rng.choice([1, 3])
            data["moe_layer_freq"] = [0] * dense + [1] * (layers - dense)
    return ModelArch(**data)


def _strategy(rng: random.Random, m: ModelArch, world: int) -> Strategy:
    """Mostly plausible values (divisors of what they split), sometimes anything: the sample holds
    both accepted and refused configurations in good number."""
    pick = rng.choice

    def plausible(options: list[int], fits) -> int:
        good = [o for o in options if fits(o)]
        return pick(good) if good and rng.random() < 0.8 else pick(options)

    tp = plausible([1, 2, 4, 8, 3], lambda t: m.num_attention_heads % t == 0 and world % t == 0)
    pp = plausible([1, 2, 3, 4, 8], lambda p: m.num_layers % p == 0 and world % (tp * p) == 0)
    cp = plausible([1, 2, 4], lambda c: world % (tp * pp * c) == 0) if rng.random() < 0.3 else 1
    d: dict[str, Any] = dict(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
        micro_batch_size=pick([1, 1, 2, 4, 3]),
        sequence_parallel=tp > 1 and rng.random() < 0.6 or rng.random() < 0.05,
        recompute_granularity=pick([None, None, "selective", "full"]),
        use_distributed_optimizer=rng.random() < 0.6,
        overlap_grad_reduce=rng.random() < 0.5,
        cross_entropy_loss_fusion=rng.random() < 0.3,
        overlap_p2p_comm=rng.random() < 0.85,
        batch_p2p_comm=rng.random() < 0.03,
    )
    d["overlap_param_gather"] = rng.random() < (0.5 if d["use_distributed_optimizer"] else 0.05)
    d["tp_comm_overlap"] = rng.random() < (0.2 if d["sequence_parallel"] else 0.02)
    if pp > 1 and rng.random() < 0.35:
        d["virtual_pipeline_model_parallel_size"] = pick([2, 3, 4])
    if d["recompute_granularity"] == "full":
        d["recompute_method"] = pick(["uniform", "block"])
        d["recompute_num_layers"] = pick([1, 2, 4, 40])
    if (pp > 1 or rng.random() < 0.05) and rng.random() < 0.3:
        per = m.num_layers // max(pp, 1)
        d["decoder_first_pipeline_num_layers"] = max(1, per + pick([-2, -1, 0, 1, 2]))
        if rng.random() < 0.6:
            d["decoder_last_pipeline_num_layers"] = max(1, per + pick([-2, -1, 0, 1, 2]))
    if pp > 1 and rng.random() < 0.1:
        d["account_for_embedding_in_pipeline_split"] = True
    if pp > 1 and rng.random() < 0.1:
        d["account_for_loss_in_pipeline_split"] = True
    if rng.random() < 0.03:
        d["cpu_offloading_num_layers"] = pick([1, 2, m.num_layers])
    if m.is_moe or rng.random() < 0.03:
        etp = pick([None, None, 1, 2])
        grid = tp if etp is None else etp
        d["expert_model_parallel_size"] = plausible(
            [1, 2, 4, 8, 16, 3], lambda e: (m.num_experts or 1) % e == 0 and world % (grid * e * pp) == 0)
        d["expert_tensor_parallel_size"] = etp
        d["moe_token_dispatcher_type"] = pick(["allgather", "alltoall", "alltoall", "flex"])
        d["moe_grouped_gemm"] = rng.random() < 0.5
        d["overlap_moe_expert_parallel_comm"] = rng.random() < 0.15
    return Strategy.model_validate(d)


def sample(n: int, seed: int) -> list[tuple[Workload, Strategy]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = _model(rng)
        world = rng.choice([1, 2, 4, 8, 8, 16, 32, 64])
        w = Workload(model=m, seq_length=rng.choice([1024, 2048, 4096, 4096, 4098, 3000]),
                     global_batch_size=rng.choice([64, 128, 256, 512, 96, 24]), precision="bf16",
                     cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=max(1, world // 8), num_gpus=world))
        out.append((w, _strategy(rng, m, world)))
    return out


def compare(n: int = SAMPLES, seed: int = SEED) -> dict[str, Any]:
    """Both judges on `n` samples: agreement, and every disagreement by kind."""
    from tests.megatron_oracle import megatron_refuses

    looser: list[str] = []  # the rules accept, megatron refuses
    stricter: Counter = Counter()  # the rules refuse, megatron accepts: rule text -> configurations
    unlisted: list[str] = []
    accepted = 0
    for w, s in sample(n, seed):
        ours, theirs = violations(w, s), megatron_refuses(w, s)
        accepted += not theirs
        where = f"{s.short()} on {w.model.num_layers} layers, {w.world_size} GPUs"
        if not ours and theirs:
            looser.append(f"{where}: {theirs[0]}")
        elif ours and not theirs:
            for v in ours:
                key = next((k for k in DELIBERATE if k in v.message), None)
                stricter[key or v.message] += 1
                if key is None:
                    unlisted.append(f"{where}: {v.message}")
    stricter_rows = sum(stricter.values())
    return {"samples": n, "megatron_accepts": accepted, "looser": looser, "stricter": dict(stricter),
            "unlisted": unlisted, "agreement": 1 - (len(looser) + stricter_rows) / n}


def test_rules_agree_with_megatron_core():
    result = compare()
    n = result["samples"]
    # Both kinds of configuration are well represented.
    assert 0.2 < result["megatron_accepts"] / n < 0.8, result["megatron_accepts"]
    assert not result["looser"], (f"{len(result['looser'])} configurations the rules accept and megatron refuses:\n"
                                  + "\n".join(result["looser"][:10]))
    assert not result["unlisted"], ("stricter than megatron-core without a listed reason:\n"
                                    + "\n".join(result["unlisted"][:10]))
    assert result["agreement"] >= 0.99, result["agreement"]


def test_strategies_are_written_one_way_megatron_accepts():
    """A raw full-recompute strategy without a method cannot exist: construction completes it, as
    Megatron-LM would need it (TransformerConfig refuses full recompute without a method)."""
    from tests.megatron_oracle import megatron_refuses

    s = Strategy(recompute_granularity="full")
    assert (s.recompute_method, s.recompute_num_layers) == ("uniform", 1)
    w = Workload(model=ModelArch(num_layers=8, hidden_size=256, num_attention_heads=8, ffn_hidden_size=1024,
                                 vocab_size=1024), seq_length=1024, global_batch_size=8,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=1))
    assert not violations(w, s) and not megatron_refuses(w, s)

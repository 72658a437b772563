"""Strategy identity and rendering, Megatron's validity rules, the search space."""

from __future__ import annotations

import pytest

from optico.rules import InvalidStrategy, check, violations
from optico.search_space import SearchSpace
from optico.strategy import Strategy, canonical_field, strategy_from_mapping
from optico.workload import PRESETS, Cluster, Workload


def llama8b(gbs: int = 512, seq: int = 8192, nodes: int = 1) -> Workload:
    return Workload(model=PRESETS["llama3-8b"], seq_length=seq, global_batch_size=gbs, precision="bf16",
                    cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=nodes))


def test_signature_is_canonical():
    a = Strategy(tensor_model_parallel_size=2, virtual_pipeline_model_parallel_size=1)
    b = Strategy(tensor_model_parallel_size=2)
    assert a.signature() == b.signature()
    # recompute details mean nothing without full recompute
    c = Strategy(recompute_granularity="selective")
    assert c.signature() == Strategy(recompute_granularity="selective", recompute_num_layers=None).signature()
    assert Strategy(recompute_granularity="full").signature() == \
        Strategy(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1).signature()
    assert a.signature() != Strategy(tensor_model_parallel_size=4).signature()


def test_megatron_args_render_every_knob():
    s = strategy_from_mapping({"tp": 2, "pp": 4, "vpp": 2, "mbs": 2, "sp": True, "recompute": "full",
                               "distributed_optimizer": True, "overlap_grad_reduce": True,
                               "overlap_param_gather": True, "cross_entropy_loss_fusion": True,
                               "decoder_first_pipeline_num_layers": 2})
    args = s.megatron_args()
    joined = " ".join(args)
    for flag in ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4",
                 "--num-virtual-stages-per-pipeline-rank 2", "--micro-batch-size 2", "--sequence-parallel",
                 "--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1",
                 "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                 "--cross-entropy-loss-fusion", "--decoder-first-pipeline-num-layers 2"]:
        assert flag in joined, flag


def test_aliases_and_paper_names():
    assert canonical_field("TP") == "tensor_model_parallel_size"
    assert canonical_field("MICRO_BATCH_SIZE") == "micro_batch_size"
    assert canonical_field("overlap-grad-reduce") == "overlap_grad_reduce"
    with pytest.raises(KeyError, match="unknown strategy parameter"):
        canonical_field("warp")


@pytest.mark.parametrize("updates,param,text", [
    ({"tensor_model_parallel_size": 3}, "tensor_model_parallel_size", "num_attention_heads (32) must be divisible by TP (3)"),
    ({"pipeline_model_parallel_size": 3}, "pipeline_model_parallel_size", "world size (8) must be divisible"),
    ({"micro_batch_size": 3}, "micro_batch_size", "global_batch_size (512) must be divisible by MICRO_BATCH_SIZE·DP"),
    ({"sequence_parallel": True}, "sequence_parallel", "sequence parallelism needs TP > 1"),
    ({"overlap_param_gather": True, "overlap_grad_reduce": True}, "overlap_param_gather",
     "overlap param gather needs the distributed optimizer"),
    ({"virtual_pipeline_model_parallel_size": 2}, "virtual_pipeline_model_parallel_size", "VPP (2) needs PP > 1"),
    ({"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2, "batch_p2p_comm": True},
     "batch_p2p_comm", "must not be combined with batched p2p"),
    ({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2, "overlap_p2p_comm": False},
     "overlap_p2p_comm", "needs PP > 2"),
    ({"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 3},
     "virtual_pipeline_model_parallel_size", "layers per pipeline rank (8) must be divisible by VPP (3)"),
    ({"expert_model_parallel_size": 2}, "expert_model_parallel_size", "needs an MoE model"),
    ({"tp_comm_overlap": True, "tensor_model_parallel_size": 2}, "tp_comm_overlap", "needs sequence parallelism"),
    ({"pipeline_model_parallel_size": 4, "decoder_first_pipeline_num_layers": 6},
     "decoder_first_pipeline_num_layers", "middle layers (26) must be divisible by the 3 middle"),
    ({"decoder_last_pipeline_num_layers": 4}, "decoder_last_pipeline_num_layers", "need PP > 1"),
    ({"pipeline_model_parallel_size": 3, "decoder_first_pipeline_num_layers": 2,
      "account_for_embedding_in_pipeline_split": True}, "account_for_embedding_in_pipeline_split",
     "cannot be combined with uneven first/last stages"),
    ({"tensor_model_parallel_size": 8, "sequence_parallel": True, "context_parallel_size": 1},
     "", ""),
])
def test_rules_name_parameters_and_rule(updates, param, text):
    w = llama8b()
    found = violations(w, Strategy().changed(**updates))
    if not param:  # a configuration Megatron accepts
        assert not found, found
        return
    assert found, updates
    assert any(param in v.params for v in found), found
    if text:
        assert any(text in v.message for v in found), [v.message for v in found]


def test_query_groups_must_divide_or_be_divided_by_tp():
    from optico.workload import ModelArch
    m = ModelArch(num_layers=4, hidden_size=1536, num_attention_heads=24, num_query_groups=6, ffn_hidden_size=4096,
                  vocab_size=32000)
    w = Workload(model=m, seq_length=4096, global_batch_size=64, cluster=Cluster(gpu="h100-sxm"))
    found = violations(w, Strategy(tensor_model_parallel_size=4))
    assert any("num_query_groups (6) must be a multiple or divisor of TP (4)" in v.message for v in found)
    assert not violations(w, Strategy(tensor_model_parallel_size=2))


def test_cp_needs_seq_divisible_by_2cp():
    w = llama8b(seq=8200)
    found = violations(w, Strategy(context_parallel_size=8))
    assert any("seq_length (8200) must be divisible by 2·CP (16)" in v.message for v in found)


def test_moe_rules():
    w = Workload(model=PRESETS["mixtral-8x7b"], seq_length=4096, global_batch_size=256,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    assert any("num_experts (8) must be divisible by EP (16)" in v.message
               for v in violations(w, Strategy(expert_model_parallel_size=16)))
    # MoE parallel folding: the expert grid ETP·EP·PP must tile the world; ETP defaults to TP.
    tp4_ep8 = Strategy(tensor_model_parallel_size=4, expert_model_parallel_size=8, sequence_parallel=True)
    assert any("world size (16) must be divisible by ETP·EP·PP (4·8·1 = 32" in v.message
               for v in violations(w, tp4_ep8))
    # With ETP 1 EP may exceed DP·CP (4 here): megatron-core runs it.
    assert not violations(w, tp4_ep8.changed(expert_tensor_parallel_size=1))
    # MoE with TP > 1 without SP: ModelParallelConfig only warns, but MoELayer raises at the first
    # training step and Megatron-LM's validate_args refuses it.
    assert [v.params for v in violations(w, Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=2))] \
        == [("sequence_parallel", "tensor_model_parallel_size")]
    assert any("moe_ffn_hidden_size (14336) must be divisible by ETP (3)" in v.message
               for v in violations(w, Strategy(expert_tensor_parallel_size=3)))
    assert not violations(w, Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=8,
                                      sequence_parallel=True, use_distributed_optimizer=True))


def test_interleaved_schedule_needs_microbatches_divisible_by_pp():
    w = llama8b(gbs=12)
    s = Strategy(pipeline_model_parallel_size=8, virtual_pipeline_model_parallel_size=2)
    assert any("number of micro-batches (12) divisible by PP (8)" in v.message for v in violations(w, s))


def test_check_raises_with_all_params():
    with pytest.raises(InvalidStrategy) as info:
        check(llama8b(), Strategy(tensor_model_parallel_size=3, sequence_parallel=False))
    assert "tensor_model_parallel_size" in info.value.params


def test_uneven_pipeline_valid():
    w = llama8b()
    assert not violations(w, Strategy(pipeline_model_parallel_size=4, decoder_first_pipeline_num_layers=6,
                                      decoder_last_pipeline_num_layers=8))


def test_search_space_enumerates_only_valid_unique():
    w = llama8b()
    space = SearchSpace.build(w, ["tp", "pp", "mbs", "sp"], {"use_distributed_optimizer": True})
    found = list(space.enumerate(w))
    assert found
    assert len({s.signature() for s in found}) == len(found)
    assert all(not violations(w, s) for s in found)
    assert all(s.use_distributed_optimizer for s in found)
    # SP only with TP > 1
    assert not any(s.sequence_parallel and s.tp == 1 for s in found)


def test_search_space_outside_reasons():
    w = llama8b()
    space = SearchSpace.build(w, {"tp": [1, 2]}, {"use_distributed_optimizer": True})
    assert space.contains(Strategy(tensor_model_parallel_size=2, use_distributed_optimizer=True))
    reasons = space.outside(Strategy(tensor_model_parallel_size=4, use_distributed_optimizer=True))
    assert reasons and "tensor_model_parallel_size=4 is not in its domain" in reasons[0]
    assert "fixed at true" in space.outside(Strategy(tensor_model_parallel_size=2))[0]


def test_presets_have_known_sizes():
    assert abs(PRESETS["llama3-8b"].num_params() / 1e9 - 8.03) < 0.05
    assert abs(PRESETS["llama3-70b"].num_params() / 1e9 - 70.55) < 0.2
    assert abs(PRESETS["mixtral-8x7b"].num_params() / 1e9 - 46.7) < 0.2
    assert abs(PRESETS["qwen3-30b-a3b"].num_params() / 1e9 - 30.5) < 0.2
    # OpenAI's model cards: 116.8 B and 20.9 B (head dim 64, not hidden / heads = 45).
    assert abs(PRESETS["gpt-oss-120b"].num_params() / 1e9 - 116.8) < 0.2
    assert abs(PRESETS["gpt-oss-20b"].num_params() / 1e9 - 20.9) < 0.1
    # Hugging Face's counts for Llama 3.2 (tied embeddings): 1,235,814,400 and 3,212,749,824.
    assert abs(PRESETS["llama3.2-1b"].num_params() / 1e9 - 1.236) < 0.005
    assert abs(PRESETS["llama3.2-3b"].num_params() / 1e9 - 3.213) < 0.005
    assert abs(PRESETS["nemotron4-340b"].num_params() / 1e9 - 341) < 2


def test_published_model_names_find_their_preset():
    """A published row that names its model but gives no dimensions is read from the preset."""
    from optico.replay_names import preset_by_name

    named = {"Llama-3.2-1B": "llama3.2-1b", "Llama 3.2 3B": "llama3.2-3b", "Nemotron4 15b BF16": "nemotron4-15b",
             "Nemotron-4 340B": "nemotron4-340b", "Llama4 Scout 17B-16E": "llama4-scout",
             "Llama4-Maverick": "llama4-maverick"}
    assert {name: getattr(preset_by_name(name), "name", None) for name in named} == named


def test_count_changes_is_the_size_of_the_diff() -> None:
    """The analysis counts changed knobs for every candidate from a cached tuple; it must agree with
    `diff`, also on a copy (whose cached values are dropped with its signature)."""
    a = Strategy(tensor_model_parallel_size=2, micro_batch_size=1)
    b = a.changed(micro_batch_size=2, sequence_parallel=True, recompute_granularity="selective")
    assert a.count_changes(a) == 0 and a.count_changes(b) == len(a.diff(b)) == 3
    c = b.model_copy(update={"micro_batch_size": 1})
    assert a.count_changes(c) == len(a.diff(c)) == 2


def test_moe_with_tp_needs_sequence_parallelism():
    """megatron-core's MoELayer raises at the first training step without it (and Megatron-LM's
    validate_args refuses it): such configurations were launched and reported as successes."""
    w = Workload(model=PRESETS["mixtral-8x7b"], seq_length=4096, global_batch_size=256,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=4))
    broken = violations(w, Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=8))
    assert [v.params for v in broken] == [("sequence_parallel", "tensor_model_parallel_size")]
    assert "needs sequence parallelism" in broken[0].message
    assert not violations(w, Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=8,
                                      sequence_parallel=True))
    dense = w.model_copy(update={"model": PRESETS["llama3-8b"]})
    assert not violations(dense, Strategy(tensor_model_parallel_size=2))


def test_mamba_heads_and_groups_split_over_tp_and_cp():
    """megatron-core's MambaMixer asserts heads and groups divisible by TP, MambaContextParallel the
    same per TP rank over CP; TP4 and TP8 were launched for a model with two Mamba groups."""
    model = PRESETS["nemotron-h-8b"].model_copy(update={"mamba_num_groups": 2})  # 128 heads
    w = Workload(model=model, seq_length=8192, global_batch_size=64,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=1))
    assert not violations(w, Strategy(tensor_model_parallel_size=2))
    assert [v.message for v in violations(w, Strategy(tensor_model_parallel_size=4))] == [
        "mamba_num_groups (2) must be divisible by TP (4)"]
    assert not violations(w, Strategy(tensor_model_parallel_size=2, context_parallel_size=2))  # CP shares 1 group
    # 96 heads in 8 groups: TP 2 leaves 48 heads and 4 groups a rank; CP 3 splits the heads, not the groups.
    odd = w.model_copy(update={"model": model.model_copy(update={"mamba_num_heads": 96, "mamba_num_groups": 8}),
                               "seq_length": 6144,
                               "cluster": Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=1, num_gpus=24 // 4)})
    assert [v.message for v in violations(odd, Strategy(tensor_model_parallel_size=2, context_parallel_size=3))] == [
        "Mamba groups per TP rank (4) and CP (3) must divide one another"]
    assert not violations(odd.model_copy(update={"cluster": w.cluster}),
                          Strategy(tensor_model_parallel_size=2, context_parallel_size=4))


def test_a_model_without_transformer_engine_refuses_cp_and_te_only_knobs():
    """attention_backend local (--transformer-impl local): DotProductAttention asserts CP 1."""
    w = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=64, attention_backend="local",
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=1))
    cp = violations(w, Strategy(context_parallel_size=2))
    assert [v.params for v in cp] == [("context_parallel_size",)] and "Transformer Engine" in cp[0].message
    overlap = violations(w, Strategy(tensor_model_parallel_size=2, sequence_parallel=True, tp_comm_overlap=True))
    assert [v.params for v in overlap] == [("tp_comm_overlap",)]
    auto = w.model_copy(update={"attention_backend": "auto"})
    assert not violations(auto, Strategy(context_parallel_size=2))


def test_tp_stays_inside_a_node():
    """On 6-GPU nodes TP 4 puts groups across two nodes: not worth trying, and modelled as crossing."""
    from optico.perfmodel.constants import Constants
    from optico.perfmodel.layout import _link_bw
    from optico.search_space import default_domain

    c = Constants()

    six = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=96,
                   cluster=Cluster(gpu="h100-sxm", gpus_per_node=6, nodes=2))
    assert default_domain("tensor_model_parallel_size", six) == [1, 2]
    assert _link_bw(six, c, 4) < _link_bw(six, c, 2)
    one_node = six.model_copy(update={"cluster": Cluster(gpu="h100-sxm", gpus_per_node=6, nodes=1, num_gpus=4)})
    assert _link_bw(one_node, c, 4) == _link_bw(one_node, c, 2)

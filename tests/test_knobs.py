"""The knob registry: one declaration per knob, read by everything else.

Signatures are checked against ones the code computed before the registry existed
(tests/data/signatures_v1.json, written at commit 752b1c3), and against registries with a knob
added or removed, built the way the real one is.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from optico.knobs import BY_NAME, KNOBS, NAMES, Knob, canonical_name, knob_table, markdown_table, owned_flags
from optico.perfmodel.model import predict
from optico.rules import violations
from optico.search_space import DEFAULT_TUNABLES, SearchSpace
from optico.strategy import FIELDS, Strategy, strategy_class
from optico.workload import PRESETS, Cluster, Workload

REPO = Path(__file__).resolve().parents[1]
V1 = json.loads((REPO / "tests" / "data" / "signatures_v1.json").read_text())["cases"]
DENSE = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=256,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
MOE = Workload(model=PRESETS["mixtral-8x7b"], seq_length=4096, global_batch_size=256,
               cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))


def test_strategy_fields_are_the_registry():
    assert FIELDS == NAMES
    for k in KNOBS:
        assert Strategy.model_fields[k.name].default == k.default
        assert canonical_name(k.paper) == k.name and all(canonical_name(a) == k.name for a in k.aliases)


def test_signatures_of_version_1_are_unchanged():
    for case in V1:
        assert Strategy.model_validate(case["strategy"]).signature() == case["signature"], case["strategy"]


def test_adding_a_knob_with_a_default_changes_no_signature():
    extra = Knob("moe_permute_fusion", "MOE_PERMUTE_FUSION", bool, False, "Fused token permutation.",
                 flags=("--moe-permute-fusion",), render="switch", since=2)
    Extended = strategy_class((*KNOBS, extra), {})
    for case in V1:
        assert Extended.model_validate(case["strategy"]).signature() == case["signature"]
    assert Extended(moe_permute_fusion=True).signature() != Extended().signature()


def test_removing_a_knob_keeps_signatures_and_old_rows_read():
    kept = tuple(k for k in KNOBS if k.name != "tp_comm_overlap")
    Reduced = strategy_class(kept, {"tp_comm_overlap": (False, 1)})
    for case in V1:
        if not case["strategy"].get("tp_comm_overlap"):
            assert Reduced.model_validate(case["strategy"]).signature() == case["signature"]
    stored = Strategy(tensor_model_parallel_size=2, sequence_parallel=True).model_dump(mode="json")
    assert Reduced.model_validate(stored).tp == 2  # a row naming the removed knob still reads
    with pytest.raises(ValueError):
        Reduced.model_validate({"tp_comm_overlapp": True})  # a typo is still an error


def test_equivalent_configurations_are_written_one_way():
    assert Strategy(virtual_pipeline_model_parallel_size=1) == Strategy()
    assert Strategy(recompute_granularity="selective", recompute_method="block") == \
        Strategy(recompute_granularity="selective")
    assert Strategy(tensor_model_parallel_size=2, expert_tensor_parallel_size=2).signature() == \
        Strategy(tensor_model_parallel_size=2).signature()


def _probe(k: Knob) -> tuple[Workload, Strategy, Strategy]:
    context, value = k.probe
    w = MOE if k.moe_only else DENSE
    base = Strategy.model_validate(context)
    return w, base, base.changed(**{k.name: value})


@pytest.mark.parametrize("k", [k for k in KNOBS if k.probe], ids=lambda k: k.name)
def test_every_knob_renders_and_moves_its_terms_in_the_model(k: Knob):
    w, base, active = _probe(k)
    assert not violations(w, base) and not violations(w, active), violations(w, active)
    # rendering: the knob's own flag appears (or disappears, for a negated one) when it moves
    if k.flags and k.render != "none":
        assert set(active.megatron_args()) != set(base.megatron_args())
        assert any(flag in active.megatron_args() or flag in base.megatron_args() for flag in k.flags)
    # the performance model: every term the registry names moves
    a, b = predict(w, base), predict(w, active)
    for term in k.terms:
        where = a.time if hasattr(a.time, term) else a.memory
        other = b.time if hasattr(b.time, term) else b.memory
        assert getattr(where, term) != pytest.approx(getattr(other, term), rel=1e-6), (k.name, term)


def test_only_the_split_knobs_lack_a_probe():
    assert {k.name for k in KNOBS if not k.probe and k.terms} == {
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"}


def test_embedding_and_loss_in_the_split_move_layers():
    """31 layers on PP 2: counting the embedding puts 15 on the first stage and 16 on the last, the
    mirror of first 16 / last 15; the first stage holds more micro-batches, so memory moves."""
    from optico.parallel import ParallelDims

    w = Workload(model=PRESETS["llama3-8b"].model_copy(update={"num_layers": 31}), seq_length=4096,
                 global_batch_size=256, cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    counted = Strategy(pipeline_model_parallel_size=2, account_for_embedding_in_pipeline_split=True)
    uneven = Strategy(pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=16)
    assert not violations(w, counted) and not violations(w, uneven)
    assert ParallelDims.of(counted, 16).stage_layers(31) == [15, 16]
    assert ParallelDims.of(uneven, 16).stage_layers(31) == [16, 15]
    assert predict(w, counted).memory.stage_totals_gib != predict(w, uneven).memory.stage_totals_gib


def test_an_uneven_layer_count_names_the_split_flags_that_would_fix_it():
    """BLOOM's 70 layers on PP 12: counting the embedding and the loss (72) is the published fix;
    the error said only 'uneven first/last stages'. DeepSeek-V3's 61 on PP 16 has no such fix."""
    def messages(layers: int, pp: int, **flags: bool) -> str:
        w = Workload(model=PRESETS["llama3-8b"].model_copy(update={"num_layers": layers}), seq_length=4096,
                     global_batch_size=pp * 8, cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=pp))
        return " ".join(v.message for v in violations(w, Strategy(pipeline_model_parallel_size=pp, **flags)))

    assert ("account_for_embedding_in_pipeline_split: true, account_for_loss_in_pipeline_split: true "
            "(72 layers counted)") in messages(70, 12)
    assert "account_for_loss_in_pipeline_split: true (32 layers counted)" in messages(
        30, 4, account_for_embedding_in_pipeline_split=True)
    assert "num_layers with the embedding counted (31)" in messages(30, 4, account_for_embedding_in_pipeline_split=True)
    only_uneven = messages(61, 16)
    assert "uneven first/last stages can take the remainder" in only_uneven and "account_for" not in only_uneven


def test_couplings_are_repaired_from_the_registry():
    from optico.repair import repair

    space = SearchSpace.build(DENSE, list(DEFAULT_TUNABLES))
    s = Strategy(tensor_model_parallel_size=2, sequence_parallel=True, tp_comm_overlap=True,
                 use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)
    fixed = repair(s.changed(tensor_model_parallel_size=1, use_distributed_optimizer=False), space, DENSE)
    assert not fixed.sequence_parallel and not fixed.tp_comm_overlap and not fixed.overlap_param_gather
    assert not violations(DENSE, fixed)
    # A PP that stops dividing the layers gets the uneven split Megatron needs.
    odd = Workload(model=PRESETS["llama3-8b"].model_copy(update={"num_layers": 30}), seq_length=4096,
                   global_batch_size=256, cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    uneven = repair(Strategy(pipeline_model_parallel_size=4), SearchSpace.build(
        odd, ["pp", "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"]), odd)
    assert uneven.decoder_first_pipeline_num_layers and not violations(odd, uneven)


def test_user_commands_lose_every_flag_a_knob_owns():
    from optico.launchers.megatron_lm import BOOL_FLAGS, VALUE_FLAGS

    value, switch = owned_flags()
    assert value <= set(VALUE_FLAGS) and switch <= set(BOOL_FLAGS)
    assert "--expert-tensor-parallel-size" in VALUE_FLAGS and "--overlap-moe-expert-parallel-comm" in BOOL_FLAGS


def test_prompt_table_and_docs_come_from_the_registry():
    table = knob_table()
    assert all(f"- {k.paper} ({k.name}," in table for k in KNOBS)
    assert "ETP·EP > 1" in table and "MoE models only" in table
    assert knob_table(["tp", "AC"]).count("\n") == 1
    spec = (REPO / "docs" / "spec.md").read_text()
    found = re.search(r"<!-- knob table: python -m optico.knobs -->\n(.*?)\n<!-- end knob table -->", spec, re.S)
    assert found, "docs/spec.md lacks the generated knob table"
    assert found.group(1).strip() == markdown_table().strip(), "regenerate it: python -m optico.knobs"


def test_default_domains_are_valid_values():
    for name in DEFAULT_TUNABLES:
        for w in (DENSE, MOE):
            for value in BY_NAME[name].domain(w):
                Strategy.model_validate({name: value})


def test_a_knob_needs_only_its_declaration():
    """What a new knob needs besides its entry: nothing in Strategy, rules, search space, repairs,
    flag rendering or the prompt table (they read the registry). Shown with a copy of an entry."""
    clone = replace(BY_NAME["cross_entropy_loss_fusion"], name="cross_entropy_loss_fusion_copy", since=2,
                    flags=("--cross-entropy-loss-fusion-copy",))
    Extended = strategy_class((*KNOBS, clone), {})
    s = Extended(cross_entropy_loss_fusion_copy=True)
    assert "--cross-entropy-loss-fusion-copy" in [a for k in (*KNOBS, clone) for a in k.args(s)]


def test_short_tells_apart_configurations_that_differ_in_any_knob():
    # The bench's trial logs and the CLI's tables name configurations by `short()`: two MoE layouts that
    # differed only in the token dispatcher used to read alike.
    space = SearchSpace.build(MOE, ["ep", "moe_token_dispatcher_type", "moe_grouped_gemm", "overlap_p2p_comm",
                                    "batch_p2p_comm", "pp"], {"use_distributed_optimizer": True})
    candidates = list(space.enumerate(MOE))
    assert len({s.signature() for s in candidates}) > 8
    assert len({s.short() for s in candidates}) == len({s.signature() for s in candidates})

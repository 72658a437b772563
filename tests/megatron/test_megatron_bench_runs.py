"""The megatron-core benchmark driver, run for real through torchrun on CPU (gloo).

Every test starts 1-4 processes training tiny-gpt / tiny-moe for 1 warm-up + up to 3 timed
steps and checks the OPTICO_RESULT line (or the OPTICO_ERROR line for failing configs).
"""

from __future__ import annotations

import importlib.util
import math

import pytest

HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "megatron.core"))

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(not HAVE_STACK, reason="torch and megatron-core are needed"),
]

GBS, SEQ = 4, 64


def ok(run, nproc: int, gbs: int = GBS) -> dict:
    """Asserts a successful run and the invariants every result satisfies; returns it."""
    assert run.returncode == 0, run.describe()
    assert not run.errors, run.describe()
    r = run.result
    assert r is not None and r["ok"] is True, run.describe()
    assert r["device"] == "cpu" and r["world_size"] == nproc
    assert r["step_time_s"] > 0 and r["steps"] >= 2 and len(r["step_times_s"]) == r["steps"]
    assert all(t > 0 for t in r["step_times_s"])
    # tokens/s/GPU is the global batch's tokens over the step time, per process
    assert r["tokens_per_s_per_gpu"] == pytest.approx(gbs * SEQ / r["step_time_s"] / nproc, rel=1e-9)
    assert r["tflops_per_gpu"] > 0
    assert r["mfu"] is None and r["peak_tflops"] is None  # no GPU peak applies on CPU
    assert r["mem_max_allocated_gib"] is None and r["mem_max_reserved_gib"] is None
    assert r["host_max_rss_gib"] > 0
    assert r["gpu_util_avg"] is None and r["gpu_util_max"] is None
    assert r["loss_finite"] and math.isfinite(r["loss_first"]) and math.isfinite(r["loss_last"])
    # synthetic uniform tokens over 1024 ids: the first loss is about ln(1024)
    assert abs(r["loss_first"] - math.log(1024)) < 0.1
    assert r["loss_last"] < r["loss_first"]  # the real optimizer trains on the repeated batch
    assert r["cv"] is not None and r["cv"] >= 0 and r["stop_reason"] in ("stable", "max_steps")
    assert r["dp"] * r["tp"] * r["pp"] * r["cp"] == nproc
    assert r["num_microbatches"] * r["micro_batch_size"] * r["dp"] == gbs
    fp = r["fingerprint"]
    for key in ("python", "torch", "cuda", "nccl", "megatron_core", "transformer_engine", "gpu", "driver"):
        assert key in fp
    assert fp["megatron_core"] and fp["torch"]
    assert r["shim"], "the CPU shim must report its patches"
    assert len(run.steps) == r["warmup_steps"] + r["steps"] + r["skipped_steps"]
    return r


def test_tp1_baseline(bench):
    r = ok(bench(1, {}), 1)
    assert r["layer_spec"] == "local+sdpa"
    assert r["effective"]["use_cpu_initialization"] is True


def test_tp2_same_first_loss_as_tp1(bench):
    """Host initialisation splits one master weight over TP ranks: the TP2 model is the TP1
    model, so the first loss on the same global batch agrees to bf16 precision."""
    tp1 = ok(bench(1, {}), 1)
    tp2 = ok(bench(2, {"tp": 2}), 2)
    assert tp2["tp"] == 2 and tp2["dp"] == 1
    assert tp2["loss_first"] == pytest.approx(tp1["loss_first"], rel=1e-4, abs=1e-4)
    assert tp2["losses"] == pytest.approx(tp1["losses"], rel=2e-3)


def test_tp2_sequence_parallel_selective_recompute_ce_fusion(bench):
    r = ok(bench(2, {"tp": 2, "sp": True, "recompute": "selective", "cross_entropy_loss_fusion": True}), 2)
    assert r["strategy"]["sequence_parallel"] is True
    assert r["strategy"]["recompute_granularity"] == "selective"
    assert r["effective"]["recompute_modules"] == ["core_attn"]
    assert r["effective"]["cross_entropy_fusion_impl"] == "native"  # megatron-core's kernel, as the model prices
    tp1 = ok(bench(1, {}), 1)
    assert r["loss_first"] == pytest.approx(tp1["loss_first"], rel=1e-4, abs=1e-4)


def test_pp2_interleaved_vpp2(bench):
    r = ok(bench(2, {"pp": 2, "vpp": 2}), 2)
    assert r["pp"] == 2 and r["vpp"] == 2
    # Megatron-LM's requirement for the interleaved schedule
    assert r["effective"]["overlap_p2p_comm"] is True and r["effective"]["batch_p2p_comm"] is False
    losses = r["losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses  # no silent divergence


def test_dp2_distributed_optimizer_both_overlaps_full_uniform_recompute(bench):
    r = ok(bench(2, {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
                     "recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1}), 2)
    assert r["dp"] == 2 and r["num_microbatches"] == 2
    s = r["strategy"]
    assert s["use_distributed_optimizer"] and s["overlap_grad_reduce"] and s["overlap_param_gather"]
    assert (s["recompute_granularity"], s["recompute_method"], s["recompute_num_layers"]) == ("full", "uniform", 1)
    assert r["effective"]["grad_reduce_in_fp32"] is True
    # The same global batch over two replicas, recomputed activations: the same training.
    tp1 = ok(bench(1, {}), 1)
    assert r["losses"] == pytest.approx(tp1["losses"], rel=2e-3)
    assert r["loss_first"] == pytest.approx(tp1["loss_first"], rel=1e-4, abs=1e-4)


def test_pp2_uneven_first_last_stages_with_block_recompute(bench):
    r = ok(bench(2, {"pp": 2, "decoder_first_pipeline_num_layers": 1, "decoder_last_pipeline_num_layers": 3,
                     "recompute": "full", "recompute_method": "block", "recompute_num_layers": 1}), 2)
    s = r["strategy"]
    assert s["decoder_first_pipeline_num_layers"] == 1 and s["decoder_last_pipeline_num_layers"] == 3
    assert s["recompute_method"] == "block"
    assert r["effective"]["batch_p2p_comm"] is True  # Megatron-LM without the interleaved schedule


def test_moe_expert_parallel_2_alltoall(bench):
    r = ok(bench(2, {"ep": 2, "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True},
                 model="tiny-moe"), 2)
    assert r["ep"] == 2 and r["model"] == "tiny-moe"
    assert r["strategy"]["moe_token_dispatcher_type"] == "alltoall"
    # no TE and no grouped_gemm here: the driver says it fell back to SequentialMLP
    assert r["effective"]["moe_grouped_gemm"] is False
    assert any("SequentialMLP" in n for n in r["notes"])


def test_four_ranks_tp2_sp_ep2_moe_allgather(bench):
    r = ok(bench(4, {"tp": 2, "sp": True, "ep": 2, "moe_token_dispatcher_type": "allgather"},
                 model="tiny-moe", gbs=8), 4, gbs=8)
    assert r["tp"] == 2 and r["dp"] == 2 and r["ep"] == 2
    assert r["strategy"]["moe_token_dispatcher_type"] == "allgather"
    # Megatron-LM's default expert TP is TP; gloo cannot all-gather uneven expert shards
    assert r["etp"] == 1 and any("expert_tensor_parallel_size" in n for n in r["notes"])


def test_fp16_dp2_distributed_optimizer_overlap_param_gather(bench):
    """fp16 with dynamic loss scaling; the param-gather pre-hooks come on after the first
    successful update, as in Megatron-LM."""
    run = bench(2, {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True},
                precision="fp16")
    r = ok(run, 2)
    assert r["precision"] == "fp16" and r["skipped_steps"] == 0
    assert all(step["update_ok"] for step in run.steps)
    assert r["effective"]["grad_reduce_in_fp32"] is False


def test_gpt_style_tied_embeddings_over_pp2(bench):
    """GeLU MLP with biases, LayerNorm, embeddings tied across the first and last stage (the
    embedding-group gradient all-reduce), TP-free PP2."""
    model = {"name": "tiny-gpt3", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
             "ffn_hidden_size": 256, "vocab_size": 1024, "swiglu": False,
             "untie_embeddings_and_output_weights": False}
    r = ok(bench(2, {"pp": 2}, model=model), 2)
    assert r["effective"]["normalization"] == "LayerNorm"


# -- failures ------------------------------------------------------------------------------


def err(run, category: str) -> dict:
    assert run.returncode != 0, run.describe()
    assert run.result is None, run.describe()
    assert run.errors, run.describe()
    e = run.errors[0]
    assert e["category"] == category, run.describe()
    for key in ("message", "exception_type", "rank", "phase", "params", "traceback_tail"):
        assert key in e, run.describe()
    # one line per rank at most
    ranks = [x["rank"] for x in run.errors]
    assert len(ranks) == len(set(ranks)), run.describe()
    return e


def test_context_parallel_on_cpu_is_a_clear_invalid_config(bench):
    run = bench(2, {"cp": 2})
    e = err(run, "invalid_config")
    assert "Transformer Engine" in e["message"] and "context" in e["message"], run.describe()
    assert e["params"] == ["context_parallel_size"], run.describe()
    assert e["phase"] == "validate", run.describe()


def test_impossible_config_rejected_by_the_rules(bench):
    run = bench(2, {"tp": 2, "mbs": 3})
    e = err(run, "invalid_config")
    assert "global_batch_size (4)" in e["message"], run.describe()
    assert "micro_batch_size" in e["params"], run.describe()


def test_megatron_own_assertion_is_invalid_config(bench):
    """With optico's rules off, megatron-core's own check (3 layers over PP 2) is what fails."""
    model = {"name": "three-layers", "num_layers": 3, "hidden_size": 64, "num_attention_heads": 4,
             "num_query_groups": 2, "ffn_hidden_size": 128, "vocab_size": 1024}
    run = bench(2, {"pp": 2}, model=model, check_rules=False)
    e = err(run, "invalid_config")
    assert e["exception_type"] == "builtins.AssertionError", run.describe()
    assert "pipeline" in e["message"], run.describe()


def test_injected_oom_is_reported_by_the_rank_that_hit_it(bench):
    from optico.launchers.megatron.report import primary_error

    run = bench(2, {"use_distributed_optimizer": True}, env={"OPTICO_BENCH_FAULT": "oom@1:1"})
    assert run.returncode != 0 and run.result is None, run.describe()
    e = primary_error(run.errors)
    assert e is not None and e["category"] == "oom" and e["rank"] == 1 and e["phase"] == "train", run.describe()
    assert "OutOfMemoryError" in e["exception_type"]


def test_moe_parallel_folding_ep_beyond_dp_with_etp1(bench):
    """TP2 + EP2 on two ranks: DP·CP is 1, yet megatron-core runs it with expert TP 1 — the expert
    grid ETP·EP·PP = 2 tiles the world (MoE parallel folding). The rules accept it too."""
    r = ok(bench(2, {"tp": 2, "sp": True, "ep": 2, "etp": 1, "moe_token_dispatcher_type": "alltoall"},
                 model="tiny-moe"), 2)
    assert r["tp"] == 2 and r["dp"] == 1 and r["ep"] == 2 and r["etp"] == 1
    assert r["strategy"]["expert_tensor_parallel_size"] == 1


def test_pp2_embedding_and_loss_counted_in_the_split(bench):
    """4 layers + embedding + loss over PP 2: each stage builds 2 layers (megatron-core's split)."""
    r = ok(bench(2, {"pp": 2, "account_for_embedding_in_pipeline_split": True,
                     "account_for_loss_in_pipeline_split": True}), 2)
    assert r["strategy"]["account_for_embedding_in_pipeline_split"] is True
    assert r["strategy"]["account_for_loss_in_pipeline_split"] is True

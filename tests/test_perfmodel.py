"""The analytic performance model: FLOPs, memory and time behave as physics says, and the model
agrees with the OptiCo paper's measured table."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from optico.perfmodel.flops import flops_per_token
from optico.perfmodel.model import predict
from optico.strategy import strategy_from_mapping
from optico.workload import PRESETS, Cluster, Workload
from tests.conftest import PACKAGED_OPTICO_CSV, SHARED_DATA, optico_cmd

W = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=512, precision="bf16",
             cluster=Cluster(gpu="h100-sxm"))


def S(**kw):
    return strategy_from_mapping({"distributed_optimizer": True, **kw})


def test_flops_match_megatron_formula_by_hand():
    h, q, kv, f, v, s, layers = 4096, 4096, 1024, 14336, 128256, 8192, 32
    per_layer = 6 * (h * (q + 2 * kv) + q * h) + 6 * h * f * 3 + 6 * q * s
    expected = layers * per_layer + 6 * h * v
    assert flops_per_token(PRESETS["llama3-8b"], s) == pytest.approx(expected)


def test_moe_flops_count_topk_experts_only():
    m = PRESETS["mixtral-8x7b"]
    dense_equiv = m.model_copy(update={"num_experts": None, "ffn_hidden_size": m.ffn_hidden_size * 2})
    assert flops_per_token(m, 4096) == pytest.approx(flops_per_token(dense_equiv, 4096))


def mem(**kw) -> float:
    return predict(W, S(**kw)).mem_gib


def test_memory_moves_the_right_way():
    assert mem(tp=2, mbs=2) > mem(tp=2, mbs=1)
    assert mem(tp=2, recompute="full") < mem(tp=2, recompute="selective") < mem(tp=2)
    assert mem(tp=4) < mem(tp=2) < mem(tp=1)
    assert mem(tp=2, sp=True) < mem(tp=2)
    assert mem(tp=2, pp=2) < mem(tp=2)
    assert predict(W, strategy_from_mapping({"tp": 2})).mem_gib > mem(tp=2)  # no distributed optimizer
    # The fused loss: megatron-core's native kernel (the default) holds one more float32 copy of the
    # logits (4 B each, as measured on the H100 sweep); Transformer Engine's saves memory.
    logits = W.seq_length * W.model.padded_vocab(2) / 2 * 4 / 2**30
    assert mem(tp=2, cross_entropy_loss_fusion=True) - mem(tp=2) == pytest.approx(logits, rel=1e-6)
    te = W.model_copy(update={"cross_entropy_fusion_impl": "te"})
    assert predict(te, S(tp=2, cross_entropy_loss_fusion=True)).mem_gib < predict(te, S(tp=2)).mem_gib


def test_time_moves_the_right_way():
    def t(**kw):
        return predict(W, S(**kw)).time

    assert t(tp=8).tp_comm_s > t(tp=2).tp_comm_s > 0 == t(tp=1).tp_comm_s
    assert t(tp=2, recompute="full").step_time_s > t(tp=2).step_time_s
    assert t(tp=1, pp=4).pp_bubble_s > t(tp=1, pp=2).pp_bubble_s
    assert t(tp=1, pp=4, vpp=2).pp_bubble_s < t(tp=1, pp=4).pp_bubble_s
    assert t(tp=2, overlap_grad_reduce=True).dp_comm_s <= t(tp=2).dp_comm_s
    fp8 = Workload(**{**W.model_dump(), "precision": "fp8"})
    assert predict(fp8, S(tp=2)).step_time_s < predict(W, S(tp=2)).step_time_s


def test_bottleneck_classes():
    assert predict(W, S(tp=1, pp=1, mbs=4)).bottleneck.value == "memory-capacity"
    multi = Workload(**{**W.model_dump(), "cluster": Cluster(gpu="h100-sxm", nodes=4)})
    assert predict(multi, S(tp=8, pp=4, mbs=1)).bottleneck.value in ("communication", "pipeline-bubble")


def _evaluate(*paths) -> dict:
    args = ["perfmodel", "evaluate", "--json"]
    for p in paths:
        args += ["--data", str(p)]
    proc = subprocess.run(optico_cmd(*args), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_evaluate_on_the_optico_table_meets_the_bar():
    """At least 13 of 14 rows classified right (fit vs OOM) and MFU median APE at most 8 %."""
    report = _evaluate(PACKAGED_OPTICO_CSV)
    fig = report["files"]["optico_llama3_8b_a100.csv"]
    assert fig["rows"] == 14 and fig["skipped"] == 0
    assert fig["oom_accuracy"] * 14 >= 13
    assert fig["mfu_median_ape"] <= 0.08
    assert fig["spearman"] > 0.8
    assert set(report["overall"]) == {"rows", "skipped", "read", "read_share", "oom_accuracy", "mfu_median_ape",
                                      "mem_median_ape", "spearman"}


def test_evaluate_scores_rows_with_unknown_cells_only_where_they_agree():
    """The H100 README table gives no micro-batch (two rows no TP/PP either): every row is read; a
    figure counts only where every plausible value predicts the same (fit) or within 5 % (MFU)."""
    from optico.perfmodel.constants import load_constants
    from optico.perfmodel.evaluate import row_figures
    from optico.replay_csv import read_replay_csv
    from optico.replay_parse import variants

    report = _evaluate(SHARED_DATA / "megatron_readme_h100_scaling.csv")
    fig = report["files"]["megatron_readme_h100_scaling.csv"]
    assert fig["rows"] == 11 and fig["skipped"] == 0
    c = load_constants()
    for row in read_replay_csv(SHARED_DATA / "megatron_readme_h100_scaling.csv"):
        preds = [predict(w, s, c) for w, s in variants(row)]
        figures = row_figures(row, c)
        if figures.predicted_mfu is not None:
            assert max(p.mfu for p in preds) / min(p.mfu for p in preds) <= 1.05 + 1e-9
        if figures.fits is None:
            assert len({p.fits for p in preds}) == 2


def test_evaluate_reports_progress_once_per_row_and_shows_a_bar_only_on_a_terminal():
    """Rows with unknown cells cost a prediction per plausible value: a long evaluation shows a bar
    (stderr, on a terminal only, so --json output stays clean)."""
    from optico.perfmodel.evaluate import evaluate_tables
    from optico.replay_csv import read_replay_csv

    tables = [(p.name, read_replay_csv(p)) for p in (PACKAGED_OPTICO_CSV, SHARED_DATA / "megatron_readme_h100_scaling.csv")]
    calls = []
    evaluate_tables(tables, on_row=lambda: calls.append(1))
    assert len(calls) == sum(len(rows) for _, rows in tables) == 14 + 11
    proc = subprocess.run(optico_cmd("perfmodel", "evaluate", "--json", "--data", str(PACKAGED_OPTICO_CSV)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stderr == "" and json.loads(proc.stdout)["files"], proc.stderr


def test_evaluate_rejects_missing_file(tmp_path):
    proc = subprocess.run(optico_cmd("perfmodel", "evaluate", "--data", str(tmp_path / "no.csv")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_evaluate_takes_several_files_after_one_data_flag():
    """`--data a.csv b.csv` (what a shell glob gives) reports both files, like repeated --data."""
    h100 = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100-llama-1b.csv"
    proc = subprocess.run(optico_cmd("perfmodel", "evaluate", "--json", "--data", str(PACKAGED_OPTICO_CSV),
                                     str(h100)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)["files"]
    assert set(files) == {"optico_llama3_8b_a100.csv", "h100-llama-1b.csv"}
    assert files["h100-llama-1b.csv"]["rows"] >= 20
    # How many rows each figure rests on: an MFU error of one scored row read as one of ten.
    scored = json.loads(proc.stdout)["details"]["optico_llama3_8b_a100.csv"]["scored"]
    assert 0 < scored["mfu"] < files["optico_llama3_8b_a100.csv"]["read"] == scored["oom"]  # OOM rows: no MFU
    shown = subprocess.run(optico_cmd("perfmodel", "evaluate", "--data", str(PACKAGED_OPTICO_CSV)),
                           capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert f"optico_llama3_8b_a100.csv: figures rest on {scored['oom']} rows (fit/OOM), {scored['mfu']} (MFU)" \
        in shown.stdout


def test_gradient_buffer_dtype_follows_megatron_lm_unless_the_workload_says():
    """bf16 keeps fp32 main grads (4 B/param); fp16, or grad_reduce_in_fp32: false, keeps 2 B."""
    def grads(**kw) -> float:
        return predict(Workload(**{**W.model_dump(), **kw}), S(tp=2)).memory.grads_gib

    params_per_gpu = 8.03e9 / 2 / 1024**3  # llama3-8b at TP2, GiB per byte of gradient
    assert grads() == pytest.approx(4 * params_per_gpu, rel=0.02)
    assert grads(precision="fp16") == pytest.approx(grads() / 2)
    assert grads(grad_reduce_in_fp32=False) == pytest.approx(grads() / 2)
    assert grads(precision="fp16", grad_reduce_in_fp32=True) == pytest.approx(grads())
    # The default leaves warm-start keys of earlier pools unchanged; a stated value is another workload.
    assert "grad_reduce_in_fp32" not in W.key() and W.key() != Workload(**{**W.model_dump(),
                                                                         "grad_reduce_in_fp32": True}).key()


@pytest.mark.parametrize("pp, vpp", [(2, 1), (4, 1), (4, 2), (4, 3), (8, 4), (3, 5)])
@pytest.mark.parametrize("microbatches", [1, 3, 8, 64])
@pytest.mark.parametrize("ep_overlap", [False, True])
def test_in_flight_micro_batches_are_megatron_cores_warm_up(pp, vpp, microbatches, ep_overlap):
    """Each stage holds megatron-core's warm-up forwards plus the one in steady state (in chunks of
    1/VPP of the stage), as its own scheduler counts them; the fitted extra set to 0."""
    from types import SimpleNamespace

    from megatron.core.pipeline_parallel.schedules import get_pp_rank_microbatches

    from optico.perfmodel.constants import Constants
    from optico.perfmodel.layout import layout

    moe = Workload(**{**W.model_dump(), "model": PRESETS["mixtral-8x7b"],
                      "cluster": Cluster(gpu="h100-sxm", nodes=4), "global_batch_size": 256})
    s = strategy_from_mapping({"tp": 1, "pp": pp, "vpp": vpp, "ep": 2, "mbs": 1,
                               "overlap_moe_expert_parallel_comm": ep_overlap})
    dp = moe.world_size // pp
    moe = Workload(**{**moe.model_dump(), "global_batch_size": microbatches * dp})
    lay = layout(moe, s, Constants(pp_extra_in_flight=0.0))
    for rank in range(pp):
        group = SimpleNamespace(size=lambda: pp, rank=lambda r=rank: r)
        comm = SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
        total, _, warmup, _ = get_pp_rank_microbatches(microbatches, vpp, pp, p2p_communicator=comm,
                                                       overlap_moe_expert_parallel_comm=ep_overlap and vpp > 1)
        assert lay.in_flight[rank] == pytest.approx(min(warmup + 1, total) / vpp), rank


def test_unfused_attention_keeps_the_scores_selective_recompute_drops():
    """Korthikanti et al.: unfused core attention stores 5·a·s²·b bytes per layer (over TP)."""
    def activations(backend: str, **kw) -> float:
        return predict(Workload(**{**W.model_dump(), "attention_backend": backend}), S(tp=4, **kw)).memory.activations_gib

    from optico.perfmodel.constants import load_constants

    c = load_constants()
    held_layers = 32 + 1  # PP 1: one micro-batch of 32 layers in flight, and the layer in backward
    per_layer = 5 * 8192 * 8192 * 32 / 4  # 32 heads over TP 4
    scores = per_layer * held_layers * c.activation_scale * (1 + c.mem_fragmentation) / 1024**3
    for backend in ("unfused", "local"):
        assert activations(backend) - activations("flash") == pytest.approx(scores, rel=0.01)
    assert activations("fused") == activations("auto") == activations("flash")
    assert activations("unfused", recompute_granularity="selective") == \
        pytest.approx(activations("flash", recompute_granularity="selective"))
    assert "attention_backend" not in W.key() and \
        W.key() != Workload(**{**W.model_dump(), "attention_backend": "unfused"}).key()


def test_calibrate_recovers_a_deliberately_wrong_constant():
    """Start with activation memory halved: the fit moves it back and memory error drops."""
    from optico.perfmodel.calibrate import calibrate
    from optico.perfmodel.constants import load_constants

    wrong = load_constants().model_copy(update={"activation_scale": 0.5})
    result = calibrate([PACKAGED_OPTICO_CSV], start=wrong, fields=["activation_scale"], max_nfev=15)
    assert result.constants.activation_scale > 0.8
    assert result.after["overall"]["mem_median_ape"] < result.before["overall"]["mem_median_ape"]
    assert result.cost_after < result.cost_before


def test_calibrate_cli_writes_selectable_constants_and_reports_the_holdout(tmp_path):
    h100 = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100-llama-1b.csv"
    out = tmp_path / "new" / "folders" / "fitted.json"  # made, as every output option's are (they were not)
    proc = subprocess.run(optico_cmd("perfmodel", "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--field",
                                     "mem_overhead_gib", "--max-evals", "5", "--holdout", str(h100),
                                     "--out", str(out)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "held out: before" in proc.stdout and "held-out data:" in proc.stdout
    fitted = json.loads(out.read_text())
    assert 0 <= fitted["mem_overhead_gib"] <= 12
    proc = subprocess.run(optico_cmd("perfmodel", "evaluate", "--json", "--data", str(PACKAGED_OPTICO_CSV),
                                     "--calibration", str(out)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["overall"]["rows"] == 14


def test_calibrate_names_a_bad_field_and_a_missing_holdout(tmp_path):
    bad = subprocess.run(optico_cmd("perfmodel", "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--field",
                                    "warp_speed"), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "warp_speed" in bad.stderr
    missing = subprocess.run(optico_cmd("perfmodel", "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--holdout",
                                        str(tmp_path / "no.csv")), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--holdout: no such file" in missing.stderr


def test_evaluate_skips_a_bad_row_unless_strict(tmp_path):
    """A bad row is skipped and reported with file:line; --strict makes it an error (exit 2)."""
    rows = PACKAGED_OPTICO_CSV.read_text().splitlines()
    bad = rows[2].replace(",8,", ",banana,", 1)  # a cell no reading can place
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([rows[0], rows[1], bad.replace("ok", "exploded", 1)]) + "\n")
    proc = subprocess.run(optico_cmd("perfmodel", "evaluate", "--json", "--data", str(path)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"]["bad.csv"]["skipped"] == 1
    strict = subprocess.run(optico_cmd("perfmodel", "evaluate", "--strict", "--data", str(path)),
                            capture_output=True, text=True, timeout=300)
    assert strict.returncode == 2 and "bad.csv:3:" in strict.stderr


def test_leave_one_source_out_scores_each_file_with_constants_fitted_without_it():
    """A tiny run (two files, one constant, three evaluations): each fold's constants differ from
    a fit on everything, and the pooled figures gather every held-out file's rows."""
    from optico.perfmodel.calibrate import calibrate, leave_one_source_out
    from optico.perfmodel.constants import Constants

    h100 = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100-llama-1b.csv"
    files = [PACKAGED_OPTICO_CSV, h100]
    report = leave_one_source_out(files, max_nfev=3, fields=["mem_overhead_gib"])
    assert set(report["files"]) == {"optico_llama3_8b_a100.csv", "h100-llama-1b.csv"}
    assert report["overall"]["rows"] == sum(f["rows"] for f in report["files"].values())
    both = calibrate(files, start=Constants(), fields=["mem_overhead_gib"], max_nfev=3).constants
    held_out = {name: c["mem_overhead_gib"] for name, c in report["constants"].items()}
    assert any(abs(v - both.mem_overhead_gib) > 1e-6 for v in held_out.values())


def test_finer_experts_cost_more_at_equal_flops():
    """Token permutation moves k copies of each token: twice the experts per token at half the width
    (and twice as many, so each expert's GEMM keeps its tokens) keeps the FLOPs and GEMM shapes,
    but the layer moves twice the copies."""
    base = PRESETS["mixtral-8x7b"]
    finer = base.model_copy(update={"moe_router_topk": 2 * base.moe_router_topk,
                                    "ffn_hidden_size": base.ffn_hidden_size // 2,
                                    "num_experts": 2 * base.num_experts})
    assert flops_per_token(finer, 4096) == pytest.approx(flops_per_token(base, 4096))

    def compute(model, **kw) -> float:
        w = Workload(model=model, seq_length=4096, global_batch_size=256, precision="bf16",
                     cluster=Cluster(gpu="h100-sxm"))
        return predict(w, S(tp=1, pp=4, recompute_granularity="full", recompute_method="uniform",
                            recompute_num_layers=1, moe_grouped_gemm=True, **kw)).time.compute_s

    assert compute(finer) > compute(base) * 1.01
    assert compute(finer, ep=2, moe_token_dispatcher_type="alltoall") > \
        compute(base, ep=2, moe_token_dispatcher_type="alltoall") * 1.01


def test_an_all_to_all_over_nodes_sends_only_the_remote_share_over_the_network():
    from dataclasses import replace

    from optico.perfmodel.constants import load_constants
    from optico.perfmodel.layers import layer_costs
    from optico.perfmodel.layout import _ep_remote_share, _link_bw, layout

    assert _ep_remote_share(16, 1, 8, 16) == pytest.approx(8 / 15)  # 7 peers on the node, 8 off it
    assert _ep_remote_share(8, 2, 8, 16) == pytest.approx(4 / 7)  # EP ranks sit ETP apart: 4 a node
    assert _ep_remote_share(8, 1, 8, 64) == 0.0 and _ep_remote_share(64, 1, 72, 128) == 0.0  # one node / NVL72
    w = Workload(model=PRESETS["mixtral-8x7b"], seq_length=4096, global_batch_size=256, precision="bf16",
                 cluster=Cluster(gpu="h100-sxm", nodes=2))
    s = S(tp=1, pp=1, ep=16, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True,
          recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    c = load_constants()
    lay = layout(w, s, c)
    kind = next(iter(lay.kinds))
    split = layer_costs(w, s, lay, c, {kind})[kind].ep
    all_network = layer_costs(w, s, replace(lay, ep_bw=_link_bw(w, c, 16)), c, {kind})[kind].ep
    assert 0 < split < all_network * 0.6  # 8/15 of it over the network, the rest on NVLink alongside


def test_block_recompute_rematerializes_one_layer_at_a_time():
    """Megatron's block method checkpoints each of its first N layers on its own
    (TransformerBlock._checkpointed_forward), so the backward holds one layer's activations at a
    time: recomputing every layer as blocks costs the memory of uniform chunks of one layer, and
    each further recomputed layer saves memory. (The model once held N layers in flight.)"""
    layers = W.model.num_layers

    def memory(method: str, n: int) -> float:
        s = S(tp=4, recompute_granularity="full", recompute_method=method, recompute_num_layers=n)
        return predict(W, s).memory.activations_gib

    assert memory("block", layers) == pytest.approx(memory("uniform", 1))
    held = [memory("block", n) for n in (1, layers // 4, layers // 2, layers)]
    assert held == sorted(held, reverse=True) and held[0] > held[-1]

"""The replay CSV reader against the real published files and against small hand-made rows."""

from __future__ import annotations

import csv
import filecmp
import time
from pathlib import Path

import pytest

from optico.perfmodel.flops import flops_per_iteration
from optico.replay_cells import CellError, parse_number
from optico.replay_csv import MAX_CELL_CHARS, MAX_TEXT_CELL_CHARS, read_replay_csv, read_replay_file
from optico.replay_format import COLUMNS, ReplayDefaults, ReplayError, ReplayRow
from optico.replay_measured import IMPOSSIBLE, matches, measured_mfu
from optico.replay_parse import parse_precision, variants
from optico.errors import SpecError
from optico.spec import load_spec
from optico.strategy import strategy_from_mapping
from optico.workload import PRESETS, Cluster, ModelArch, Workload

REPO = Path(__file__).resolve().parents[1]
# The published tables, shipped in the repository (a copy of the shared data set).
SHARED = REPO / "benchmarks" / "data" / "published"
PACKAGED = REPO / "optico" / "data" / "optico_llama3_8b_a100.csv"
SHARED_FILES = sorted(p.name for p in SHARED.glob("*.csv"))


def shared(name: str) -> list[ReplayRow]:
    return read_replay_csv(SHARED / name)


# -- the real files ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SHARED_FILES)
def test_every_shared_file_parses(name: str) -> None:
    rows = shared(name)
    assert rows, name
    for row in rows:
        assert row.file == name and row.line >= 2
        if row.read:
            assert row.workload is not None and row.strategy is not None
            assert row.usable == (not row.unknown)
            assert variants(row), row.where  # an assignment of its unknown cells megatron accepts
        else:
            assert row.skip_reason and not row.usable


def test_packaged_copy_is_the_published_file() -> None:
    assert filecmp.cmp(PACKAGED, SHARED / PACKAGED.name, shallow=False)


def test_optico_table() -> None:
    rows = read_replay_csv(PACKAGED)
    assert len(rows) == 14
    assert sum(r.result == "oom" for r in rows) == 3
    assert all(r.usable for r in rows), [r.skip_reason for r in rows if r.skip_reason]
    best = [r for r in rows if r.strategy.short() == "TP1 PP2 MBS1 AC=none DO"
            and r.workload.global_batch_size == 512]
    assert len(best) == 1 and best[0].line == 3
    row = best[0]
    assert row.mfu == 0.68 and measured_mfu(row) == pytest.approx(0.68)
    assert row.tflops_per_gpu == 210.86 and row.mem_max_gib == 75.48 and not row.counts_recompute
    w = row.workload
    assert w.model.name == "llama3-8b" and w.model.kv_channels is None and w.model.swiglu
    assert w.precision == "fp16" and w.seq_length == 8192 and w.world_size == 8
    assert w.cluster.gpu == "a100-80gb" and w.cluster.gpus_per_node == 8 and w.cluster.nodes == 1
    # Empty cells: distributed optimizer on, no SP, no recompute.
    s = row.strategy
    assert s.use_distributed_optimizer and not s.sequence_parallel and s.recompute == "none"


@pytest.mark.parametrize("name", ["nemo_long_context_cp.csv", "megatron_readme_h100_scaling.csv"])
def test_rows_without_mbs_are_read_with_mbs_unknown(name: str) -> None:
    rows = shared(name)
    read = [r for r in rows if r.read]
    assert len(read) >= 0.9 * len(rows) and all(not r.usable and r.unknown["mbs"] == [1, 2, 4] for r in read)
    # A row no value of its unknown cells can make valid says so (1M tokens without CP on 1024 GPUs).
    assert all("no value of the unknown cell(s)" in r.skip_reason for r in rows if not r.read)
    assert {s.mbs for w, s in variants(read[0])} >= {1, 2}


def test_step_time_mfu_agrees_with_reported_model_tflops() -> None:
    """Where a source gives both a step time and model TFLOP/s, our FLOPs formula must agree."""
    checked = 0
    for name, presets, tolerance in [("megatron_bridge_perf_summary.csv", {"llama3-70b", "qwen3-30b-a3b"}, 0.03),
                                     ("nemo_2407_perf_summary_h100.csv", {"gpt3-175b"}, 0.03)]:
        for row in shared(name):
            if not (row.usable and row.workload.model.name in presets and row.step_time_s and row.tflops_per_gpu):
                continue
            reported = row.tflops_per_gpu / row.workload.peak_tflops
            assert measured_mfu(row) == pytest.approx(reported, rel=tolerance), row.where
            checked += 1
    assert checked >= 20


def test_hardware_flops_sources() -> None:
    sc21 = shared("megatron_sc21_table1_a100.csv")
    assert all(r.counts_recompute and r.strategy.recompute == "full" for r in sc21)
    # No step time there: the reported figure is Eq. 3 of the paper (recompute pass and the whole
    # attention score matrix counted, 96·B·s·l·h²·(1 + s/6h + V/16lh)); ours is model FLOPs.
    for r in sc21:
        m, seq = r.workload.model, r.workload.seq_length
        l, h, v = m.num_layers, m.hidden_size, m.padded_vocab(r.strategy.tp)
        eq3 = 96 * seq * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h))
        ours = flops_per_iteration(r.workload, r.strategy.tp) / r.workload.global_batch_size
        assert measured_mfu(r) == pytest.approx(r.mfu * ours / eq3, rel=1e-9), r.where
        assert 0.71 < ours / eq3 < 0.75
    dlperf = shared("dlperf_megatron_v100.csv")
    assert all(r.counts_recompute for r in dlperf)
    # With a step time the MFU is ours, about 3/4 of DLPerf's hardware-FLOP percentage.
    for row in dlperf:
        assert measured_mfu(row) == pytest.approx(row.tflops_per_gpu / 125.0 * 3 / 4, rel=0.08), row.where
    for name in ("korthikanti2022_table5_a100.csv", "nemo_2407_perf_summary_h100.csv",
                 "megatron_bridge_perf_summary.csv", "optico_llama3_8b_a100.csv"):
        assert not any(r.counts_recompute for r in shared(name)), name


def test_skip_reasons_in_vendor_files() -> None:
    bridge = shared("megatron_bridge_perf_summary.csv")
    reasons = [r.skip_reason or "" for r in bridge]
    assert any("NVFP4" in x and "not modelled" in x for x in reasons)
    assert any("LoRA" in x for x in reasons)
    assert all("LoRA" in (r.skip_reason or "") for r in bridge if "[LoRA]" in r.model_name)
    # MLA rows read through the preset: DeepSeek-V3's ranks, dense first layers, MTP.
    deepseek = [r for r in bridge if r.model_name == "DeepSeekV3"]
    assert deepseek and all(r.read for r in deepseek)
    assert all(r.workload.model.multi_latent_attention and r.workload.model.mtp_num_layers == 1 for r in deepseek)
    # 61 layers on PP 8 or 16: the reader infers the uneven split Megatron needs, or says it approximates.
    odd = [r for r in deepseek if r.strategy.pp > 1 and 61 % r.strategy.pp]
    assert odd and all(r.strategy.decoder_first_pipeline_num_layers or
                       any("approximated" in x for x in r.inferred) for r in odd)
    # An approximated split is as even as a hand-written layout: 61 on PP 8 (VPP 2) is 7 or 8 a stage.
    from optico.parallel import ParallelDims

    approximated = [r for r in odd if any("approximated" in x for x in r.inferred)]
    assert approximated and all(
        sorted(set(ParallelDims.of(r.strategy, r.workload.world_size).stage_layers(61))) == [61 // r.strategy.pp,
                                                                                           61 // r.strategy.pp + 1]
        for r in approximated)
    # MXFP8, FP8-CS, FP8-MX rows are fp8 workloads.
    fp8 = [r for r in bridge if r.usable and any(f"Precision={p} " in r.notes for p in ("MXFP8", "FP8-CS", "FP8-MX"))]
    assert fp8 and all(r.workload.precision == "fp8" for r in fp8)
    gb = [r for r in bridge if r.workload and r.workload.cluster.gpu in ("gb200", "gb300")]
    # One rack is all 72 GPUs' NVLink; a job over several uses 64 of each (power-of-two groups stay on NVLink).
    assert gb and all(r.workload.cluster.gpus_per_node == (72 if r.workload.world_size <= 72 else 64) for r in gb)
    # MoE recipe rows fold experts (ETP 1): EP may exceed DP·CP.
    folded = [r for r in bridge if r.read and r.strategy.ep > r.strategy.dp(r.workload.world_size) * r.strategy.cp]
    assert folded and all(r.strategy.etp == 1 for r in folded)


def test_most_published_rows_are_read() -> None:
    """Across the published tables (1099 rows) at least 80 % are read; the rest say why."""
    reports = [read_replay_file(SHARED / name)[1] for name in SHARED_FILES]
    rows, read = sum(r.rows for r in reports), sum(r.read for r in reports)
    assert rows >= 1000 and read / rows >= 0.80, (read, rows)
    dgxc = next(r for r in reports if r.file.startswith("dgxc"))
    assert dgxc.read >= 110  # Grok-1, Llama 4 Maverick, Nemotron-H from presets by name


# -- hand-made rows ------------------------------------------------------------------------------

LLAMA3_8B = dict(model="Llama3-8B", num_layers="32", hidden_size="4096", num_attention_heads="32",
                 num_query_groups="8", ffn_hidden_size="14336", vocab_size="128256", seq_length="8192",
                 gpu="H100", num_gpus="8", tp="2", pp="1", mbs="1", gbs="128", result="ok", step_time_s="10")


def write_csv(path: Path, *rows: dict[str, str], columns: tuple[str, ...] = COLUMNS) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in columns})
    return path


def one(tmp_path: Path, defaults: ReplayDefaults | None = None, **cells: str) -> ReplayRow:
    rows = read_replay_csv(write_csv(tmp_path / "t.csv", {**LLAMA3_8B, **cells}), defaults)
    assert len(rows) == 1
    return rows[0]


def test_missing_columns_read_as_empty_and_are_reported(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "short.csv", LLAMA3_8B, columns=tuple(c for c in COLUMNS if c != "mbs"))
    rows, report = read_replay_file(path)
    assert rows[0].read and rows[0].unknown["mbs"] and "mbs" in report.missing_columns
    assert "columns absent (read as empty): " in report.text() and "mbs" in report.text()


def test_a_file_that_is_no_replay_table(tmp_path: Path) -> None:
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ReplayError, match=r"other\.csv: not a replay table"):
        read_replay_csv(path)


def test_extra_columns_are_fine(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "extra.csv", {**LLAMA3_8B, "mem_avg_gib": "3"}, columns=COLUMNS + ("mem_avg_gib",))
    assert read_replay_csv(path)[0].usable


def test_bad_row_is_skipped_with_its_line_unless_strict(tmp_path: Path) -> None:
    assert one(tmp_path, result="crashed").result == "error"  # a synonym
    row = one(tmp_path, result="banana")
    assert not row.read and "result 'banana' is not ok, oom or error" in row.skip_reason
    path = write_csv(tmp_path / "bad.csv", LLAMA3_8B, {**LLAMA3_8B, "tp": "3"})
    rows, report = read_replay_file(path)
    assert [r.read for r in rows] == [True, False] and report.skipped_rows[0].startswith("bad.csv:3: ")
    with pytest.raises(ReplayError, match=r"bad\.csv:3: rejected by optico.rules: num_attention_heads"):
        read_replay_csv(path, strict=True)


def test_empty_cells_take_the_defaults(tmp_path: Path) -> None:
    row = one(tmp_path)
    s, w = row.strategy, row.workload
    assert w.precision == "bf16" and s.recompute == "none" and not s.sequence_parallel
    assert s.use_distributed_optimizer and s.cp == 1 and s.ep == 1 and s.virtual_pipeline_model_parallel_size is None
    assert w.model.name == "llama3-8b"  # dims match the preset
    custom = one(tmp_path, ReplayDefaults(distributed_optimizer=False, precision="fp16"))
    assert not custom.strategy.use_distributed_optimizer and custom.workload.precision == "fp16"
    dense = one(tmp_path, model="GPT 1B", num_query_groups="", ffn_hidden_size="", num_layers="16",
                vocab_size="50257")
    assert dense.workload.model.ffn_hidden_size == 4 * 4096 and dense.workload.model.groups == 32


@pytest.mark.parametrize("text, expected", [
    ("fp16/mixed", "fp16"), ("BF16", "bf16"), ("MXFP8", "fp8"), ("FP8-CS", "fp8"), ("FP8-DS", "fp8"),
    ("fp8 (hybrid, recipe=tensorwise) over bf16", "fp8"), ("", "bf16"), ("NVFP4", None), ("fp32", None),
])
def test_precision(text: str, expected: str | None) -> None:
    assert parse_precision(text, "bf16") == expected


def test_unmodelled_precision_is_skipped(tmp_path: Path) -> None:
    row = one(tmp_path, precision="NVFP4")
    assert not row.usable and "NVFP4" in row.skip_reason and row.workload is None


def test_recompute_and_booleans(tmp_path: Path) -> None:
    full = one(tmp_path, recompute="full").strategy
    assert (full.recompute_granularity, full.recompute_method, full.recompute_num_layers) == ("full", "uniform", 1)
    block = one(tmp_path, recompute="full (method=block, num_layers=2)").strategy
    assert (block.recompute_method, block.recompute_num_layers) == ("block", 2)
    sel = one(tmp_path, recompute="selective (modules=[core_attn])").strategy
    assert sel.recompute_granularity == "selective" and sel.recompute_method is None
    flags = one(tmp_path, sequence_parallel="true", distributed_optimizer="false").strategy
    assert flags.sequence_parallel and not flags.use_distributed_optimizer
    # Megatron-LM turns SP off at TP 1.
    assert not one(tmp_path, tp="1", sequence_parallel="true").strategy.sequence_parallel
    assert "sequence_parallel" in one(tmp_path, sequence_parallel="maybe").skip_reason


def test_recipe_rows_reduce_gradients_in_bf16(tmp_path: Path) -> None:
    """NeMo / Megatron-Bridge / DGX Cloud performance scripts set grad_reduce_in_fp32 = False."""
    recipe = one(tmp_path, source="NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md")
    assert recipe.workload.grad_reduce_in_fp32 is False and not recipe.workload.grads_in_fp32
    plain = one(tmp_path, source="Megatron-LM run")
    assert plain.workload.grad_reduce_in_fp32 is None and plain.workload.grads_in_fp32
    assert not one(tmp_path, source="Megatron-LM run", precision="fp16").workload.grads_in_fp32
    off = one(tmp_path, ReplayDefaults(recipe_flags=False), source="NVIDIA/dgxc-benchmarking llama3.1")
    assert off.workload.grad_reduce_in_fp32 is None


def test_vpp(tmp_path: Path) -> None:
    assert one(tmp_path, pp="2", vpp="1").strategy.virtual_pipeline_model_parallel_size is None
    assert one(tmp_path, pp="2", vpp="4", gbs="256").strategy.vpp == 4
    # --num-layers-per-virtual-pipeline-stage states layers per chunk, not chunks: 32 / (2·4) = 4.
    old_flag = one(tmp_path, pp="2", vpp="", gbs="256", notes="args: num-layers-per-virtual-pipeline-stage=4")
    assert old_flag.strategy.vpp == 4, old_flag.skip_reason
    assert one(tmp_path, pp="2", vpp="", gbs="256",
               notes="args: num-virtual-stages-per-pipeline-rank=2").strategy.vpp == 2


def test_attention_backend_from_args(tmp_path: Path) -> None:
    def backend(notes: str) -> str:
        return one(tmp_path, model="gpt/x", vocab_size="50257", notes=notes).workload.attention_backend

    assert backend("") == "auto" and backend("args: attention-backend=flash") == "flash"
    assert backend("args: attention-backend=unfused") == "unfused"
    assert backend("args: transformer-impl=local, attention-backend=flash") == "local"
    assert backend("args: attention-backend=<script>") == "auto"


def test_fused_loss_kernel_from_args(tmp_path: Path) -> None:
    def impl(notes: str) -> str:
        return one(tmp_path, model="gpt/x", vocab_size="50257", notes=notes).workload.cross_entropy_fusion_impl

    assert impl("") == "native"  # megatron-core's default, what our GPU sweeps ran
    assert impl("args: cross-entropy-fusion-impl=te") == "te"
    assert impl("args: cross-entropy-fusion-impl=<script>") == "native"


@pytest.mark.parametrize("cells, swiglu", [
    (dict(model="Some-7B", ffn_hidden_size="11008", vocab_size="32001"), True),       # default: gated
    (dict(model="Some-7B", ffn_hidden_size="16384", vocab_size="32001"), False),      # 4h
    (dict(model="GPT3-7B-ish", ffn_hidden_size="11008", vocab_size="32001"), False),  # GPT-3 name
    (dict(model="Nemotron-x", ffn_hidden_size="11008", vocab_size="32001"), False),
    (dict(model="GPT OSS 120B", ffn_hidden_size="11008", vocab_size="32001"), True),  # GPT-OSS is gated
    (dict(model="gpt/gpt3_tp1_pp4_swiglu", ffn_hidden_size="16384", vocab_size="32001"), True),
    # Llama-3.2-1B: FFN 8192 = 4 x 2048, and gated (read as GeLU before, as the 8K H100 sweep showed)
    (dict(model="llama3.2-1b", hidden_size="2048", ffn_hidden_size="8192", vocab_size="128256"), True),
    (dict(model="Some-7B", ffn_hidden_size="16384", vocab_size="32001",
          notes="args: untie-embeddings-and-output-weights=True, swiglu=True"), True),  # the run's arguments
    (dict(model="llama-like", ffn_hidden_size="11008", vocab_size="32001",
          notes="args: untie-embeddings-and-output-weights=True, swiglu=False"), False),
])
def test_swiglu_rule(tmp_path: Path, cells: dict[str, str], swiglu: bool) -> None:
    row = one(tmp_path, **cells)
    assert row.workload.model.swiglu is swiglu and row.workload.model.name == cells["model"]


def test_presets_and_moe(tmp_path: Path) -> None:
    qwen = one(tmp_path, model="Qwen3_30B_a3B", num_layers="48", hidden_size="2048", num_attention_heads="32",
               num_query_groups="4", ffn_hidden_size="768", vocab_size="151936", num_experts="128", topk="8",
               tp="1", ep="8", gbs="512", seq_length="4096")
    assert qwen.usable, qwen.skip_reason
    m = qwen.workload.model
    assert m.name == "qwen3-30b-a3b" and m.kv_channels == 128 and m.expert_ffn == 768
    assert "topk" in one(tmp_path, num_experts="8").skip_reason


def test_args_in_notes(tmp_path: Path) -> None:
    row = one(tmp_path, model="gpt/x", num_layers="6", pp="4", gbs="32", vocab_size="50257",
              notes="args: untie-embeddings-and-output-weights=True, overlap-grad-reduce=True, "
                    "decoder-first-pipeline-num-layers=1, decoder-last-pipeline-num-layers=1, kv-channels=64")
    assert row.usable, row.skip_reason
    assert row.workload.model.untie_embeddings_and_output_weights and row.workload.model.kv_channels == 64
    s = row.strategy
    assert s.overlap_grad_reduce and (s.decoder_first_pipeline_num_layers, s.decoder_last_pipeline_num_layers) == (1, 1)
    tied = one(tmp_path, model="gpt/x", vocab_size="50257", notes="args: transformer-impl=local")
    assert not tied.workload.model.untie_embeddings_and_output_weights


def test_knob_flags_named_in_notes_and_what_megatron_requires_of_them(tmp_path: Path) -> None:
    """A table's note naming the flags its runs passed states them; Megatron-LM refuses TP communication
    overlap without sequence parallelism, so such a run had SP even where the SP cell is empty. A cell
    that says otherwise wins (the row is then refused), a negated flag states nothing, and at TP 1 the
    note's TP overlap does not apply (no TP traffic)."""
    note = "comm overlap flags --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap; mfu as reported"
    s = one(tmp_path, tp="4", num_gpus="8", notes=note).strategy
    assert s.sequence_parallel and s.tp_comm_overlap and s.overlap_grad_reduce and s.overlap_param_gather
    assert not one(tmp_path, tp="4", num_gpus="8").strategy.sequence_parallel  # Megatron-LM's default
    refused = one(tmp_path, tp="4", num_gpus="8", sequence_parallel="false", notes=note)
    assert not refused.usable and "sequence parallelism" in refused.skip_reason
    tp1 = one(tmp_path, tp="1", notes=note)
    assert tp1.usable and not tp1.strategy.tp_comm_overlap and tp1.strategy.overlap_grad_reduce
    plain = one(tmp_path, tp="4", num_gpus="8", notes="ran without --tp-comm-overlap; see --help").strategy
    assert not plain.tp_comm_overlap and not plain.sequence_parallel
    overridden = one(tmp_path, tp="4", num_gpus="8", notes="--tp-comm-overlap; args: tp-comm-overlap=False")
    assert not overridden.strategy.tp_comm_overlap  # the run's own argument list wins


@pytest.mark.parametrize("cells, reason", [
    (dict(gpu=""), "missing required input(s): gpu"),
    (dict(num_layers="", model="Mystery-9B"), "no preset matches the model name 'Mystery-9B'"),
    (dict(gpu="TPU-v5"), "unknown GPU"),
    (dict(notes="MLA attention"), "MLA"),
    (dict(model="LLAMA3_8B [LoRA]"), "LoRA"),
    (dict(dp="8"), "layout inconsistent: dp 8"),
    (dict(tp="3"), "rejected by optico.rules: num_attention_heads (32) must be divisible by TP (3)"),
    (dict(num_gpus="4", tp="8"), "rejected by optico.rules: world size (4)"),
    (dict(distributed_optimizer="megatron-fsdp"), "Megatron-FSDP"),
])
def test_skip_reasons(tmp_path: Path, cells: dict[str, str], reason: str) -> None:
    row = one(tmp_path, **cells)
    assert not row.usable and reason in row.skip_reason


def test_cluster_shape(tmp_path: Path) -> None:
    small = one(tmp_path, num_gpus="2", tp="2").workload.cluster
    assert (small.gpus_per_node, small.nodes, small.num_gpus) == (8, 1, 2)
    big = one(tmp_path, num_gpus="64", gbs="256").workload.cluster
    assert (big.gpus_per_node, big.nodes, big.world_size) == (8, 8, 64)
    racks = one(tmp_path, gpu="GB200 (DGX-GB200)", num_gpus="128", gbs="256").workload.cluster
    assert (racks.gpu, racks.gpus_per_node, racks.nodes, racks.world_size) == ("gb200", 64, 2, 128)
    # A 64-rank expert group over two racks stays on NVLink (read as 72 per rack, it straddled two).
    assert racks.keeps_in_node(64) and racks.keeps_in_node(32)
    rack = one(tmp_path, gpu="GB200 (DGX-GB200)", num_gpus="64", gbs="256").workload.cluster
    assert (rack.gpus_per_node, rack.nodes, rack.world_size) == (72, 1, 64)


def test_measured_mfu_order(tmp_path: Path) -> None:
    row = one(tmp_path, step_time_s="10", mfu="0.9", tflops_per_gpu="1")
    w = row.workload
    assert measured_mfu(row) == pytest.approx(flops_per_iteration(w, 2) / (10 * 8 * 989e12))
    assert measured_mfu(one(tmp_path, step_time_s="", mfu="0.4", tflops_per_gpu="100")) == 0.4
    assert measured_mfu(one(tmp_path, step_time_s="", tflops_per_gpu="494.5")) == pytest.approx(0.5)
    hfu = one(tmp_path, step_time_s="", mfu="0.4", recompute="full", source="DLPerf")
    # The layers' FLOPs × 4/3, the output layer's once: a little less than 4/3 of ours in all.
    assert hfu.counts_recompute and 0.3 < measured_mfu(hfu) < 0.31
    assert measured_mfu(one(tmp_path, step_time_s="", result="oom")) is None
    assert measured_mfu(one(tmp_path, step_time_s="")) is None


@pytest.mark.parametrize("source, full", [
    ("Megatron-LM README table (Megatron-Core r0.8.0, H100)", True), ("golden values, core_r0.11.0", True),
    ("golden values, core_v0.12.0", False), ("megatron-core 0.16.1", False),
    ("docs (container NeMo 24.03.01)", True), ("NeMo 25.04.rc2", True), ("container NeMo 25.09", False),
    ("image nvcr.io/nvidia/nemo:24.07", True), ("megatron-core==0.11.0", True), ("megatron_core 0.13", False),
    ("Megatron-Bridge release 26.08", False), ("Narayanan et al. 2021 (arXiv 2104.04473)", True),
    ("Korthikanti et al. 2022", False), ("our own sweep", False)])
def test_stated_figures_of_a_full_attention_count_come_down_to_ours(tmp_path: Path, source: str, full: bool) -> None:
    """Megatron-LM before core v0.12 and NeMo before 25.09 counted the whole attention score matrix, not
    its causal half: for the same run they state a larger TFLOP/s and MFU than our count gives, by the
    attention scores' share (6·layers·q·s FLOPs a token), large at long sequences."""
    row = one(tmp_path, step_time_s="", mfu="0.5", seq_length="131072", gbs="8", source=source)
    assert row.counts_full_attention is full
    m, seq = row.workload.model, row.workload.seq_length
    ours = flops_per_iteration(row.workload, row.strategy.tp) / (row.workload.global_batch_size * seq)
    theirs = ours + 6 * m.num_layers * m.head_dim * m.num_attention_heads * seq if full else ours
    assert measured_mfu(row) == pytest.approx(0.5 * ours / theirs, rel=1e-9)
    if full:
        assert 0.5 * 0.55 < measured_mfu(row) < 0.5 * 0.65  # Llama-3 8B at 128K tokens: 0.59 of the stated


def test_matches(tmp_path: Path) -> None:
    row = one(tmp_path)
    w = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=128, precision="bf16",
                 cluster=Cluster(gpu="h100-sxm"))
    assert matches(row, w)
    assert not matches(row, w.model_copy(update={"global_batch_size": 256}))
    assert not matches(row, w.model_copy(update={"precision": "fp8"}))
    assert not matches(row, w.model_copy(update={"seq_length": 4096}))
    assert not matches(row, w.model_copy(update={"cluster": Cluster(gpu="h100-sxm", nodes=2)}))
    assert not matches(row, w.model_copy(update={"cluster": Cluster(gpu="a100-80gb")}))
    assert not matches(row, w.model_copy(update={"model": PRESETS["llama2-7b"]}))
    assert not matches(one(tmp_path, gpu="nope"), w)


# -- cells as sources write them -----------------------------------------------------------------

@pytest.mark.parametrize("cells, check", [
    (dict(distributed_optimizer="zero-1 (deepspeed)"), lambda r: r.strategy.use_distributed_optimizer),
    (dict(distributed_optimizer="true (zero1)"), lambda r: r.strategy.use_distributed_optimizer),
    (dict(distributed_optimizer="ZeRO stage 0"), lambda r: not r.strategy.use_distributed_optimizer),
    (dict(recompute="none stated"), lambda r: r.strategy.recompute == "none"),  # read like an empty cell
    (dict(recompute="Selective (core_attn)"), lambda r: r.strategy.recompute == "selective"),
    (dict(recompute="block 4"), lambda r: (r.strategy.recompute_method, r.strategy.recompute_num_layers)
     == ("block", 4)),
    (dict(gpu="A800-80GB", step_time_s="30"), lambda r: r.workload.cluster.gpu == "a800-80gb"),  # 72 % MFU
    (dict(gpu="H100-SXM-80GB"), lambda r: r.workload.cluster.gpu == "h100-sxm"),
    (dict(gpu="H800-80GB"), lambda r: r.workload.cluster.gpu == "h800-sxm"),
    (dict(sequence_parallel="yes"), lambda r: r.strategy.sequence_parallel),
    (dict(step_time_s="", mfu="45 %"), lambda r: r.mfu == pytest.approx(0.45)),
    (dict(step_time_s="", mfu="45"), lambda r: r.mfu == pytest.approx(0.45)),
    (dict(step_time_s="8500 ms"), lambda r: r.step_time_s == pytest.approx(8.5)),
    (dict(tokens_per_s_per_gpu="3.9k"), lambda r: r.tokens_per_s_per_gpu == pytest.approx(3900)),
    (dict(result="", step_time_s="10"), lambda r: r.result == "ok" and r.read),
    (dict(mbs="n/a"), lambda r: r.read and r.unknown["mbs"] == [1, 2, 4]),
    (dict(num_gpus="", dp="4"), lambda r: r.workload.world_size == 8 and not r.unknown),  # dp·TP·PP·CP
    (dict(tp="two"), lambda r: r.read and "tp" in r.unknown),  # unreadable: unknown, said so
])
def test_cells_as_sources_write_them(tmp_path: Path, cells: dict[str, str], check) -> None:
    row = one(tmp_path, **cells)
    assert row.skip_reason is None, row.skip_reason
    assert check(row), row


def test_headers_as_sources_write_them(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("Model,Layers,Hidden,Heads,KV Heads,FFN,Vocab,Seq Len,GPU Type,GPUs,TP,PP,Micro Batch Size,"
                    "Global Batch Size,Status,MFU (%),Step Time (ms)\n"
                    "Llama3-8B,32,4096,32,8,14336,128256,8192,A800-80GB,8,2,1,1,128,success,45,30000\n")
    rows, report = read_replay_file(path)
    row = rows[0]
    assert row.usable, row.skip_reason
    assert row.workload.model.name == "llama3-8b" and row.workload.cluster.gpu == "a800-80gb"
    assert row.mfu == pytest.approx(0.45) and row.step_time_s == pytest.approx(30.0)
    assert report.renamed_columns["Micro Batch Size"] == "mbs" and report.renamed_columns["MFU (%)"] == "mfu"


HEADER = ("Model,Layers,Hidden,Heads,KV Heads,FFN,Vocab,Seq Len,GPU Type,GPUs,TP,PP,Micro Batch Size,"
          "Global Batch Size,Status")


@pytest.mark.parametrize(("header", "cell", "field", "value"), [
    ("Step Time (ms)", "30000 ms", "step_time_s", 30.0),  # a unit in both header and cell: converted once
    ("Step Time (ms)", "30 s", "step_time_s", 30.0),  # the cell's own unit wins
    ("Iteration time [s]", "30", "step_time_s", 30.0),
    ("Latency (ms)", "30000", "step_time_s", 30.0),
    ("MemMax (MiB)", "61440 MiB", "mem_max_gib", 60.0),
    ("Peak memory [GiB]", "60", "mem_max_gib", 60.0),
    ("Max memory allocated (MiB)", "61440", "mem_max_gib", 60.0),
    ("MFU (%)", "0.97", "mfu", 0.0097),  # a '%' header is a percentage, also below 1.5 (small models' CI runs)
    ("MFU %", "45", "mfu", 0.45),
    ("MFU%", "0.5", "mfu", 0.005),
    ("MFU [%]", "45.3%", "mfu", 0.453),
    ("MFU", "45.3", "mfu", 0.453),  # bare: a value above 1.5 can only be a percentage
    ("MFU", "0.453", "mfu", 0.453),
    ("Throughput (TFLOP/s/GPU)", "180", "tflops_per_gpu", 180.0),
    ("Throughput (tokens/s/GPU)", "\"3,900\"", "tokens_per_s_per_gpu", 3900.0),
    ("Tokens / sec / GPU", "3.9k", "tokens_per_s_per_gpu", 3900.0),
    ("Percentage of theoretical peak FLOP/s", "41%", "mfu", 0.41),  # Megatron-LM's README table
    ("Percentage of theoretical peak FLOP/s", "41", "mfu", 0.41),
])
def test_measurements_under_the_headers_and_units_tables_use(tmp_path: Path, header: str, cell: str, field: str,
                                                             value: float) -> None:
    path = tmp_path / "u.csv"
    path.write_text(f"{HEADER},{header}\nLlama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,{cell}\n")
    rows, report = read_replay_file(path)
    assert header not in report.ignored_columns
    assert getattr(rows[0], field) == pytest.approx(value), (header, cell, rows[0].skip_reason)


@pytest.mark.parametrize(("header", "notes", "overhead_left_out"), [
    ("Max memory allocated (MiB)", "", True),  # the header says what torch counted
    ("max_memory_reserved (GiB)", "", False),
    ("Peak memory (GiB)", "torch max allocated", True),  # or, with a header that does not say, the notes
    ("Peak memory (GiB)", "", False),
])
def test_allocated_memory_is_compared_without_what_torch_does_not_see(tmp_path: Path, header: str, notes: str,
                                                                       overhead_left_out: bool) -> None:
    from optico.perfmodel.evaluate import _memory_as_measured
    from optico.perfmodel.model import predict

    path = tmp_path / "m.csv"
    path.write_text(f"{HEADER},{header},Notes\nLlama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,"
                    f"61440,{notes}\n")
    row = read_replay_file(path)[0][0]
    memory = predict(row.workload, row.strategy).memory
    assert memory.overhead_gib > 0
    expected = memory.total_gib - (memory.overhead_gib if overhead_left_out else 0.0)
    assert _memory_as_measured(row, predict(row.workload, row.strategy)) == pytest.approx(expected)


def test_spelled_out_parallel_headers_and_an_ambiguous_throughput(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("Model,Seq Len,GPU,Number of GPUs,Tensor Parallel,Pipeline Parallel,VP,MBS,GBS,Status,Throughput\n"
                    "Llama3-8B,8192,H100,16,2,2,2,1,128,ok,123\n")
    rows, report = read_replay_file(path)
    s = rows[0].strategy
    assert (s.tp, s.pp, s.vpp, rows[0].workload.world_size) == (2, 2, 2, 16), rows[0].skip_reason
    assert "Throughput" in report.ignored_columns  # tokens, TFLOP/s or samples: no unit, not guessed


def test_a_row_with_more_fields_than_the_header_is_skipped_and_lines_count_blank_ones(tmp_path: Path) -> None:
    """An unquoted '4,064' shifts every cell after it: the row is skipped, not read shifted; and a
    row's file:line counts the blank lines above it."""
    path = tmp_path / "e.csv"
    path.write_text(f"{HEADER},Tokens/s/GPU,Mem (GiB)\n\n"
                    "Llama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,4,064,55.69\n\n\n"
                    "Llama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,\"4,064\",55.69\n")
    shifted, good = read_replay_csv(path)
    assert shifted.line == 3 and not shifted.read and "18 fields against the header's 17" in shifted.skip_reason
    assert good.line == 6 and good.usable and good.tokens_per_s_per_gpu == 4064 and good.mem_max_gib == 55.69
    trailing = tmp_path / "t.csv"  # a trailing comma on a row adds an empty field: nothing shifted
    trailing.write_text(f"{HEADER},Mem (GiB)\nLlama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,55.69,\n")
    assert read_replay_csv(trailing)[0].mem_max_gib == 55.69


def test_the_spec_check_takes_the_headers_the_reader_takes(tmp_path: Path) -> None:
    """`tune`'s load-time check of a replay table reads headers as the reader does ('Model', 'TP')."""
    table = tmp_path / "t.csv"
    lines = PACKAGED.read_text().splitlines()
    table.write_text("\n".join([lines[0].replace("model,", "Model,").replace(",tp,", ",TP,"), *lines[1:]]) + "\n")
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "examples" / "llama3-8b-a100-replay.yaml").read_text()
                    .replace("../optico/data/optico_llama3_8b_a100.csv", str(table)))
    assert load_spec(spec).launcher.data == str(table)


def test_the_spec_check_counts_the_rows_the_reader_reads(tmp_path: Path) -> None:
    """Blank lines are no rows to the reader: a table padded with 20,001 of them was refused at spec load
    ("more than 20,000 rows") while `perfmodel evaluate --data` read it."""
    table = tmp_path / "t.csv"
    table.write_text(PACKAGED.read_text() + "\n" * 20_001)
    assert len(read_replay_csv(table)) == len(read_replay_csv(PACKAGED))
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "examples" / "llama3-8b-a100-replay.yaml").read_text()
                    .replace("../optico/data/optico_llama3_8b_a100.csv", str(table)))
    assert load_spec(spec).launcher.data == str(table)


@pytest.mark.parametrize("ending", ["\r\n", "\r"])
def test_the_spec_check_takes_the_line_endings_the_reader_takes(tmp_path: Path, ending: str) -> None:
    """A table saved with Windows or old-Mac line endings: `tune`'s load-time check refused "\r" alone
    ("new-line character seen in unquoted field") while `perfmodel evaluate` read the same file."""
    table = tmp_path / "t.csv"
    table.write_bytes(ending.join(PACKAGED.read_text().splitlines()).encode() + ending.encode())
    assert len(read_replay_csv(table)) == len(read_replay_csv(PACKAGED))
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "examples" / "llama3-8b-a100-replay.yaml").read_text()
                    .replace("../optico/data/optico_llama3_8b_a100.csv", str(table)))
    assert load_spec(spec).launcher.data == str(table)


def test_presets_by_name_and_notes(tmp_path: Path) -> None:
    nh = one(tmp_path, model="Nemotron-H 56b FP8", num_layers="", hidden_size="", num_attention_heads="",
             num_query_groups="", ffn_hidden_size="", vocab_size="", tp="8", num_gpus="32", gbs="96",
             precision="FP8", mbs="", notes="GA=24")
    assert nh.read and nh.workload.model.is_hybrid and "architecture from preset nemotron-h-56b" in nh.inferred
    assert nh.strategy.mbs == 1 and any("mbs = gbs / (DP·GA)" in x for x in nh.inferred)
    grok = one(tmp_path, model="Grok1 314b BF16", num_layers="", hidden_size="", num_attention_heads="",
               num_query_groups="", ffn_hidden_size="", vocab_size="", tp="4", pp="8", ep="4", num_gpus="128",
               gbs="1024", notes="ETP=4; GA=8", step_time_s="200")
    assert grok.read and grok.strategy.etp == 4 and grok.workload.model.name == "grok-1"


def test_a_gradient_accumulation_column_derives_what_is_missing_and_is_checked(tmp_path: Path) -> None:
    """GBS = MBS·DP·GA (NeMo's and Megatron-Bridge's 'GA' column): the GPUs or the micro-batch a row
    leaves out are derived from it; a GA the other cells contradict is said and not used."""
    columns = (*COLUMNS, "GA")
    gpus = read_replay_csv(write_csv(tmp_path / "g.csv", {**LLAMA3_8B, "num_gpus": "", "GA": "8"}, columns=columns))[0]
    assert gpus.usable and gpus.workload.world_size == 32  # 128 / (1·8) = 16 ranks of DP, times TP 2
    assert any("num_gpus = gbs / (MBS·GA)" in x for x in gpus.inferred)
    mbs = read_replay_csv(write_csv(tmp_path / "m.csv", {**LLAMA3_8B, "mbs": "", "GA": "16"}, columns=columns))[0]
    assert mbs.usable and mbs.strategy.mbs == 2  # 128 / (DP 4 · GA 16)
    wrong = read_replay_csv(write_csv(tmp_path / "w.csv", {**LLAMA3_8B, "GA": "3"}, columns=columns))[0]
    assert wrong.usable and wrong.strategy.mbs == 1 and wrong.workload.world_size == 8
    assert any(x.startswith("GA disagrees, not used: gbs 128 but MBS·DP·GA = 1·4·3") for x in wrong.inferred)
    agrees = read_replay_csv(write_csv(tmp_path / "a.csv", {**LLAMA3_8B, "GA": "32"}, columns=columns))[0]
    assert agrees.usable and not any("GA" in x for x in agrees.inferred)
    # Notes: the transcriber's statement, before a quoted source row whose 'GA=1 (16)' is its first run's.
    noted = one(tmp_path, mbs="", notes="GA (grad accumulation) = 16; source row: TP=1 (2) | GA=1 (16)")
    assert noted.strategy.mbs == 2 and "mbs = gbs / (DP·GA) = 2" in noted.inferred
    for header in ("Gradient Accumulation Steps", "grad_accum", "num_microbatches"):
        spelled = read_replay_file(write_csv(tmp_path / "s.csv", {**LLAMA3_8B, "num_gpus": "", header: "8"},
                                             columns=(*COLUMNS, header)))
        assert spelled[0][0].workload.world_size == 32 and header not in spelled[1].ignored_columns, header


def test_a_nemo_performance_table_as_published_reads_by_its_model_names(tmp_path: Path) -> None:
    """A table laid out as NeMo's performance summary prints it (its columns; the figures here are
    placeholders): model names, no dimensions, a GA column. Each name finds its preset (NeMo's own
    configurations), and the row reads as the transcription with dimensions in the shipped table does."""
    raw = tmp_path / "nemo.csv"
    raw.write_text("Model,#-GPUs,GBS,MBS,Sequence Length,TP,PP,CP,VP,EP,GA,Tokens / sec / GPU,GPU,Precision\n"
                   "GPT3-5B,64,2048,4,2048,1,1,1,1,1,8,23574,H100,FP8\n"
                   "GPT3-20B,64,256,2,2048,2,1,1,1,1,4,5528,H100,FP8\n"
                   "Nemotron-8B,64,256,4,4096,2,1,1,1,1,2,11753,H100,FP8\n"
                   "Nemotron-22B,64,256,2,4096,2,4,1,10,1,16,4113,H100,FP8\n")
    rows = read_replay_csv(raw)
    assert all(r.usable and not any("GA disagrees" in x for x in r.inferred) for r in rows), rows
    assert [r.workload.model.name for r in rows] == ["gpt3-5b", "gpt3-20b", "nemotron3-8b", "nemotron3-22b"]
    transcribed = {r.model_name: r.workload.model for r in shared("nemo_2407_perf_summary_h100.csv") if r.read}
    for row in rows:
        mine, theirs = row.workload.model, transcribed[row.model_name]
        assert mine.model_dump(exclude={"name"}) == theirs.model_dump(exclude={"name"}), row.model_name


def test_uneven_split_is_inferred(tmp_path: Path) -> None:
    row = one(tmp_path, model="x-30", num_layers="30", vocab_size="50257", pp="4", gbs="128", num_gpus="8",
              tp="2")
    from optico.parallel import ParallelDims

    s = row.strategy  # 30 + 2 = 32 over PP 4: the embedding and the loss counted in the split
    assert row.usable and s.account_for_embedding_in_pipeline_split and s.account_for_loss_in_pipeline_split
    assert ParallelDims.of(s, 8).stage_layers(30) == [7, 8, 8, 7]
    odd = one(tmp_path, model="x-29", num_layers="29", vocab_size="50257", pp="4", gbs="128", num_gpus="8", tp="2")
    s = odd.strategy  # 29: no counting makes it even: middle stages 8, first 6, last 7
    assert odd.usable and (s.decoder_first_pipeline_num_layers, s.decoder_last_pipeline_num_layers) == (6, 7)


def test_hostile_magnitudes_are_skipped_rows_not_a_crash_or_a_memory_blow_up(tmp_path: Path):
    # 10^9 layers used to build a per-layer list of 10^9 entries (15 GB); a 400-digit integer was an
    # OverflowError. Both are now a row skipped with its reason.
    huge = one(tmp_path, num_layers="1000000000")
    assert not huge.read and "num_layers" in huge.skip_reason
    digits = one(tmp_path, num_layers="9" * 500)
    assert not digits.read or digits.workload.model.num_layers <= 1024
    infinite = one(tmp_path, tflops_per_gpu="1e999")  # no measurement: the row is left out, not read without it
    assert not infinite.usable and infinite.skip_reason == f"{IMPOSSIBLE}: tflops_per_gpu inf is not a positive number"


def test_files_the_reader_cannot_take_are_one_replay_error(tmp_path: Path):
    big_cell = write_csv(tmp_path / "cell.csv", {**LLAMA3_8B, "notes": "x" * 200_000})
    with pytest.raises(ReplayError, match=r"cell\.csv: not a readable CSV"):
        read_replay_csv(big_cell)
    rows = write_csv(tmp_path / "rows.csv", *([LLAMA3_8B] * 20_001))
    with pytest.raises(ReplayError, match=r"rows\.csv: more than 20,000 rows"):
        read_replay_csv(rows)
    latin = tmp_path / "latin.csv"
    latin.write_bytes(",".join(COLUMNS).encode() + b"\n\xe9\n")
    with pytest.raises(ReplayError, match=r"latin\.csv is not UTF-8"):
        read_replay_csv(latin)


@pytest.mark.timeout(30)  # the bug was a hang: fail fast, not at the suite's 600 s
def test_a_file_swapped_for_a_fifo_or_a_device_is_refused_not_read(tmp_path: Path):
    # The replay launcher reads its CSV again when a job runs or resumes, after the spec was checked:
    # a FIFO hung it forever (open waits for a writer), /dev/zero ate memory until MemoryError.
    import os
    import time

    fifo, zero, gone = tmp_path / "fifo.csv", tmp_path / "zero.csv", tmp_path / "gone.csv"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    t0 = time.monotonic()
    for path in (fifo, zero):
        with pytest.raises(ReplayError, match="not a regular file"):
            read_replay_csv(path)
    with pytest.raises(ReplayError, match="no such file"):
        read_replay_csv(gone)
    assert time.monotonic() - t0 < 5


def test_string_knobs_and_untied_embeddings_from_args(tmp_path: Path) -> None:
    """Notes' 'args:' state what the columns cannot: a word-valued knob such as the recompute
    method, and untied embeddings (without the flag, Megatron-LM's default: tied)."""
    row = one(tmp_path, recompute="full", notes="args: untie-embeddings-and-output-weights=True, "
                                                "recompute-method=block, recompute-num-layers=14")
    s = row.strategy
    assert (s.recompute_granularity, s.recompute_method, s.recompute_num_layers) == ("full", "block", 14)
    assert row.workload.model.untie_embeddings_and_output_weights
    tied = one(tmp_path, recompute="full", notes="args: recompute-method=sideways")
    assert tied.strategy.recompute_method == "uniform"  # a word the knob does not take is not read
    assert not tied.workload.model.untie_embeddings_and_output_weights


def test_gpu_sweep_rows_read_back_as_the_configuration_that_ran(tmp_path: Path) -> None:
    """benchmarks/gpu_sweep.py writes each run as a replay row: read back, it must be the workload
    and strategy the driver ran (untied embeddings, block recompute of 14 layers), for ok and OOM."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_sweep

    spec = load_spec(REPO / "examples" / "llama3.2-3b-h100-1gpu.yaml")
    w = spec.workload
    s = gpu_sweep.parse_config("mbs=1,recompute=full,recompute_method=block,recompute_num_layers=14",
                               dict(spec.search_space.fixed))
    ok = {"result": {"ok": True, "mfu": 0.36, "tflops_per_gpu": 357.0, "step_time_s": 1.2,
                     "tokens_per_s_per_gpu": 27000.0, "mem_max_allocated_gib": 73.97}}
    oom = {"errors": [{"category": "oom", "message": "CUDA out of memory"}]}
    path = tmp_path / "sweep.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        for parsed in (ok, oom):
            writer.writerow(gpu_sweep.row(w, s, parsed, "python -m ..."))
    rows = read_replay_csv(path)
    assert [r.result for r in rows] == ["ok", "oom"]
    for r in rows:
        assert r.strategy.signature() == s.signature(), r.skip_reason
        # The table has no gpus_per_node column (a reader assumes 8 per node): all else is the run's.
        assert r.workload.model_dump(exclude={"cluster"}) == w.model_dump(exclude={"cluster"})
        assert (r.workload.world_size, r.workload.cluster.gpu) == (w.world_size, w.cluster.gpu)


def test_every_knob_survives_a_written_row(tmp_path: Path) -> None:
    """optico.replay_rows writes what no column states as Megatron-LM arguments; read back, every
    strategy of a MoE space with every tunable knob is the one written (the overlaps, the
    dispatcher, grouped GEMM, ETP, uneven stages, partial recompute...)."""
    from itertools import islice

    from optico.replay_rows import replay_row
    from optico.search_space import SearchSpace

    w = Workload(model=PRESETS["mixtral-8x7b"], seq_length=4096, global_batch_size=256, precision="bf16",
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8, nodes=2))
    space = SearchSpace.build(w, {**{name: None for name in ("tp", "pp", "ep", "vpp", "mbs", "sp", "recompute",
                                                             "distributed_optimizer", "overlap_grad_reduce",
                                                             "overlap_param_gather", "cross_entropy_loss_fusion",
                                                             "moe_token_dispatcher_type", "moe_grouped_gemm",
                                                             "etp", "recompute_method")},
                                  "recompute_num_layers": [1, 4], "decoder_first_pipeline_num_layers": [None, 14]})
    written = list(islice(space.enumerate(w), 0, 4000, 13))
    assert len(written) > 100
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(replay_row(w, s, result="oom", source="test", notes={}) for s in written)
    read = read_replay_csv(path)
    for row, s in zip(read, written, strict=True):
        assert row.strategy is not None, row.skip_reason
        assert row.strategy.signature() == s.signature(), (s.short(), row.strategy.short())
        assert row.workload.model_dump(exclude={"cluster"}) == w.model_dump(exclude={"cluster"})


def test_a_written_row_of_a_cut_moe_reads_back_as_the_model_that_ran(tmp_path: Path) -> None:
    """A Qwen3-30B-A3B cut to 6 layers matches no preset: the row's own arguments must carry its head
    dimension (128, not hidden / heads = 64) and its expert FFN (768, not the dense 6144), or the
    replayed workload has experts eight times too wide."""
    from optico.replay_rows import replay_row

    arch = PRESETS["qwen3-30b-a3b"].model_copy(update={"name": "qwen3-moe-6l", "num_layers": 6})
    shared = arch.model_copy(update={"name": "some-moe", "moe_shared_expert_intermediate_size": 1536})
    path = tmp_path / "rows.csv"
    workloads = [Workload(model=m, seq_length=4096, global_batch_size=8, cluster=Cluster(gpu="h200", gpus_per_node=1))
                 for m in (arch, shared)]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(replay_row(w, strategy_from_mapping({"mbs": 2}), result="oom", source="test", notes={})
                         for w in workloads)
    for row, w in zip(read_replay_csv(path), workloads, strict=True):
        assert row.workload.model.model_dump() == w.model.model_dump()


@pytest.mark.parametrize("swiglu, ffn", [(True, 16384), (False, 11008)])
def test_a_written_row_says_its_mlp(tmp_path: Path, swiglu: bool, ffn: int) -> None:
    """A gated MLP at 4 x hidden and an ungated one at another width: no width or name rule can tell
    these apart, so the row's own arguments say which it was."""
    from optico.replay_rows import replay_row

    arch = ModelArch(name="some-4k", num_layers=4, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=ffn,
                     vocab_size=32000, swiglu=swiglu)
    w = Workload(model=arch, seq_length=4096, global_batch_size=8, cluster=Cluster(gpu="h100-sxm", gpus_per_node=8))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerow(replay_row(w, strategy_from_mapping({"tp": 2}), result="oom", source="test", notes={}))
    assert read_replay_csv(path)[0].workload.model.swiglu is swiglu


@pytest.mark.parametrize("impl", ["native", "te"])
def test_a_written_row_says_its_fused_loss_kernel(tmp_path: Path, impl: str) -> None:
    """The kernel decides the fused loss's memory (native: one more float32 copy of the logits), so a
    row of a te run must not read back as megatron-core's default."""
    from optico.replay_rows import replay_row

    w = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=8, cross_entropy_fusion_impl=impl,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8))
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerow(replay_row(w, strategy_from_mapping({"tp": 2, "cross_entropy_loss_fusion": True}),
                                   result="oom", source="test", notes={}))
    row = read_replay_csv(path)[0]
    assert row.workload.cross_entropy_fusion_impl == impl and row.strategy.cross_entropy_loss_fusion


def test_the_8k_h100_sweep_reads_as_the_model_that_ran() -> None:
    """benchmarks/data/h100-llama3.2-1b-8k.csv (written before rows said their MLP): a Llama-3.2-1B
    shape, gated, tied embeddings, every one of its 15 runs read."""
    rows = read_replay_csv(REPO / "benchmarks" / "data" / "h100-llama3.2-1b-8k.csv")
    assert len(rows) == 15 and all(r.usable for r in rows)
    assert all(r.workload.model.swiglu and not r.workload.model.untie_embeddings_and_output_weights for r in rows)


def test_the_h200_sweep_reads_as_the_workload_of_its_spec() -> None:
    """benchmarks/data/h200-phi3-mini.csv: every one of its 16 runs reads back as the workload of
    examples/phi3-mini-h200-1gpu.yaml on an H200 (multi-head attention, gated, untied), and its two
    OOM rows as OOMs — so the replay landscape is the workload that ran."""
    rows = read_replay_csv(REPO / "benchmarks" / "data" / "h200-phi3-mini.csv")
    spec = load_spec(REPO / "examples" / "phi3-mini-h200-1gpu.yaml")
    assert len(rows) == 16 and all(r.usable for r in rows)
    model = spec.workload.model.model_copy(update={"name": rows[0].workload.model.name})
    assert {r.workload.model for r in rows} == {model}
    assert {r.workload.cluster.gpu for r in rows} == {"h200"}
    assert {(r.workload.seq_length, r.workload.global_batch_size) for r in rows} == {(4096, 8)}
    assert sum(r.result == "oom" for r in rows) == 2


def test_the_h200_moe_sweep_reads_as_the_workload_of_its_spec() -> None:
    """benchmarks/data/h200-qwen3-moe-6l.csv: its 10 runs read back as the cut Qwen3-MoE of
    examples/qwen3-moe-6l-h200-1gpu.yaml (head dimension 128, expert FFN 768, 128 experts, top-8), each
    with the dispatcher and cross-entropy fusion it ran with, and its two OOM rows as OOMs."""
    rows = read_replay_csv(REPO / "benchmarks" / "data" / "h200-qwen3-moe-6l.csv")
    spec = load_spec(REPO / "examples" / "qwen3-moe-6l-h200-1gpu.yaml")
    assert len(rows) == 10 and all(r.usable for r in rows)
    assert {r.workload.model for r in rows} == {spec.workload.model}
    assert {r.workload.cluster.gpu for r in rows} == {"h200"}
    assert {(r.workload.seq_length, r.workload.global_batch_size) for r in rows} == {(4096, 8)}
    assert sum(r.result == "oom" for r in rows) == 2
    ran = {(r.strategy.mbs, r.strategy.moe_token_dispatcher_type, r.strategy.cross_entropy_loss_fusion)
           for r in rows if r.strategy.recompute_granularity is None}
    assert ran == {(1, "alltoall", True), (2, "alltoall", True), (4, "alltoall", True), (8, "alltoall", True),
                   (8, "alltoall", False), (4, "allgather", True), (4, "alltoall", False)}


def test_gpu_sweep_kills_a_timed_out_run_with_its_workers(tmp_path: Path) -> None:
    """A timed-out configuration must leave no process behind: torchrun starts its workers in
    sessions of their own, and a worker left running held 67 GiB of the H100 and made the next
    configuration of a real sweep run out of memory (docs/benchmarks.md, the Qwen2.5-1.5B sweep)."""
    import asyncio
    import os
    import sys
    import time

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_sweep

    pid_file = tmp_path / "worker.pid"
    launcher = ("import subprocess, sys, time\n"  # like torchrun: the worker in a session of its own
                "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
                f"open({str(pid_file)!r}, 'w').write(str(w.pid))\n"
                "print('started', flush=True)\n"
                "time.sleep(120)\n")
    t0 = time.monotonic()
    text, timed_out, _ = asyncio.run(gpu_sweep.run_whole([sys.executable, "-c", launcher], tmp_path / "run", 5.0))
    assert timed_out and "started" in text
    assert time.monotonic() - t0 < 60
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
            with open(f"/proc/{worker}/stat", "rb") as fh:  # a zombie is dead too
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the worker of the timed-out run is still alive")



def test_gpu_sweep_keeps_a_run_its_limit_cut_out_of_the_landscape(tmp_path: Path, monkeypatch) -> None:
    """A run the sweep's own --timeout kills before it reports anything measured nothing (the H200 MoE
    sweep lost a configuration to a 60 s limit that whole runs there overran): its row goes to a side
    file, not into the landscape. A run that printed its OOM and then hung on its way out was measured
    and stays, as an OOM."""
    import json
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_sweep
    from optico.launchers.megatron.report import ERROR_PREFIX

    oom = json.dumps({"category": "oom", "message": "CUDA out of memory. Tried to allocate 18.55 GiB"})
    behaviours = iter([
        "import time; time.sleep(60)",  # says nothing before the limit
        f"import time; print({ERROR_PREFIX + oom!r}, flush=True); time.sleep(60)",  # OOM, then hangs
        "import sys; sys.exit(1)",  # fails at once, says nothing: an error row, as before
    ])
    monkeypatch.setattr(gpu_sweep, "torchrun_command", lambda spec, n: [sys.executable, "-c", next(behaviours)])
    out = tmp_path / "sweep.csv"
    monkeypatch.setattr(sys, "argv", ["gpu_sweep.py", "--quick", "--out", str(out), "--timeout", "3"])
    assert gpu_sweep.main() == 0
    kept = read_replay_csv(out)
    assert [r.result for r in kept] == ["oom", "error"]
    cut = list(csv.DictReader((tmp_path / "sweep.timed-out.csv").open()))
    assert len(cut) == 1 and "timed out after 3 s" in cut[0]["notes"] and cut[0]["mbs"] == "1"

# -- numbers no GPU measures ---------------------------------------------------------------------

@pytest.mark.parametrize("cells", [
    dict(mem_max_gib="-1"), dict(mem_max_gib="500"),  # on an 80 GB H100
    dict(mfu="1.5"), dict(tflops_per_gpu="2000"),  # stated beside a step time that is possible
    dict(step_time_s="0.5"),  # the MFU the step time gives: far past the peak
    # Too large to be finite, or too small to be a run: 1e-320 passed as positive, then its step time
    # overflowed the trial's JSON and failed the job after it was created.
    dict(mfu="1e999"), dict(mfu="inf"), dict(mem_max_gib="-Infinity"), dict(step_time_s="1e999"),
    dict(mfu="1e-320"), dict(tflops_per_gpu="1e-320"), dict(step_time_s="1e300"), dict(mem_max_gib="0"),
])
def test_an_impossible_measurement_is_a_skipped_row_naming_why(tmp_path: Path, cells: dict[str, str]) -> None:
    row = one(tmp_path, **cells)
    assert not row.usable and row.skip_reason.startswith(IMPOSSIBLE + ": "), row.skip_reason
    assert one(tmp_path).usable  # the same row without the edit is a measurement


def test_the_model_s_fit_and_score_leave_impossible_rows_out(tmp_path: Path) -> None:
    """`perfmodel evaluate` scored a negative peak memory (an MdAPE below zero) and `calibrate` died on
    its logarithm; both now skip the row, and --strict refuses it naming file:line."""
    import subprocess

    from tests.conftest import optico_cmd

    path = write_csv(tmp_path / "t.csv", {**LLAMA3_8B, "mem_max_gib": "-1"},
                     {**LLAMA3_8B, "tp": "4", "mem_max_gib": "30"})
    strict = subprocess.run(optico_cmd("perfmodel", "evaluate", "--data", str(path), "--strict"),
                            capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and "t.csv:2" in strict.stderr and "mem_max_gib -1" in strict.stderr, strict.stderr
    assert "Traceback" not in strict.stderr and len(strict.stderr.strip().splitlines()) == 1
    fit = subprocess.run(optico_cmd("perfmodel", "calibrate", "--data", str(path), "--out", str(tmp_path / "c.json"),
                                    "--max-evals", "2"), capture_output=True, text=True, timeout=300)
    assert "math domain error" not in fit.stderr and "Traceback" not in fit.stderr, fit.stderr


def test_exported_text_cells_never_start_a_spreadsheet_formula(tmp_path: Path) -> None:
    from optico.replay_rows import spreadsheet_safe

    row = {"model": "=cmd|' /C calc'!A0", "source": "@SUM(A1)", "notes": "+1", "gpu": "h100-sxm", "tp": 2,
           "mfu": 0.41, "recompute": "none", "step_time_s": ""}
    safe = spreadsheet_safe(row)
    assert (safe["model"], safe["source"], safe["notes"]) == ("'=cmd|' /C calc'!A0", "'@SUM(A1)", "'+1")
    assert {k: v for k, v in safe.items() if k not in ("model", "source", "notes")} == \
        {k: v for k, v in row.items() if k not in ("model", "source", "notes")}  # numbers and plain text as they were


@pytest.mark.parametrize(("cell", "read_as_unknown"), [("9" * 5000, False), ("1e999", False), ("-4", False),
                                                        ("2.5", False), ("auto", True), ("0", False),
                                                        ("-0", False), ("infinite", True)])
def test_a_layer_count_that_is_no_count_is_a_wrong_row_and_a_word_is_unknown(tmp_path: Path, cell: str,
                                                                              read_as_unknown: bool) -> None:
    # A 5,000-digit layer count was read as unknown and the preset's 32 layers stood in for it; so was a 0
    # (a 0 is 'none' only in the counts tables write it for: VPP, experts).
    path = tmp_path / "n.csv"
    path.write_text(f"{HEADER}\nLlama3-8B,{cell},4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok\n")
    row = read_replay_file(path)[0][0]
    if read_as_unknown:
        assert row.read and "architecture from preset llama3-8b" in row.inferred, row.skip_reason
    else:
        assert not row.read and row.skip_reason.startswith("num_layers "), row.skip_reason


def test_a_nemo_summary_as_published_reads_fsdp_pairs_and_names(tmp_path: Path) -> None:
    # NeMo 25.07's performance summary (DGX-GB200, FP8), its own headers and cells, with the system and
    # precision of its section heading as columns.
    path = tmp_path / "nemo.csv"
    path.write_text(
        "Model,System,Precision,#-GPUs,GBS,MBS,Sequence Length,FSDP,TP,PP,CP,VP,EP,GA,Tokens / sec / GPU,"
        "Model TFLOPs/sec/GPU,Time per Global Step (s)\n"
        "LLAMA3-8B,DGX-GB200,FP8,8,128,2,8192,0,1,1,1,1,1,8,31737 (30341),1838 (1757),4.1\n"
        "LLAMA3-70B,DGX-GB200,FP8,64,128,1,8192,1 (0),1 (2),1 (4),1 (2),1 (5),1,2 (32),4066 (2605),1957 (1254),4.0\n"
        "LLAMA3-405B,DGX-GB200,FP8,128,64,1,8192,0,4,8,2,8,1,32,706,1854,6.0\n"
        "Qwen3 MoE 30B,DGX-GB200,FP8,8,512,4,4096,0,1,1,1,1,8,16,12040,277,21.8\n")
    rows, report = read_replay_file(path)
    small, fsdp, unsharded, big, moe = rows
    assert small.usable and small.tflops_per_gpu == pytest.approx(1838) and small.step_time_s == pytest.approx(4.1)
    assert any("the first figure read" in note for note in small.inferred)  # '31737 (30341)' is said, not hidden
    assert not fsdp.read and fsdp.skip_reason.startswith("fsdp "), fsdp.skip_reason  # sharded: not modelled
    # The pair's second run (FSDP 0, TP 2, PP 4, CP 2, VP 5) is an ordinary configuration: it was lost.
    assert unsharded.usable and unsharded.line == fsdp.line, unsharded.skip_reason
    s2 = unsharded.strategy
    assert (s2.tp, s2.pp, s2.context_parallel_size, s2.vpp) == (2, 4, 2, 5)
    assert unsharded.tflops_per_gpu == pytest.approx(1254) and unsharded.step_time_s is None  # 4.0 s was the first's
    assert unsharded.inferred[0].startswith("the second run")
    assert big.read and big.workload.model.name == "llama3.1-405b", big.skip_reason  # NeMo's spelling of it
    assert moe.read and moe.workload.model.name == "qwen3-30b-a3b", moe.skip_reason
    assert {"Model TFLOPs/sec/GPU", "Time per Global Step (s)", "FSDP"} <= set(report.renamed_columns)


def test_a_written_row_keeps_a_cpu_runs_small_figures(tmp_path: Path) -> None:
    """`jobs export` of a CPU job wrote 0.046 TFLOP/s as 0.0 (two decimals), and `perfmodel evaluate`
    then refused the row as an impossible measurement: figures keep significant digits instead."""
    from optico.replay_rows import replay_row

    w = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=8,
                 cluster=Cluster(gpu="h100-sxm", gpus_per_node=8))
    metrics = {"tflops_per_gpu": 0.0461234, "mfu": 0.0000466, "step_time_s": 123.456789,
               "tokens_per_s_per_gpu": 0.0312, "mem_max_gib": 0.000712}
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerow(replay_row(w, strategy_from_mapping({"tp": 2}), result="ok", source="test", notes={},
                                   metrics=metrics))
    row = read_replay_csv(path)[0]
    assert row.usable, row.skip_reason
    assert row.tflops_per_gpu == pytest.approx(0.0461234) and row.mfu == pytest.approx(0.0000466)
    assert row.step_time_s == pytest.approx(123.457) and row.mem_max_gib == pytest.approx(0.000712)


def test_only_ascii_digits_are_a_number_as_in_a_spec() -> None:
    """'٢' and '２' are digits to `\\d` and float(); the spec reader refuses them, and so does a table."""
    for cell in ("٢", "０.６７", "١٢ ms"):
        with pytest.raises(CellError, match="is not a number"):
            parse_number(cell)
    assert parse_number("12 ms", "s") == pytest.approx(0.012)


def test_a_decimal_comma_is_read_as_one_and_a_comma_naming_no_number_is_refused(tmp_path: Path) -> None:
    """'38,4' (a European table) is 38.4, not 384; '4,064' keeps its thousands separator; '1,2,3'
    names no one number and is refused, not read as 123."""
    assert parse_number("38,4 %", "fraction") == pytest.approx(0.384)
    assert parse_number("1,25 s", "s") == pytest.approx(1.25)
    assert parse_number("12,345,678.5") == 12345678.5
    for cell in ("1,2,3", "1,234,56", "38,4.5"):
        with pytest.raises(CellError, match="thousands separators"):
            parse_number(cell)
    path = tmp_path / "d.csv"
    path.write_text(f"{HEADER},Step time (s)\n"
                    "Llama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok,\"3,25\"\n")
    assert read_replay_csv(path)[0].step_time_s == pytest.approx(3.25)


@pytest.mark.parametrize("cell", ["0x10", "0xff", "0b1", "1.2.3", "38.4.1 %"])
def test_a_cell_that_is_no_one_decimal_is_refused(cell: str) -> None:
    """'0x10' was read as 0 and '1.2.3' as 1.2: the number's first digits, the rest taken for a unit."""
    with pytest.raises(CellError, match="not one decimal number"):
        parse_number(cell)


def test_a_unit_or_a_scale_after_a_decimal_is_still_read() -> None:
    assert parse_number("0 b") == 0 and parse_number("2b") == 2e9
    assert parse_number("0.5 ms", "s") == pytest.approx(0.0005)


# -- published tables as papers and docs write them ----------------------------------------------

@pytest.mark.parametrize("header, column", [
    ("TFLOP/s per GPU", "tflops_per_gpu"), ("TFLOP/sec/GPU", "tflops_per_gpu"),
    ("Achieved teraFLOP/s per GPU", "tflops_per_gpu"), ("Latency per iteration (s)", "step_time_s"),
    ("paper-reported latency per iter. (s)", "step_time_s"), ("Seconds per iteration", "step_time_s"),
    ("Training step time (seconds per step)", "step_time_s"), ("total num. of GPUs", "num_gpus"),
    ("# of GPUs", "num_gpus"), ("Number of layers", "num_layers"), ("Number of attention heads", "num_attention_heads"),
    ("Model FLOP Utilization", "mfu"), ("Dispatcher", "moe_token_dispatcher_type"),
    ("NHEADS", "num_attention_heads"), ("NHIDDEN", "hidden_size"), ("Sec/it", "step_time_s"), ("Glob-BS", "gbs"),
    ("Number of parameters (billion)", None), ("Total tokens", None), ("Avg step time (s)", "step_time_s"),
    ("Average memory (GB)", None), ("Total memory (GB)", None),  # no peak: a mean, the GPU's capacity
    ("Percentage of theoretical peak FLOP/s", "mfu"), ("Vocabulary size", "vocab_size"),  # Megatron-LM's README
    ("Achieved aggregate petaFLOP/s", None), ("GA", "ga"), ("Gradient accumulation steps", "ga"),
    ("Packed Sequence Length", "seq_length"), ("Task", None),  # NeMo's fine-tuning table
])
def test_headers_as_papers_write_them(header: str, column: str | None) -> None:
    """Megatron-LM's READMEs, the SC21 paper and NeMo's tables spell these so; each was ignored."""
    from optico.replay_cells import canonical_header

    assert canonical_header(header) == column


def test_nemo_s_model_names_and_recipe_sources(tmp_path: Path) -> None:
    """'Nemotron-15B' is NeMo's name for Nemotron-4 15B; a NeMo docs URL names the recipes (the check
    was case-sensitive 'NeMo'); a 'Dispatcher' column sets the dispatcher, on MoE rows only."""
    from optico.replay_names import preset_by_name

    assert preset_by_name("Nemotron-15B").name == "nemotron4-15b"
    assert preset_by_name("Nemotron-340B").name == "nemotron4-340b"
    assert preset_by_name("Llama-70B") is None  # several generations have a 70B: no guess
    path = tmp_path / "nemo.csv"
    path.write_text(
        "Model,System,#-GPUs,Precision,Seq Length,GBS,MBS,TP,PP,CP,VP,EP,Dispatcher,Tokens / sec / GPU,Source\n"
        "Mixtral-8x7B,DGX-H100,64,BF16,4096,256,1,1,4,1,8,8,All-to-All,8233,docs.nvidia.com/nemo-framework/perf\n"
        "Mixtral-8x7B,DGX-H100,64,BF16,4096,256,1,1,4,1,8,8,AllGather,8233,\n"
        "LLAMA3-8B,DGX-H100,8,BF16,8192,128,1,2,1,2,1,1,All-to-All,13812,Nemotron-4 report\n"
        "Mixtral-8x7B,DGX-H100,64,BF16,4096,256,1,1,4,1,8,8,pigeon,8233,\n")
    recipe, stated, dense, wrong = read_replay_csv(path)
    assert (recipe.strategy.moe_token_dispatcher_type, recipe.strategy.moe_grouped_gemm) == ("alltoall", True)
    assert recipe.strategy.overlap_grad_reduce  # the recipe's settings, from its docs URL
    assert (stated.strategy.moe_token_dispatcher_type, stated.strategy.moe_grouped_gemm) == ("allgather", False)
    assert dense.strategy.moe_token_dispatcher_type == "allgather"  # no experts to dispatch
    assert not dense.strategy.sequence_parallel  # 'Nemotron' is no NeMo recipe
    assert wrong.malformed and "'pigeon' is not allgather, alltoall or flex" in wrong.skip_reason


def test_a_skip_reason_is_counted_by_its_kind_not_its_quoted_cell(tmp_path: Path) -> None:
    """"fsdp '1 (0)': ..." was counted as "fsdp '1" and shown "fsdp '1 (2)", a cell it never held."""
    from optico.replay_csv import reason_kind

    assert reason_kind("fsdp '1 (0)': Megatron-FSDP / FSDP2 shard more than the optimizer; x") == "fsdp"
    assert reason_kind("tp '1' is larger than any count") == "tp is larger than any count"
    path = tmp_path / "no-model.csv"
    path.write_text("GPU,GPUs,TP,PP,Layers,MFU\nA100,8,1,1,,40%\n")
    (row,) = read_replay_csv(path)
    assert "no model name to find a preset by" in row.skip_reason and "custom" not in row.skip_reason


def test_a_name_with_a_number_in_parentheses_is_one_run(tmp_path: Path) -> None:
    path = tmp_path / "names.csv"
    path.write_text("Model,GPU,GPUs,TP,PP,MBS,GBS,Seq Len,MFU\n"
                    "Llama3-8B (8B),H100,8 (8),2,1,1,128,8192,40% (38%)\n")
    (row,) = read_replay_csv(path)  # GPUs '8 (8)': both runs on the same layout, one configuration
    assert row.workload.model.name == "llama3-8b" and row.mfu == pytest.approx(0.40)


def test_an_oom_written_where_a_figure_would_be_is_the_row_s_result(tmp_path: Path) -> None:
    """BLOOM's topology search logs 'OOM' in its memory column and leaves the rest empty: the row was
    skipped as 'no result and no measurement', and a landscape lost its failures."""
    path = tmp_path / "bloom.csv"
    path.write_text("Model,NLAYERS,NHIDDEN,NHEADS,Seq,GPUs,GPU,TP,PP,MBS,GBS,Mem,Sec/it,TFLOPs\n"
                    "bloom-181b,72,14336,64,2048,384,A100-80GB,4,12,2,2048,OOM,,\n"
                    "bloom-181b,72,14336,64,2048,384,A100-80GB,4,12,1,2048,79GB,102,141\n")
    oom, ok = read_replay_csv(path)
    assert oom.read and oom.result == "oom" and "result oom (its mem_max_gib cell says so)" in oom.inferred
    assert ok.result == "ok" and ok.step_time_s == pytest.approx(102)


def test_the_file_report_says_what_was_assumed_and_which_flops_were_read(tmp_path: Path) -> None:
    """--report listed what was skipped, but not what the reader assumed (a result, a preset, one
    figure of a pair) nor that a table's TFLOP/s were read as hardware FLOPs."""
    rows, report = read_replay_file(REPO / "benchmarks" / "data" / "published" / "megatron_sc21_table1_a100.csv")
    text = report.text()
    assert f"read as hardware FLOPs (the recompute pass counted, as the source or notes say) on {len(rows)} rows" in text
    path = tmp_path / "pairs.csv"
    path.write_text("Model,System,#-GPUs,GBS,MBS,Sequence Length,TP,PP,Tokens / sec / GPU\n"
                    "LLAMA3-8B,DGX-H100,8,128,1,8192,1 (2),1,1000 (900)\n")
    text = read_replay_file(path)[1].text()
    assert "derived or assumed: " in text and "result ok (the row reports throughput) (2)" in text
    assert "tp: the figure of the first run (the second run is the next row) (1)" in text  # by kind, not cell


def test_an_empty_pp_or_tp_is_derived_from_the_gpu_count_and_dp(tmp_path: Path) -> None:
    """Nemotron-4 340B's report gives GPUs, DP and TP 8 but its PP only in prose: the row was refused as
    'dp 16 but num_gpus/(TP·PP·CP) = 1536/(8·1·1)', checked against the placeholder PP 1."""
    row = one(tmp_path, num_gpus="64", dp="4", tp="4", pp="")
    assert row.usable and row.strategy.pp == 4 and "pp" not in row.unknown
    assert "pp = num_gpus/(dp·TP·CP) = 4" in row.inferred
    row = one(tmp_path, num_gpus="64", dp="4", tp="", pp="2", cp="2")
    assert row.usable and (row.strategy.tp, row.strategy.cp) == (4, 2) and "tp = num_gpus/(dp·PP·CP) = 4" in row.inferred
    # Nothing to derive from: a dp that does not divide, or both degrees missing, stay unknown.
    assert "pp" in one(tmp_path, num_gpus="64", dp="3", tp="4", pp="").unknown
    both = one(tmp_path, num_gpus="64", dp="4", tp="", pp="")
    assert {"tp", "pp"} <= set(both.unknown)


def test_an_mfu_cell_the_step_time_overrides_is_named_when_they_disagree(tmp_path: Path) -> None:
    """Nemotron-4 15B's table gives 34.3 % MFU and a step time that is 32.4 % on our FLOP count (causal
    attention): the step time was used and the cell dropped without a word."""
    used = measured_mfu(one(tmp_path))
    assert used is not None
    far = one(tmp_path, mfu=f"{used * 1.06:.4f}", mbs="")  # an unknown mbs leaves the FLOP count as it is
    assert "mfu: the step time's MFU used, the cell differs by over 3%" in far.inferred
    assert measured_mfu(far) == pytest.approx(used)
    near = one(tmp_path, mfu=f"{used * 1.01:.4f}")
    assert not [x for x in near.inferred if "step time's MFU used" in x]
    text = read_replay_file(write_csv(tmp_path / "far.csv", {**LLAMA3_8B, "mfu": f"{used * 1.06:.4f}"}))[1].text()
    assert "derived or assumed: mfu: the step time's MFU used, the cell differs by over 3% (1)" in text


def test_a_column_named_twice_is_reported_refused_by_strict_and_by_a_spec(tmp_path: Path) -> None:
    """A second 'MFU (%)' beside 'mfu' was dropped silently (listed only among unknown headers), even
    under --strict and in a spec's own replay file."""
    lines = PACKAGED.read_text().splitlines()
    table = tmp_path / "t.csv"
    table.write_text("\n".join([lines[0] + ",MFU (%)", *(line + ",99" for line in lines[1:])]) + "\n")
    rows, report = read_replay_file(table)
    assert rows and report.repeated_columns == {"MFU (%)": "mfu"}
    assert "columns read twice (the first kept, these ignored): 'MFU (%)' -> mfu" in report.text()
    with pytest.raises(ReplayError, match="columns 'mfu' and 'MFU \\(%\\)' both read as mfu"):
        read_replay_file(table, strict=True)
    spec = tmp_path / "s.yaml"
    spec.write_text((REPO / "examples" / "llama3-8b-a100-replay.yaml").read_text()
                    .replace("../optico/data/optico_llama3_8b_a100.csv", str(table)))
    with pytest.raises(SpecError, match="launcher.data: t.csv: column 'MFU \\(%\\)' is read as mfu a second time"):
        load_spec(spec)


def test_a_zero_is_none_where_tables_write_it_so_and_a_wrong_cell_elsewhere(tmp_path: Path) -> None:
    """A TP or a GPU count of 0 was read as unknown and re-derived ('tp = num_gpus/(dp·PP·CP) = 1'), also
    under --strict; VPP 0 and experts 0 are how tables say 'none'."""
    for column in ("tp", "num_gpus", "gbs"):
        row = one(tmp_path, **{column: "0"})
        assert not row.read and row.malformed and row.skip_reason.startswith(f"{column} '0' is not a positive")
    none = one(tmp_path, vpp="0", num_experts="0")
    assert none.usable and none.strategy.virtual_pipeline_model_parallel_size is None


def test_a_cell_longer_than_a_table_s_makes_its_row_malformed_and_is_not_parsed(tmp_path: Path) -> None:
    # Reading a figure out of a long run of digits or spaces grew with the square of its length (a
    # 4,000-digit cell: 1 s a row); one pattern was cubic. A cell may hold 128 KiB.
    path = tmp_path / "long.csv"
    good = "Llama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,2,1,1,128,ok"
    long_tp = good.replace(",2,1,1,128,ok", ",1" + " " * 100_000 + "(,1,1,128,ok")
    path.write_text(f"{HEADER}\n{good}\n{long_tp}\n")
    started = time.monotonic()
    rows, report = read_replay_file(path)
    assert time.monotonic() - started < 5
    assert rows[0].read and not rows[1].read and rows[1].malformed
    assert rows[1].skip_reason.startswith(f"tp cell of 100,002 characters: longer than a table's (at most "
                                          f"{MAX_CELL_CHARS})")
    with pytest.raises(ReplayError, match="tp cell of 100,002 characters"):
        read_replay_file(path, strict=True)


@pytest.mark.parametrize("unit", ["1", " ", "1 (", "( ", "\t1", "a="])
def test_cells_at_the_length_bound_read_in_linear_time(tmp_path: Path, unit: str) -> None:
    path = tmp_path / "bound.csv"
    cell = (unit * MAX_CELL_CHARS)[:MAX_CELL_CHARS]
    notes = (unit * MAX_TEXT_CELL_CHARS)[:MAX_TEXT_CELL_CHARS - 6] + "args: "
    rows = "\n".join(f'Llama3-8B,32,4096,32,8,14336,128256,8192,A100-80GB,8,"{cell}",1,1,128,ok,"{notes}"'
                     for _ in range(50))
    path.write_text(f"{HEADER},Notes\n{rows}\n")
    started = time.monotonic()
    read_replay_file(path)
    assert time.monotonic() - started < 10  # ~0.1 s here for the 50 rows


# Cells a user's own table writes (found transcribing BigScience's and NeMo's tables, 2026-11-30):
# each was read wrong without a word ('250 880' as 250, '2K' as 2000, '2:03.69' as 2 s, '0.049 TB'
# as 0.049 GiB, '384 (48x8)' as two runs).
@pytest.mark.parametrize("cells, field, expected", [
    ({"vocab_size": "128 256"}, "vocab_size", 128256),
    ({"vocab_size": "128\u202f256"}, "vocab_size", 128256),
    ({"hidden_size": "4'096"}, "hidden_size", 4096),
    ({"seq_length": "8K"}, "seq_length", 8192),
    ({"gbs": "1k", "step_time_s": "100"}, "gbs", 1024),
    ({"num_gpus": "8 (1x8)"}, "num_gpus", 8),
    ({"num_gpus": "8 (1 node)"}, "num_gpus", 8),
])
def test_counts_as_tables_write_them(tmp_path: Path, cells: dict[str, str], field: str, expected: int) -> None:
    path = write_csv(tmp_path / "t.csv", {**LLAMA3_8B, **cells})
    rows = read_replay_csv(path)
    assert len(rows) == 1 and rows[0].read, rows[0].skip_reason
    workload = rows[0].workload
    value = {"vocab_size": workload.model.vocab_size, "hidden_size": workload.model.hidden_size,
             "seq_length": workload.seq_length, "gbs": workload.global_batch_size,
             "num_gpus": workload.world_size}[field]
    assert value == expected


@pytest.mark.parametrize("cell, unit, expected", [
    ("2:03.69", "s", 123.69), ("1:02:03", "s", 3723.0), ("0.049 TB", "gib", 50.176),
    ("0.13 PFLOP/s", "tflops", 130.0), ("150 TFLOP/s", "tflops", 150.0), ("39.9k", "", 39900.0),
])
def test_times_and_units_as_tables_write_them(cell: str, unit: str, expected: float) -> None:
    assert parse_number(cell, unit) == pytest.approx(expected)


def test_a_clock_time_where_no_time_goes_and_a_typeset_minus_are_refused() -> None:
    from optico.replay_cells import WrongNumber, parse_int

    with pytest.raises(CellError, match="not one decimal number"):
        parse_number("2:03.69")  # read as 2 before
    with pytest.raises(WrongNumber):
        parse_int("\u221212")  # read as 12 before


@pytest.mark.parametrize("layout", ["semicolon", "tab", "excel sep line", "bom crlf semicolon"])
def test_a_table_saved_with_another_delimiter_reads_the_same(tmp_path: Path, layout: str) -> None:
    delimiter = "\t" if layout == "tab" else ";"
    lines = [delimiter.join(COLUMNS), delimiter.join(LLAMA3_8B.get(c, "") for c in COLUMNS)]
    if layout == "excel sep line":
        lines.insert(0, "sep=;")
    ending = "\r\n" if "crlf" in layout else "\n"
    text = ("\ufeff" if "bom" in layout else "") + ending.join(lines) + ending
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8", newline="")
    rows = read_replay_csv(path)
    assert [r.read for r in rows] == [True] and rows[0].workload.model.vocab_size == 128256


def test_a_utf16_table_says_so(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(",".join(COLUMNS).encode("utf-16"))
    with pytest.raises((ReplayError, SpecError), match="UTF-16"):
        read_replay_csv(path)


def test_the_spec_check_takes_the_delimiters_the_reader_takes(tmp_path: Path) -> None:
    """A replay spec names a semicolon table the reader reads: the spec load must read it the same way."""
    text = "sep=;\n" + ";".join(COLUMNS) + "\n" + ";".join(LLAMA3_8B.get(c, "") for c in COLUMNS) + "\n"
    (tmp_path / "t.csv").write_text(text)
    spec = tmp_path / "replay.yaml"
    spec.write_text("workload:\n  model: llama3-8b\n  seq_length: 8192\n  global_batch_size: 128\n"
                    "  cluster: {gpu: h100-sxm, gpus_per_node: 8, nodes: 1}\n"
                    "search_space: {tunables: {tp: [2], pp: [1], mbs: [1]}, fixed: {use_distributed_optimizer: true}}\n"
                    "launcher: {kind: replay, data: t.csv}\n")
    assert load_spec(spec).launcher.data.endswith("t.csv")


def test_the_cells_a_first_fix_read_wrong():
    """Two numbers are not one ('4096 128', '1.5 100'); a vocabulary's K is decimal (Llama 2's '32K'
    is 32,000 and matches its preset); a pair may carry a unit; a tied header goes to the semicolon."""
    from optico.replay_cells import figure_pair, parse_int
    from optico.replay_csv import _delimiter

    assert parse_number("4096 128") == 4096 and parse_number("1.5 100") == 1.5
    assert parse_int("32K", binary=False) == 32000 and parse_int("32K") == 32768
    assert figure_pair("850 ms (900 ms)") == ("850 ms", "900 ms") and figure_pair("1 024 (2 048)")
    assert figure_pair("384 (48 nodes)") is None
    assert _delimiter("model;step time (s, mean);mfu\n") == (";", False)

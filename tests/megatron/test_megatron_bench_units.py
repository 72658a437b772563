"""The benchmark driver's pieces that need no torchrun: spec loading, the plan (--check),
error categories, step-time statistics and output parsing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optico.launchers.megatron import bench, report
from optico.strategy import Strategy
from optico.workload import PRESETS, Cluster, Workload

REPO = Path(__file__).resolve().parents[2]
HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "megatron.core"))

pytestmark = pytest.mark.megatron


def _workload(n: int = 2, model: str = "tiny-gpt") -> Workload:
    return Workload(model=PRESETS[model], seq_length=64, global_batch_size=4,
                    cluster=Cluster(gpu="h100-sxm", gpus_per_node=n))


def test_spec_accepts_presets_and_short_names():
    spec = bench.BenchSpec.model_validate({
        "workload": {"model": "tiny-moe", "seq_length": 64, "global_batch_size": 4,
                     "cluster": {"gpu": "H100", "gpus_per_node": 2}},
        "strategy": {"tp": 2, "sp": True, "recompute": "none", "MICRO_BATCH_SIZE": 2},
        "max_steps": 4,
    })
    assert spec.workload.model.name == "tiny-moe" and spec.workload.cluster.gpu == "h100-sxm"
    assert spec.strategy.tp == 2 and spec.strategy.sequence_parallel and spec.strategy.mbs == 2
    assert spec.strategy.recompute_granularity is None
    assert (spec.warmup, spec.max_steps, spec.min_steps, spec.cv_target) == (2, 4, 3, 0.02)


def test_spec_rejects_unknown_fields_and_presets():
    with pytest.raises(ValueError):
        bench.BenchSpec.model_validate({"workload": {"model": "no-such-model", "seq_length": 8,
                                                     "global_batch_size": 1, "cluster": {"gpu": "h100"}}})
    with pytest.raises(ValueError):
        bench.BenchSpec.model_validate({"workload": _workload().model_dump(), "steps": 3})


def test_write_spec_round_trips_and_command(tmp_path):
    w, s = _workload(), Strategy(tensor_model_parallel_size=2)
    path = bench.write_spec(tmp_path / "spec.json", w, s, warmup=1, max_steps=3)
    spec = bench.BenchSpec.model_validate_json(path.read_text())
    assert spec.workload == w and spec.strategy == s and spec.max_steps == 3
    cmd = bench.torchrun_command(path, 2, python="python")
    assert cmd[:3] == ["python", "-m", "torch.distributed.run"] and "--standalone" in cmd
    assert cmd[-4:] == ["-m", "optico.launchers.megatron.bench", "--spec-json", str(path)]
    multi = bench.torchrun_command(path, 8, nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29400)
    assert "--nnodes=2" in multi and "--node-rank=1" in multi and "--master-addr=10.0.0.1" in multi


def test_cli_overrides_and_workload_strategy_files(tmp_path):
    (tmp_path / "w.json").write_text(_workload().model_dump_json())
    (tmp_path / "s.json").write_text(json.dumps({"pp": 2}))
    args = bench._parser().parse_args(["--workload-json", str(tmp_path / "w.json"), "--strategy-json",
                                       str(tmp_path / "s.json"), "--max-steps", "7", "--cv-target", "0.05"])
    spec = bench.load_spec(args)
    assert spec.strategy.pp == 2 and spec.max_steps == 7 and spec.cv_target == 0.05
    with pytest.raises(ValueError):
        bench.load_spec(bench._parser().parse_args([]))


@pytest.mark.skipif(not HAVE_STACK, reason="torch and megatron-core are needed")
def test_check_prints_the_plan_without_running(tmp_path):
    path = bench.write_spec(tmp_path / "spec.json", _workload(4, "tiny-moe"),
                            Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=2,
                                     sequence_parallel=True))
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="4", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "optico.launchers.megatron.bench", "--spec-json", str(path),
                           "--check"], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    plan = out["plan"]
    assert (plan["tp"], plan["dp"], plan["ep"], plan["num_microbatches"]) == (2, 2, 2, 2)
    assert plan["etp"] == 1 and plan["device"] == "cpu"  # expert TP forced to 1 under gloo


def test_bad_spec_file_is_an_error_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "optico.launchers.megatron.bench", "--spec-json",
                           str(tmp_path / "bad.json")], cwd=str(REPO), env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1
    e = report.parse_output(proc.stdout)["errors"][0]
    assert e["phase"] == "spec" and e["category"] == "invalid_config"


# -- report ---------------------------------------------------------------------------------


def test_categories():
    class OutOfMemoryError(RuntimeError):
        pass

    class DistBackendError(RuntimeError):
        pass

    assert report.categorize(OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")) == "oom"
    assert report.categorize(RuntimeError("CUDA error: out of memory")) == "oom"
    assert report.categorize(DistBackendError("NCCL error in: ...")) == "comm"
    assert report.categorize(RuntimeError("[../gloo/transport/tcp/pair.cc] Connection closed by peer")) == "comm"
    assert report.categorize(AssertionError("num_layers should be divisible by pipeline")) == "invalid_config"
    assert report.categorize(ValueError("bad")) == "invalid_config"
    assert report.categorize(RuntimeError("found NaN in local grad norm")) == "unknown"
    assert report.categorize(RuntimeError("The remainder of M ... should be 0, or larger")) == "invalid_config"
    assert report.categorize(KeyError("x")) == "unknown"


def test_primary_error_prefers_the_root_cause():
    errors = [{"category": "comm", "rank": 0}, {"category": "oom", "rank": 1}]
    assert report.primary_error(errors)["rank"] == 1
    assert report.primary_error([{"category": "comm", "rank": 3}])["rank"] == 3
    assert report.primary_error([]) is None


def test_stopper_stops_when_stable_or_at_the_limit():
    s = report.Stopper(min_steps=3, max_steps=10, cv_target=0.02, window=3)
    assert not s.add(1.0) and not s.add(1.5)
    assert not s.add(1.0)           # cv of (1, 1.5, 1) is large
    assert not s.add(1.0)           # (1.5, 1, 1)
    assert s.add(1.0) and s.reason == "stable"
    assert s.current_cv() == 0.0
    s = report.Stopper(min_steps=2, max_steps=3, cv_target=0.001, window=5)
    assert not s.add(1.0) and not s.add(2.0) and s.add(3.0) and s.reason == "max_steps"
    s = report.Stopper(min_steps=5, max_steps=50, cv_target=0.001, window=5, max_time_s=2.5)
    assert not s.add(1.0) and not s.add(1.4) and s.add(1.0) and s.reason == "max_time"
    assert report.cv([1.0]) is None and report.cv([2.0, 2.0]) == 0.0


def test_emit_and_parse_round_trip(capsys):
    report.emit(report.RESULT_PREFIX, {"ok": True, "step_time_s": 1.5, "cv": float("nan")})
    report.emit(report.ERROR_PREFIX, {"category": "oom", "rank": 1})
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 2
    parsed = report.parse_output("noise\n[rank0]: " + out)
    assert parsed["result"] == {"ok": True, "step_time_s": 1.5, "cv": None}  # strict JSON: NaN -> null
    assert parsed["errors"] == [{"category": "oom", "rank": 1}]


def test_parse_finds_records_of_ranks_whose_lines_ran_together():
    """Two ranks failing at once on torchrun's shared stdout: `...}OPTICO_ERROR {...}` on one line."""
    a = report.ERROR_PREFIX + json.dumps({"category": "invalid_config", "rank": 0, "message": "x } y"})
    b = report.ERROR_PREFIX + json.dumps({"category": "invalid_config", "rank": 1})
    step = report.STEP_PREFIX + json.dumps({"step": 3})
    parsed = report.parse_output(f"[rank1]: {a}{b}\n{step}{report.ERROR_PREFIX}{{\"cut\": \n")
    assert [e["rank"] for e in parsed["errors"]] == [0, 1]
    assert parsed["steps"] == [{"step": 3}]  # the record cut short is dropped, not the line


# -- plan -------------------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_STACK, reason="torch and megatron-core are needed")
def test_make_plan_derives_layout_and_refuses_what_cannot_run():
    from optico.launchers.megatron import model as mdl

    w = _workload(4, "tiny-moe")
    plan = mdl.make_plan(w, Strategy(tensor_model_parallel_size=2, expert_model_parallel_size=2), 4, device="cuda")
    assert (plan.dp, plan.num_microbatches, plan.etp) == (2, 2, 2)  # Megatron-LM: expert TP = TP
    assert plan.use_cpu_initialization is False
    cases = [
        (Strategy(), 2, "processes were started"),
        (Strategy(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, batch_p2p_comm=True), 4,
         "batched p2p"),
        (Strategy(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=False), 4,
         "PP > 2"),
        (Strategy(micro_batch_size=3), 4, "global_batch_size"),
    ]
    for strategy, world, text in cases:
        with pytest.raises(mdl.BenchConfigError, match=text):
            mdl.make_plan(w, strategy, world, device="cpu")
    if not mdl.compat.HAVE_TE:
        with pytest.raises(mdl.BenchConfigError, match="Transformer Engine") as info:
            mdl.make_plan(w, Strategy(context_parallel_size=2), 4, device="cpu")
        assert info.value.params == ["context_parallel_size"]
        te_loss = w.model_copy(update={"cross_entropy_fusion_impl": "te"})
        with pytest.raises(mdl.BenchConfigError, match="cross_entropy_fusion_impl te needs Transformer Engine"):
            mdl.make_plan(te_loss, Strategy(cross_entropy_loss_fusion=True), 4, device="cpu")
        mdl.make_plan(te_loss, Strategy(), 4, device="cpu")  # no fusion: the kernel is never called



@pytest.mark.skipif(not HAVE_STACK, reason="needs torch and megatron-core")
def test_a_megatron_core_without_the_kernel_choice_refuses_te_rather_than_run_native(monkeypatch):
    from optico.launchers.megatron import model as mdl

    w, s = _workload(4), Strategy(cross_entropy_loss_fusion=True)
    plan = mdl.make_plan(w, s, 4, device="cpu")
    real = mdl.compat.config_kwargs_supported

    def without_the_field(cls, kw):
        kept, dropped = real(cls, {k: v for k, v in kw.items() if k != "cross_entropy_fusion_impl"})
        return kept, [*dropped, "cross_entropy_fusion_impl"]

    monkeypatch.setattr(mdl.compat, "config_kwargs_supported", without_the_field)
    te_loss = w.model_copy(update={"cross_entropy_fusion_impl": "te"})
    with pytest.raises(mdl.BenchConfigError, match="no cross_entropy_fusion_impl"):
        mdl.transformer_config(te_loss, s, plan)
    assert mdl.transformer_config(w, s, plan).cross_entropy_loss_fusion  # native is what it runs anyway

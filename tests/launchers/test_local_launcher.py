"""The local launcher for real: torchrun on this machine.

- the user's Megatron-LM command (a stand-in printing Megatron-LM's lines) with the strategy's
  flags in place of theirs, its metrics parsed, and a real-looking OOM diagnosed;
- real megatron-core training on CPU (gloo): TP2 with selective recompute, DP2 with the
  distributed optimizer, both overlaps and full recompute, recorded in the pool; CP2, which
  the driver refuses without Transformer Engine, diagnosed from its log;
- timeout, hang and cancel stop every process of the run, including one that ignores
  SIGTERM and one that left torchrun's process tree.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from optico.agent_contracts import FailureInput
from optico.agents.failure import RulesFailureAnalysis
from optico.launchers.local import LocalLauncher
from optico.launchers.program import MegatronCoreProgram, MegatronLMProgram
from optico.strategy import strategy_from_mapping
from optico.trial import FailureCategory, TrialStatus
from tests.launchers.conftest import (
    CPU_ENV,
    HAVE_MEGATRON,
    HAVE_TORCH,
    STEPS,
    assert_no_leftovers,
    fake_command,
    record,
    tiny,
    trial_processes,
)

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="torchrun needs torch")


def lm_launcher(tmp_path: Path, *extra: str, **kw) -> LocalLauncher:
    program = MegatronLMProgram(kind="megatron-lm", command=fake_command("--fake-record", "{run_dir}", *extra),
                                train_iters=8, warmup_iters=3)
    return LocalLauncher(program, run_dir=tmp_path / "runs", env={"OMP_NUM_THREADS": "1"}, **kw)


def test_megatron_lm_command_rendered_parsed_and_oom_diagnosed(tmp_path: Path):
    w = tiny(gpu="h100-sxm", gbs=8)  # 2 processes standing for 2 H100s
    launcher = lm_launcher(tmp_path, "--fake-oom-mbs", "4", timeout_s=120, hang_s=60)
    s = strategy_from_mapping({"tp": 2, "mbs": 2, "use_distributed_optimizer": True})
    lines: list[str] = []
    result = asyncio.run(launcher.launch(w, s, trial_key="job1-trial1", progress=lines.append))
    assert result.ok, result.log
    run_dir = Path(result.log_path).parent
    argv = json.loads((run_dir / "argv-rank0.json").read_text())
    # the flags the adapter owns, once each, with the strategy's and the workload's values
    for flag, value in [("--tensor-model-parallel-size", "2"), ("--pipeline-model-parallel-size", "1"),
                        ("--micro-batch-size", "2"), ("--global-batch-size", "8"), ("--train-iters", "8"),
                        ("--log-interval", "1"), ("--eval-iters", "0")]:
        assert [argv[i + 1] for i, a in enumerate(argv) if a == flag] == [value], (flag, argv)
    assert not any(a.startswith("--pipeline-model-parallel-size=") for a in argv)
    assert "--log-throughput" in argv and "--use-distributed-optimizer" in argv
    assert "--sequence-parallel" not in argv and "--save" not in argv and "--load" not in argv
    assert "--data-path" in argv and "--tokenizer-type" in argv  # the user's data stays theirs
    # metrics from the lines it printed: iterations 4-8 timed at 100 + 10·TP + 5·PP ms
    m = result.metrics
    assert m.step_time_s == pytest.approx(0.125)
    assert m.tflops_per_gpu == pytest.approx(333.3, abs=0.05)  # Megatron-LM's own throughput field
    assert m.mfu == pytest.approx(333.3 / 989.0, rel=1e-3)
    assert m.tokens_per_s_per_gpu == pytest.approx(8 * 64 / 0.125 / 2)
    # max reserved of the two TP ranks (DP rank 0): 1000 + 100·MBS + rank + 1000 MB
    assert m.mem_max_gib == pytest.approx(2201.0 / 1024) and m.mem_limit_gib == pytest.approx(79.6)
    assert any("iteration        8/       8" in line for line in lines)  # streamed to progress
    assert (run_dir / "stdout.log").is_file() and (run_dir / "stderr.log").is_file()
    assert "--tensor-model-parallel-size 2" in (run_dir / "command.txt").read_text()

    oom = strategy_from_mapping({"tp": 2, "mbs": 4})
    failed = asyncio.run(launcher.launch(w, oom, trial_key="job1-trial2"))
    assert not failed.ok and failed.exit_code not in (0, None) and failed.metrics is None
    assert failed.log.splitlines()[0].startswith("torch.OutOfMemoryError: CUDA out of memory")
    diagnosis = RulesFailureAnalysis().diagnose(FailureInput(
        workload=w, strategy=oom, reference=s, log=failed.log[-4000:], category_hint=failed.category_hint,
        attempts=1, iteration=2))
    assert diagnosis.category == FailureCategory.OOM and diagnosis.params[0] == "micro_batch_size", diagnosis
    assert_no_leftovers(tmp_path)


@pytest.mark.megatron
@pytest.mark.skipif(not HAVE_MEGATRON, reason="torch and megatron-core are needed")
def test_real_megatron_core_training_recorded_in_the_pool(tmp_path: Path, pool):
    store, job_id = pool
    launcher = LocalLauncher(MegatronCoreProgram(**STEPS), run_dir=tmp_path / "runs", env=CPU_ENV, timeout_s=300,
                             hang_s=120)
    w = tiny()
    configs = [
        {"tp": 2, "recompute": "selective"},
        {"use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
         "recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    ]
    for index, config in enumerate(configs, start=1):
        s = strategy_from_mapping(config)
        t0 = time.monotonic()
        result = asyncio.run(launcher.launch(w, s, trial_key=f"job{job_id}-trial{index}"))
        assert result.ok, result.log
        trial = record(store, job_id, index, s, result)
        m = trial.metrics
        assert trial.status == TrialStatus.OK and m.step_time_s > 0 and m.tflops_per_gpu > 0
        assert m.mfu == pytest.approx(m.tflops_per_gpu / 0.1)  # the nominal CPU peak: the driver reports none
        assert m.mem_max_gib is None and m.mem_limit_gib == 6.0  # host RSS is no OOM signal
        assert trial.fingerprint["megatron_core"] and trial.fingerprint["driver"]["device"] == "cpu"
        assert Path(trial.log_path).is_file() and result.duration_s <= time.monotonic() - t0 + 1
        assert result.gpu_seconds == pytest.approx(result.duration_s * 2)
    trials = store.trials(job_id)
    assert [t.strategy.tp for t in trials] == [2, 1]
    assert trials[1].strategy.use_distributed_optimizer and trials[1].strategy.overlap_param_gather

    # context parallelism needs Transformer Engine: a real failure, diagnosed from the log
    cp = strategy_from_mapping({"cp": 2})
    failed = asyncio.run(launcher.launch(w, cp, trial_key=f"job{job_id}-trial3"))
    assert not failed.ok and failed.category_hint == FailureCategory.INVALID_CONFIG
    diagnosis = RulesFailureAnalysis().diagnose(FailureInput(workload=w, strategy=cp, log=failed.log[-4000:],
                                                             attempts=1, iteration=3))
    assert diagnosis.category == FailureCategory.INVALID_CONFIG
    assert diagnosis.params == ["context_parallel_size"] and "Transformer Engine" in diagnosis.log_excerpt
    assert_no_leftovers(tmp_path)


def test_wall_clock_limit_kills_the_whole_tree(tmp_path: Path):
    """A run that keeps printing but never ends; one worker ignores SIGTERM and one started a
    process in a session of its own: all gone after the kill."""
    launcher = lm_launcher(tmp_path, "--fake-forever", "--fake-ignore-sigterm", "--fake-spawn-orphan",
                           timeout_s=6, hang_s=60, kill_grace_s=1.0)
    t0 = time.monotonic()
    result = asyncio.run(launcher.launch(tiny(), strategy_from_mapping({}), trial_key="timeout"))
    assert time.monotonic() - t0 < 30
    assert not result.ok and result.category_hint == FailureCategory.HANG
    assert "wall-clock limit of 6 s" in result.log.splitlines()[0]
    assert_no_leftovers(tmp_path)


def test_no_output_for_hang_s_is_a_hang(tmp_path: Path):
    launcher = lm_launcher(tmp_path, "--fake-hang-after", "2", timeout_s=120, hang_s=8, kill_grace_s=2.0)
    result = asyncio.run(launcher.launch(tiny(), strategy_from_mapping({}), trial_key="hang"))
    assert not result.ok and result.category_hint == FailureCategory.HANG
    assert "no output for 8 s" in result.log.splitlines()[0]
    assert "iteration        2/" in result.log  # what it printed before it hung
    assert_no_leftovers(tmp_path)


def test_cancel_stops_the_run_before_cancelled_error(tmp_path: Path):
    launcher = lm_launcher(tmp_path, "--fake-forever", "--fake-spawn-orphan", timeout_s=120, hang_s=60,
                           kill_grace_s=2.0)

    async def main() -> None:
        seen = asyncio.Event()
        task = asyncio.create_task(launcher.launch(tiny(), strategy_from_mapping({}), trial_key="cancel",
                                                   progress=lambda line: "still training" in line and seen.set()))
        await asyncio.wait_for(seen.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the contract: nothing is left once CancelledError has propagated
        assert trial_processes(tmp_path) == []

    asyncio.run(main())
    assert_no_leftovers(tmp_path)


def test_training_processes_never_see_our_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The worker holds an LLM key, a database password and a WANDB key; the training processes get the
    allowlist, the spec's env (a *** value filled from the worker) and pass_env — never OPTICO_* secrets.
    A script that prints its environment leaks nothing into what the pool stores."""
    from optico.redact import clip

    key, password = "sk-worker-llm-key-0123456789", "pg-pass-abcdef"
    monkeypatch.setenv("OPTICO_LLM_API_KEY", key)
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"postgresql://optico:{password}@db/optico")
    monkeypatch.setenv("OPTICO_SERVICE_TOKEN", "optico_w_service-token-value-xyz")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-from-worker-42")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-fallback-key-987654321")
    monkeypatch.setenv("UNRELATED_VAR", "not-allowlisted")
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    program = MegatronLMProgram(kind="megatron-lm",
                                command=fake_command("--fake-record", "{run_dir}", "--fake-print-env"),
                                train_iters=4, warmup_iters=1)
    launcher = LocalLauncher(program, run_dir=tmp_path / "runs", timeout_s=120, hang_s=60,
                             env={"OMP_NUM_THREADS": "1", "WANDB_API_KEY": "***", "MY_FLAG": "on",
                                  # refused at spec load; a job stored before that is held to it here
                                  "OPTICO_LLM_API_KEY": "***", "OPENAI_API_KEY": "***"},
                             pass_env=["HF_TOKEN_PATH", "OPENAI_API_KEY", "OPTICO_SERVICE_TOKEN"])
    monkeypatch.setenv("HF_TOKEN_PATH", "/secrets/hf")
    w = tiny(gpu="h100-sxm", gbs=4)
    result = asyncio.run(launcher.launch(w, strategy_from_mapping({"tp": 1}), trial_key="job1-trial1"))
    assert result.ok, result.log
    env = json.loads((Path(result.log_path).parent / "env-rank0.json").read_text())
    assert not [k for k in env if k.startswith("OPTICO_") and k not in ("OPTICO_RUN_TOKEN", "OPTICO_RUN_OWNER")
                and not k.startswith("OPTICO_BENCH_")]
    assert key not in json.dumps(env) and password not in json.dumps(env) and "OPENAI_API_KEY" not in env
    assert "UNRELATED_VAR" not in env and env["NCCL_DEBUG"] == "WARN" and env["MY_FLAG"] == "on"
    assert env["WANDB_API_KEY"] == "wandb-from-worker-42" and env["HF_TOKEN_PATH"] == "/secrets/hf"
    assert "RANK" in env and "PATH" in env  # what torchrun and Python need still passes
    stored = clip(result.log, 4000, tail=True)
    assert key not in stored and "optico_w_service-token-value-xyz" not in stored
    assert "wandb-from-worker-42" not in stored  # a secret the trial needs is still redacted from its log

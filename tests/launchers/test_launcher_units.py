"""Fast checks without processes: the Megatron-LM flag rendering and log parsing, the launcher
spec, program rendering, and the failure logs the failure-analysis rules read."""

from __future__ import annotations

import json

import pytest

from optico.agent_contracts import FailureInput
from optico.agents.failure import RulesFailureAnalysis, first_error
from optico.launchers.factory import build_launcher
from optico.launchers.megatron_lm import flag_values, measured, parse_iteration, parse_log, parse_memory, render_args
from optico.launchers.program import MegatronCoreProgram, MegatronLMProgram, node_layout, prepare
from optico.launchers.results import OutputCollector, RunEnd, driver_result, megatron_lm_result, port_was_taken
from optico.spec import LauncherSpec, SpecError, parse_spec
from optico.strategy import strategy_from_mapping
from optico.trial import FailureCategory
from tests.launchers.conftest import fake_command, tiny

# -- Megatron-LM flags -------------------------------------------------------------------------

RENDER = dict(train_iters=20, log_interval=1, skip_eval=True, drop_flags=["--save", "--load"], vpp_flag="stages")


def test_strategy_flags_replace_the_users_in_both_spellings():
    w = tiny(gbs=8)
    s = strategy_from_mapping({"tp": 2, "pp": 1, "mbs": 2, "recompute": "full", "recompute_method": "block",
                               "recompute_num_layers": 2, "use_distributed_optimizer": True,
                               "overlap_grad_reduce": True})
    argv = render_args(fake_command(), w, s, **RENDER)
    flags = flag_values(argv)
    # each owned flag once, with the strategy's value
    for flag, value in [("--tensor-model-parallel-size", "2"), ("--pipeline-model-parallel-size", "1"),
                        ("--micro-batch-size", "2"), ("--global-batch-size", "8"), ("--train-iters", "20"),
                        ("--log-interval", "1"), ("--eval-iters", "0"), ("--recompute-granularity", "full"),
                        ("--recompute-method", "block"), ("--recompute-num-layers", "2")]:
        assert sum(1 for a in argv if a.split("=")[0] == flag) == 1, (flag, argv)
        assert flags[flag] == [value], (flag, flags[flag])
    assert "--pipeline-model-parallel-size=2" not in argv
    assert "--sequence-parallel" not in argv  # theirs, but this strategy has SP off
    assert "--use-distributed-optimizer" in argv and "--overlap-grad-reduce" in argv
    assert "--log-throughput" in argv
    assert "--save" not in argv and "--load" not in argv and "/checkpoints/mine" not in argv
    # their model, data and tokenizer stay
    for kept in ("--data-path", "/data/my-corpus_text_document", "--tokenizer-type", "--split", "949,50,1", "--bf16"):
        assert kept in argv
    assert flags["--lr"] == ["3e-4"]


def test_sample_based_commands_get_a_sample_count_and_vpp_old_spelling():
    w = tiny(gbs=8)
    cmd = [a for a in fake_command() if a not in ("--train-iters", "500000")] + ["--train-samples", "999999"]
    s = strategy_from_mapping({"pp": 2, "vpp": 2})
    argv = render_args(cmd, w, s, **{**RENDER, "vpp_flag": "layers"})
    flags = flag_values(argv)
    assert flags["--train-samples"] == [str(20 * 8)] and "--train-iters" not in flags
    assert flags["--num-layers-per-virtual-pipeline-stage"] == ["1"]  # 4 layers / (PP2 x VPP2)
    assert "--num-virtual-stages-per-pipeline-rank" not in flags


def test_commands_that_disagree_with_the_workload_or_run_torchrun_are_refused():
    w = tiny()
    s = strategy_from_mapping({})
    with pytest.raises(ValueError, match="--seq-length 4096 disagrees with the workload"):
        render_args(fake_command("--seq-length", "4096"), w, s, **RENDER)
    with pytest.raises(ValueError, match="without torchrun"):
        render_args(["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py"], w, s, **RENDER)


def test_the_fused_loss_kernel_is_the_workloads():
    """Its memory differs by kernel, so the command runs the one the model priced: Megatron-LM's
    default (native) needs no flag, the te kernel is stated, a command saying otherwise is refused."""
    native, s = tiny(), strategy_from_mapping({"cross_entropy_loss_fusion": True})
    te = native.model_copy(update={"cross_entropy_fusion_impl": "te"})
    assert "--cross-entropy-fusion-impl" not in render_args(fake_command(), native, s, **RENDER)
    assert flag_values(render_args(fake_command(), te, s, **RENDER))["--cross-entropy-fusion-impl"] == ["te"]
    stated = render_args(fake_command("--cross-entropy-fusion-impl", "te"), te, s, **RENDER)
    assert flag_values(stated)["--cross-entropy-fusion-impl"] == ["te"]
    with pytest.raises(ValueError, match="--cross-entropy-fusion-impl te disagrees with the workload \\(native\\)"):
        render_args(fake_command("--cross-entropy-fusion-impl", "te"), native, s, **RENDER)


# -- Megatron-LM log lines ----------------------------------------------------------------------

ITERATION = (" [2025-03-01 10:00:00.123456] iteration        7/      20 | consumed samples:          448 | "
             "elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 401.2 | "
             "learning rate: 2.999990E-04 | global batch size:    64 | lm loss: 8.123456E+00 | "
             "loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
             "number of nan iterations:   0 |")
MEMORY = ("[Rank 3] (after 1 iterations) memory (MB) | allocated: 20480.5 | max allocated: 30720.0 | "
          "reserved: 35840.0 | max reserved: 40960.0")


def test_iteration_line_with_prefixes_extra_fields_and_no_throughput():
    it = parse_iteration("[default7]:" + ITERATION)
    assert (it.iteration, it.train_iters, it.global_batch_size) == (7, 20, 64)
    assert it.step_time_s == pytest.approx(0.8123) and it.tflops_per_gpu == pytest.approx(401.2)
    assert it.loss == pytest.approx(8.123456) and it.skipped == 0
    newer = ITERATION.replace("| learning rate:", "| mtp_1 loss: 3.0 | load_balancing_loss: 1.0E-02 | learning rate:")
    assert parse_iteration(newer).tflops_per_gpu == pytest.approx(401.2)
    older = ITERATION.replace(" throughput per GPU (TFLOP/s/GPU): 401.2 |", "")
    assert parse_iteration(older).tflops_per_gpu is None and parse_iteration(older).step_time_s == pytest.approx(0.8123)
    assert parse_iteration("iteration 5 of the warm-up") is None


def test_memory_line_and_measured_metrics():
    mem = parse_memory(MEMORY)
    assert (mem.rank, mem.after, mem.max_allocated_mb, mem.max_reserved_mb) == (3, 1, 30720.0, 40960.0)
    w = tiny(gpu="h100-sxm", gbs=64, gpus_per_node=8)
    lines = [ITERATION.replace("iteration        7/", f"iteration {i:8d}/").replace("812.3", str(ms))
             for i, ms in [(1, 5000.0), (2, 900.0), (3, 800.0), (4, 820.0)]]
    skipped = lines[-1].replace("iteration        4/", "iteration        5/").replace(
        "skipped iterations:   0", "skipped iterations:   1").replace("820.0", "100.0")
    log = parse_log([*lines, skipped, MEMORY, MEMORY.replace("[Rank 3]", "[Rank 0]").replace("40960.0", "20480.0")])
    m = measured(log, w, warmup_iters=2)
    assert m["timed_iterations"] == [3, 4]  # warm-up and the skipped iteration are not timed
    assert m["step_time_s"] == pytest.approx(0.81)
    assert m["tokens_per_s_per_gpu"] == pytest.approx(64 * 64 / 0.81 / 8)
    assert m["mem_max_gib"] == pytest.approx(40.0) and m["mem_avg_gib"] == pytest.approx(30.0)


# -- spec, factory, programs ----------------------------------------------------------------------

SPEC = {
    "workload": {"model": "tiny-gpt", "seq_length": 64, "global_batch_size": 4,
                 "cluster": {"gpu": "cpu", "gpus_per_node": 2}},
    "search_space": {"tunables": ["tp"]},
}


def test_launcher_spec_programs_and_factory():
    spec = parse_spec({**SPEC, "launcher": {"kind": "local", "timeout_s": 60, "hang_s": 30, "run_dir": "/tmp/x",
                                            "program": {"kind": "megatron-lm", "command": ["pretrain_gpt.py"]}}})
    assert isinstance(spec.launcher.program, MegatronLMProgram)
    launcher = build_launcher(spec.launcher)
    assert launcher.kind == "local" and launcher.timeout_s == 60 and launcher.hang_s == 30
    ray_spec = LauncherSpec(kind="ray", address="auto", runtime_env={"env_vars": {"A": "1"}}, max_infra_retries=1)
    ray_launcher = build_launcher(ray_spec)
    assert ray_launcher.kind == "ray" and ray_launcher.runtime_env == {"env_vars": {"A": "1"}}
    assert isinstance(ray_launcher.program, MegatronCoreProgram)  # the default program
    with pytest.raises(SpecError, match="launcher.program"):
        parse_spec({**SPEC, "launcher": {"kind": "local", "program": {"kind": "nemo"}}})
    with pytest.raises(SpecError, match="launcher.program"):
        parse_spec({**SPEC, "launcher": {"kind": "local", "program": {"kind": "megatron-lm"}}})


def test_program_commands_per_node():
    w = tiny(gpus_per_node=2, nodes=2)
    assert node_layout(w) == (2, 2)
    run = prepare(MegatronCoreProgram(warmup=1), w, strategy_from_mapping({"tp": 2}))
    spec = json.loads(run.files["bench-spec.json"])
    assert spec["strategy"]["tensor_model_parallel_size"] == 2 and spec["warmup"] == 1
    cmd = run.command("/runs/t1", node_rank=1, master_addr="10.0.0.1", master_port=29400, python="py")
    assert cmd[:3] == ["py", "-m", "torch.distributed.run"]
    assert "--nnodes=2" in cmd and "--node-rank=1" in cmd and "--master-addr=10.0.0.1" in cmd
    assert cmd[-2:] == ["--spec-json", "/runs/t1/bench-spec.json"]
    lm = prepare(MegatronLMProgram(kind="megatron-lm", command=fake_command("--fake-record", "{run_dir}")), tiny(),
                 strategy_from_mapping({}))
    cmd = lm.command("/runs/t2")
    assert "--standalone" in cmd and "--nproc-per-node=2" in cmd and cmd[cmd.index("--fake-record") + 1] == "/runs/t2"


# -- failure logs as failure analysis reads them ---------------------------------------------------

def _collector(lines: list[str]) -> OutputCollector:
    c = OutputCollector()
    for line in lines:
        c.add(line)
    return c


def _error(category: str, etype: str, message: str, rank: int = 1) -> str:
    return "OPTICO_ERROR " + json.dumps({"category": category, "message": message, "exception_type": etype,
                                         "rank": rank, "phase": "train", "params": [],
                                         "traceback_tail": f"Traceback (most recent call last):\n{etype}: {message}"})


def _diagnose(result, strategy):
    return RulesFailureAnalysis().diagnose(FailureInput(
        workload=tiny(), strategy=strategy, log=result.log[-4000:], category_hint=result.category_hint,
        attempts=1, iteration=2))


@pytest.mark.parametrize("category, etype, message, expected", [
    ("oom", "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 20.00 GiB", FailureCategory.OOM),
    ("invalid_config", "builtins.AssertionError", "num_layers (3) must be divisible by PP (2)",
     FailureCategory.INVALID_CONFIG),
    # megatron-core states some checks as RuntimeError: the driver knows, the text rules do not
    ("invalid_config", "builtins.RuntimeError", "the number of microbatches should range over the stages",
     FailureCategory.INVALID_CONFIG),
    ("comm", "torch.distributed.DistBackendError", "NCCL error: remote process exited",
     FailureCategory.INFRASTRUCTURE),
    ("comm", "torch.distributed.DistBackendError", "Watchdog caught collective operation timeout",
     FailureCategory.COMM_TIMEOUT),
])
def test_driver_errors_reach_failure_analysis(category, etype, message, expected):
    noise = ["W1122 torch/distributed/elastic/multiprocessing/api.py: Sending process 12 closing signal SIGTERM"] * 50
    # the peer's consequence first, the root cause next, torchrun's summary last
    peer = [] if category == "comm" else [_error("comm", "builtins.RuntimeError", "Connection closed by peer", rank=0)]
    lines = [*peer, _error(category, etype, message), *noise,
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    s = strategy_from_mapping({"mbs": 2})
    result = driver_result(_collector(lines), RunEnd(exit_code=1, duration_s=9.0), tiny(), gpu_seconds=18.0,
                           fingerprint={}, log_path="/runs/x/stdout.log")
    assert not result.ok and result.exit_code == 1 and len(result.log) <= 4000
    assert result.log.splitlines()[0].startswith(etype.rsplit(".", 1)[-1] + ": " + message)
    assert _diagnose(result, s).category == expected


def test_megatron_lm_traceback_root_cause_and_killed_runs():
    lines = ["[rank0]: Traceback (most recent call last):",
             '[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 291, in <module>',
             "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total "
             "capacity of 79.10 GiB of which 0.31 GiB is free.",
             "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
             *["some output"] * 200,
             "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    result = megatron_lm_result(_collector(lines), RunEnd(exit_code=1, duration_s=30.0), tiny(), warmup_iters=3, tp=1,
                                gpu_seconds=60.0, fingerprint={}, log_path=None)
    assert first_error(result.log)[0] == FailureCategory.OOM
    diagnosis = _diagnose(result, strategy_from_mapping({"mbs": 2}))
    assert diagnosis.category == FailureCategory.OOM and "micro_batch_size" in diagnosis.params
    hung = megatron_lm_result(_collector(["iteration 1/20 | elapsed time per iteration (ms): 1.0 |"]),
                              RunEnd(exit_code=-15, duration_s=30.0, killed="hang", detail="20 s"), tiny(),
                              warmup_iters=3, tp=1, gpu_seconds=60.0, fingerprint={}, log_path=None)
    assert hung.category_hint == FailureCategory.HANG and "no output for 20 s" in hung.log
    assert _diagnose(hung, strategy_from_mapping({})).retry


def test_torchrun_failing_to_bind_its_rendezvous_is_infrastructure():
    lines = ["Traceback (most recent call last):",
             "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use"]
    end = RunEnd(exit_code=1, duration_s=3.0)
    result = driver_result(_collector(lines), end, tiny(), gpu_seconds=6.0, fingerprint={}, log_path=None)
    assert result.category_hint == FailureCategory.INFRASTRUCTURE
    assert _diagnose(result, strategy_from_mapping({})).retry
    # the same under the user's Megatron-LM command (it had no hint: a configuration's failure to the agents)
    user_run = megatron_lm_result(_collector(lines), end, tiny(), warmup_iters=3, tp=1, gpu_seconds=6.0,
                                  fingerprint={}, log_path=None)
    assert user_run.category_hint == FailureCategory.INFRASTRUCTURE


def test_a_master_port_taken_is_told_apart_by_its_number():
    """The Ray launcher re-runs an attempt whose own master port was taken (tests/launchers/test_ray_launcher.py)."""
    new_torch = ["torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                 "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"]
    old_torch = ["[node1] RuntimeError: The server socket has failed to listen on any local network address. The "
                 "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use)."]
    for lines in (new_torch, old_torch):
        assert port_was_taken(_collector(lines), 29500)
        assert not port_was_taken(_collector(lines), 2950) and not port_was_taken(_collector(lines), 29501)
    assert not port_was_taken(_collector(["RuntimeError: NCCL error on port 29500: unhandled system error"]), 29500)


def test_a_simulated_trial_longer_than_the_spec_s_limits_is_killed_at_the_first_as_a_hang():
    """`launcher: {kind: sim, trial_seconds: 120, timeout_s: 5}` waited 120 s: the limits were ignored."""
    import asyncio
    import time

    from optico.strategy import Strategy
    from optico.workload import PRESETS, Cluster, Workload

    workload = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=64, precision="bf16",
                        cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=1))
    launcher = build_launcher(LauncherSpec(kind="sim", trial_seconds=60, timeout_s=0.5, hang_s=0.3, hang_rate=0.0))
    start = time.monotonic()
    result = asyncio.run(launcher.launch(workload, Strategy(tensor_model_parallel_size=2), trial_key="t1"))
    assert time.monotonic() - start < 5 and not result.ok and result.category_hint is FailureCategory.HANG
    assert "no output of 0.3 s reached" in result.log


@pytest.mark.parametrize("limits, killed_at, says", [
    ({}, 600.0, None),  # the spec's defaults (hang_s 600, timeout_s 3600): NCCL's watchdog or the hang limit
    ({"hang_s": 30}, 30.0, "no output for 30 s: run killed (hang)"),
    ({"hang_s": 300, "timeout_s": 150}, 60.0, "wall-clock limit of 150 s reached (hang)"),
])
def test_a_simulated_hang_is_killed_at_the_spec_s_limits(limits: dict, killed_at: float, says: str | None):
    """A simulated hang cost 600 s of every GPU whatever `hang_s` and `timeout_s` said (spec.md: they hold
    for every launcher), so a few hangs spent a `gpu_hours` budget meant for many trials."""
    import asyncio

    from optico.launchers.sim import STARTUP_S
    from optico.strategy import Strategy
    from optico.workload import PRESETS, Cluster, Workload

    workload = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=64, precision="bf16",
                        cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=1))
    launcher = build_launcher(LauncherSpec(kind="sim", hang_rate=1.0, **limits))
    fits = Strategy(tensor_model_parallel_size=2, use_distributed_optimizer=True)
    results = [asyncio.run(launcher.launch(workload, fits, trial_key=f"t{i}")) for i in range(6)]
    for result in results:
        assert not result.ok and result.duration_s == STARTUP_S + killed_at
        assert result.gpu_seconds == (STARTUP_S + killed_at) * workload.world_size
        if says is not None:
            assert says in result.log and result.category_hint is FailureCategory.HANG


def test_a_simulated_run_slower_than_the_wall_clock_limit_is_killed_there():
    """spec.md: `timeout_s` holds for every launcher. The sim applied it to hangs only: runs whose 13
    simulated steps took 1,755 s succeeded under `timeout_s: 100`."""
    import asyncio

    from optico.strategy import Strategy
    from optico.workload import PRESETS, Cluster, Workload

    workload = Workload(model=PRESETS["llama3-8b"], seq_length=4096, global_batch_size=512, precision="bf16",
                        cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=1))
    fits = Strategy(tensor_model_parallel_size=2, use_distributed_optimizer=True)
    ran = asyncio.run(build_launcher(LauncherSpec(kind="sim", hang_rate=0.0)).launch(workload, fits, trial_key="t"))
    assert ran.ok and ran.duration_s > 150
    limited = build_launcher(LauncherSpec(kind="sim", hang_rate=0.0, timeout_s=150))
    killed = asyncio.run(limited.launch(workload, fits, trial_key="t"))
    assert not killed.ok and killed.duration_s == 150 and killed.gpu_seconds == 150 * workload.world_size
    assert "wall-clock limit of 150 s reached" in killed.log and killed.category_hint is FailureCategory.HANG


def test_a_secret_looking_variable_passes_to_a_trial_only_when_asked_for_and_is_then_redacted():
    """`NCCL_PASSWORD`, `TORCH_API_KEY`, `CUDA_SECRET_TOKEN` passed on their prefix alone, unredacted."""
    from optico.launchers.trial_env import trial_env
    from optico.redact import redact

    worker = {"PATH": "/usr/bin", "NCCL_DEBUG": "WARN", "NCCL_PASSWORD": "nccl-pass-from-the-worker",
              "TORCH_API_KEY": "torch-key-from-the-worker", "CUDA_SECRET_TOKEN": "cuda-token-from-the-worker"}
    env = trial_env(base=worker)
    assert env == {"PATH": "/usr/bin", "NCCL_DEBUG": "WARN"}
    asked = trial_env({"TORCH_API_KEY": "***"}, pass_env=["NCCL_PASSWORD"], base=worker)
    assert asked["NCCL_PASSWORD"] == "nccl-pass-from-the-worker" and asked["TORCH_API_KEY"] == "torch-key-from-the-worker"
    assert "CUDA_SECRET_TOKEN" not in asked
    assert redact("log: nccl-pass-from-the-worker torch-key-from-the-worker") == "log: *** ***"


def test_the_ray_master_port_is_drawn_below_the_ephemeral_range():
    """Outgoing connections take ephemeral ports; the master port comes from below them (a port
    found free there cannot be handed to a connection before torchrun binds it)."""
    from optico.launchers.ray_launcher import PORT_SPAN, _ephemeral_low, _free_port

    low = _ephemeral_low()
    ports = {_free_port("127.0.0.1") for _ in range(20)}
    assert all(max(1024, low - PORT_SPAN) <= port < low for port in ports), (low, ports)
    assert len(ports) > 1  # drawn, not the same port every trial


def test_ray_without_an_address_and_no_cluster_is_checked_as_a_new_local_cluster(tmp_path, monkeypatch):
    """No address and no Ray cluster recorded on this machine: ray.init() starts one here, so this
    machine's checks apply before a job exists (they were skipped, and the job failed at its first
    launch). `auto` or no address with a recorded cluster that does not answer is refused too."""
    import yaml

    from optico.launchers.preflight import check_launch
    from tests.conftest import EXAMPLES

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    data = yaml.safe_load((EXAMPLES / "tiny-gpt-cpu.yaml").read_text())
    data["launcher"].update(kind="ray", address=None, ray_init={"num_cpus": 2, "_temp_dir": str(tmp_path)})
    with pytest.raises(SpecError) as refused:
        check_launch(parse_spec(data))
    assert refused.value.field == "launcher.ray_init.num_gpus"  # a CPU workload on a local cluster: declare GPUs
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # recorded, dead
    for address in (None, "auto"):
        data["launcher"].update(address=address, ray_init={"num_cpus": 2, "num_gpus": 2, "_temp_dir": str(tmp_path)})
        with pytest.raises(SpecError, match="no Ray cluster answers at 127.0.0.1:1") as refused:
            check_launch(parse_spec(data))
        assert refused.value.field == "launcher.address"


def test_ray_init_resources_for_a_running_cluster_are_refused_before_a_job_exists(tmp_path):
    """Connecting to a running cluster, ray.init() refuses num_cpus/num_gpus: the spec passed the checks,
    the job was written, and it failed at its first launch."""
    import socket

    import yaml

    from optico.launchers.preflight import check_launch
    from tests.conftest import EXAMPLES

    listener = socket.create_server(("127.0.0.1", 0))  # something answers at the address, as a head would
    try:
        data = yaml.safe_load((EXAMPLES / "tiny-gpt-cpu.yaml").read_text())
        data["launcher"].update(kind="ray", address=f"127.0.0.1:{listener.getsockname()[1]}",
                                ray_init={"num_cpus": 2, "num_gpus": 2})
        with pytest.raises(SpecError, match="connects to a running one") as refused:
            check_launch(parse_spec(data))
        assert refused.value.field == "launcher.ray_init.num_cpus"
        data["launcher"]["ray_init"] = {}
        check_launch(parse_spec(data))  # without them, the same spec passes
    finally:
        listener.close()


def test_a_line_longer_than_the_pipe_limit_is_read_in_pieces_not_thrown_away(tmp_path):
    """A 3 MB line (a tensor printed into an exception) was dropped whole by readline's overrun: the
    error text in it, and everything it held, never reached the log or the parsers."""
    import asyncio
    import sys

    from optico.launchers.proc import ProcessRun

    script = "import sys; sys.stdout.write('L' * 3_000_000 + ' CUDA out of memory\\nTAIL\\n')"
    seen: list[str] = []
    run = ProcessRun([sys.executable, "-c", script], env={"PATH": "/usr/bin:/bin"}, cwd=None, run_dir=tmp_path,
                     token="t", sink=lambda _stream, line: seen.append(line))

    async def go() -> int | None:
        await run.start()
        return await run.wait(60)

    assert asyncio.run(go()) == 0
    text = "".join(seen[:-1])
    assert text.count("L") == 3_000_000 and text.endswith(" CUDA out of memory") and seen[-1] == "TAIL"


def test_a_run_whose_launcher_died_is_killed_when_the_next_run_starts(tmp_path):
    """A worker or Ray actor SIGKILLed mid-trial left its run holding the GPUs (here: a run that ignores
    the SIGTERM its parent's death sends), and the trial's re-run met it there. A run whose launcher
    is alive is left alone."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    from optico.launchers.proc import ProcessRun, processes_with_token

    sleeper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"

    def run(token: str, where: str) -> ProcessRun:
        return ProcessRun([sys.executable, "-c", sleeper], env={"PATH": "/usr/bin:/bin"}, cwd=None,
                          run_dir=tmp_path / where, token=token)

    orphan_token, live_token, next_token = (f"reap-{uuid.uuid4().hex[:8]}-{n}" for n in range(3))
    launcher = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys\nfrom pathlib import Path\nfrom optico.launchers.proc import ProcessRun\n"
        "async def go():\n"
        f"    run = ProcessRun([sys.executable, '-c', {sleeper!r}], env={{'PATH': '/usr/bin:/bin'}}, cwd=None,\n"
        f"                     run_dir=Path({str(tmp_path / 'orphan')!r}), token={orphan_token!r})\n"
        "    await run.start()\n    print('started', flush=True)\n    await asyncio.sleep(120)\n"
        "asyncio.run(go())\n")], stdout=subprocess.PIPE, text=True)

    async def scenario() -> None:
        live, fresh = run(live_token, "live"), run(next_token, "next")
        try:
            assert launcher.stdout.readline().strip() == "started"
            said = tmp_path / "orphan" / "stdout.log"
            deadline = time.monotonic() + 30
            while not (said.exists() and "up" in said.read_text()) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # until it ignores SIGTERM
            await live.start()
            assert processes_with_token(orphan_token)  # its launcher alive: this start left it be
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(10)
            # Orphaned: it ignores the SIGTERM its parent's death sent. (Another test's start may reap it
            # first: what is asserted is that none is left once this start has run.)
            await fresh.start()
            deadline = time.monotonic() + 5
            while processes_with_token(orphan_token) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert processes_with_token(orphan_token) == []
            assert processes_with_token(live_token) and processes_with_token(next_token)
        finally:
            launcher.kill()
            for started in (live, fresh):
                await started.kill(grace_s=1)
            for token in (orphan_token, live_token, next_token):
                for pid in processes_with_token(token):
                    os.kill(pid, signal.SIGKILL)

    asyncio.run(scenario())


def test_an_owner_that_is_no_owner_is_never_taken_for_gone(tmp_path):
    """A trial sets its children's environment: an OPTICO_RUN_OWNER that is not `pid:start:namespace`
    raised out of every later start on the machine (every trial failed until that process ended)."""
    import signal
    import subprocess
    import time
    import uuid

    from optico.launchers.proc import TOKEN_ENV, _owner_gone, _pid_namespace, processes_with_token, reap_orphaned_runs

    namespace = _pid_namespace()
    for owner in ("", "garbage", "1:2", "\u00b9:2:" + str(namespace), "x:y:" + str(namespace), "99999999999:1:ns"):
        assert not _owner_gone(owner, str(namespace)), owner
    token = f"odd-{uuid.uuid4().hex[:8]}"
    odd = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", TOKEN_ENV: token, "OPTICO_RUN_OWNER": "garbage"})
    try:
        deadline = time.monotonic() + 10
        while not processes_with_token(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert odd.pid not in reap_orphaned_runs() and processes_with_token(token) == [odd.pid]
    finally:
        odd.send_signal(signal.SIGKILL)
        odd.wait(10)

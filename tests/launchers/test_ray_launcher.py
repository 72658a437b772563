"""The Ray launcher for real, on a two-node Ray cluster started on this machine (a head with
2 logical GPUs, a worker with 1): placement groups, one actor per node, torchrun with the
rank-0 actor as master.

- real megatron-core training on CPU: PP2 with VPP on one node with 2 GPUs; MoE with EP2 over
  two nodes of 1 GPU each (torchrun --nnodes 2); recorded in the pool;
- a placement group the cluster cannot satisfy fails after its timeout with "cluster lacks";
- an actor killed mid-run, or a master port taken before torchrun binds it, is an infrastructure
  fault: the trial is re-run and succeeds;
- wall-clock limit and cancel leave no actor, placement group or process behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from optico.launchers.program import MegatronCoreProgram, MegatronLMProgram
from optico.strategy import strategy_from_mapping
from optico.trial import FailureCategory, TrialStatus
from tests.launchers.conftest import (
    CPU_ENV,
    HAVE_MEGATRON,
    HAVE_RAY,
    HAVE_TORCH,
    STEPS,
    assert_no_leftovers,
    fake_command,
    ray_leftovers,
    record,
    tiny,
)

pytestmark = [pytest.mark.ray, pytest.mark.skipif(not (HAVE_RAY and HAVE_TORCH), reason="ray and torch are needed")]


def launcher(tmp_path: Path, program=None, **kw):
    from optico.launchers.ray_launcher import RayLauncher

    kw.setdefault("timeout_s", 300)
    kw.setdefault("hang_s", 120)
    return RayLauncher(program or MegatronCoreProgram(**STEPS), run_dir=str(tmp_path / "runs"), env=CPU_ENV,
                       placement_timeout_s=kw.pop("placement_timeout_s", 60), retry_wait_s=0.5, **kw)


def fake(*extra: str) -> MegatronLMProgram:
    return MegatronLMProgram(kind="megatron-lm", command=fake_command(*extra), train_iters=8)


def assert_clean(tmp_path: Path) -> None:
    actors, groups = ray_leftovers()
    assert not actors and not groups, (actors, groups)
    assert_no_leftovers(tmp_path)


@pytest.mark.megatron
@pytest.mark.skipif(not HAVE_MEGATRON, reason="torch and megatron-core are needed")
def test_real_training_on_one_and_two_nodes(ray_cluster, tmp_path: Path, pool):
    store, job_id = pool
    ray_launcher = launcher(tmp_path)
    runs = [
        (tiny(gpus_per_node=2, nodes=1), {"pp": 2, "vpp": 2}),  # one node, 2 GPUs
        (tiny("tiny-moe", gpus_per_node=1, nodes=2), {"ep": 2, "moe_token_dispatcher_type": "alltoall"}),
    ]
    for index, (w, config) in enumerate(runs, start=1):
        s = strategy_from_mapping(config)
        result = asyncio.run(ray_launcher.launch(w, s, trial_key=f"job{job_id}-trial{index}"))
        assert result.ok, result.log
        trial = record(store, job_id, index, s, result)
        assert trial.status == TrialStatus.OK and trial.metrics.step_time_s > 0
        assert trial.metrics.mfu == pytest.approx(trial.metrics.tflops_per_gpu / 0.1)
        nodes = trial.fingerprint["nodes"]
        assert len(nodes) == w.cluster.nodes_used
        # one bundle per node (STRICT_SPREAD); Ray hands each actor its logical GPUs
        assert len({n["node_id"] for n in nodes}) == len(nodes)
        assert all(n["cuda_visible_devices"] for n in nodes)
        assert Path(trial.log_path).is_file() and "OPTICO_RESULT" in Path(trial.log_path).read_text()
    pp, moe = store.trials(job_id)
    assert pp.strategy.vpp == 2 and pp.fingerprint["driver"]["device"] == "cpu"
    assert moe.strategy.ep == 2 and "--nnodes=2" in (Path(moe.fingerprint["run_dir"]) / "command.txt").read_text()
    assert_clean(tmp_path)


def test_a_placement_group_that_cannot_be_satisfied_fails_after_its_timeout(ray_cluster, tmp_path: Path):
    t0 = time.monotonic()
    result = asyncio.run(launcher(tmp_path, fake(), placement_timeout_s=3).launch(
        tiny(gpus_per_node=2, nodes=2), strategy_from_mapping({}), trial_key="too-big"))
    assert time.monotonic() - t0 < 30
    assert not result.ok and result.category_hint == FailureCategory.INFRASTRUCTURE
    assert result.log.startswith("placement group failed: cluster lacks 2 GPUs"), result.log
    assert_clean(tmp_path)


def test_a_master_port_taken_before_torchrun_binds_it_is_rerun_on_another_port(ray_cluster, tmp_path: Path):
    """The rank-0 agent probes a free port and torchrun binds it a moment later; an outgoing
    connection may take it in between (seen in CI: EADDRINUSE at the rendezvous). That is the
    launcher's race, not the configuration's: the attempt is re-run with a fresh port."""
    marker = tmp_path / "port-taken"
    result = asyncio.run(launcher(tmp_path, fake("--fake-port-taken-once", str(marker)), max_infra_retries=1).launch(
        tiny(gpus_per_node=1, nodes=1, gpu="h100-sxm"), strategy_from_mapping({}), trial_key="port-taken"))
    assert marker.exists() and result.ok, result.log
    (lost,) = result.fingerprint["infra_faults"]
    assert "was taken before torchrun bound it" in lost and result.fingerprint["attempt"] == 2
    assert_clean(tmp_path)


def test_a_killed_actor_is_an_infrastructure_fault_and_the_trial_is_rerun(ray_cluster, tmp_path: Path):
    from ray.util.state import list_actors

    killed: list[int] = []

    def kill_once(line: str) -> None:
        if killed or "iteration" not in line:
            return
        alive = list_actors(filters=[("class_name", "=", "NodeAgent"), ("state", "=", "ALIVE")])
        killed.append(alive[0].pid)
        os.kill(alive[0].pid, signal.SIGKILL)  # the node agent dies under its torchrun

    w = tiny(gpus_per_node=1, nodes=2, gpu="h100-sxm")  # the stand-in prints an H100's throughput
    slow = MegatronLMProgram(kind="megatron-lm", command=fake_command(), train_iters=40)
    result = asyncio.run(launcher(tmp_path, slow, max_infra_retries=2).launch(
        w, strategy_from_mapping({}), trial_key="dead-actor", progress=kill_once))
    assert killed and result.ok, result.log
    assert len(result.fingerprint["infra_faults"]) == 1 and result.fingerprint["attempt"] == 2
    assert "ActorDiedError" in result.fingerprint["infra_faults"][0] or "RayActorError" in \
        result.fingerprint["infra_faults"][0]
    assert_clean(tmp_path)

    # never healthy: the bounded retries run out and the trial fails as infrastructure
    def kill_always(line: str) -> None:
        if "iteration" in line:
            for actor in list_actors(filters=[("class_name", "=", "NodeAgent"), ("state", "=", "ALIVE")]):
                try:
                    os.kill(actor.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    failed = asyncio.run(launcher(tmp_path, slow, max_infra_retries=1).launch(
        w, strategy_from_mapping({}), trial_key="dead-actor-again", progress=kill_always))
    assert not failed.ok and failed.category_hint == FailureCategory.INFRASTRUCTURE
    assert len(failed.fingerprint["infra_faults"]) == 2
    from optico.agents.failure import first_error

    assert first_error(failed.log)[0] == FailureCategory.INFRASTRUCTURE
    assert_clean(tmp_path)


def test_timeout_and_cancel_remove_actors_groups_and_processes(ray_cluster, tmp_path: Path):
    w = tiny(gpus_per_node=1, nodes=2)
    forever = fake("--fake-forever", "--fake-ignore-sigterm")
    result = asyncio.run(launcher(tmp_path, forever, timeout_s=8, kill_grace_s=1.0).launch(
        w, strategy_from_mapping({}), trial_key="ray-timeout"))
    assert not result.ok and result.category_hint == FailureCategory.HANG
    assert "wall-clock limit of 8 s" in result.log.splitlines()[0]
    assert_clean(tmp_path)

    async def cancel() -> None:
        seen = asyncio.Event()
        task = asyncio.create_task(launcher(tmp_path, forever, kill_grace_s=1.0).launch(
            w, strategy_from_mapping({}), trial_key="ray-cancel",
            progress=lambda line: "still training" in line and seen.set()))
        await asyncio.wait_for(seen.wait(), 120)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert_clean(tmp_path)


def test_a_secret_a_node_passes_to_its_run_never_leaves_the_node_actor(ray_cluster, tmp_path: Path):
    """`pass_env: [WANDB_API_KEY]` on a node that holds it: the run printed it, and the driver, which stores
    the log and never saw the value, stored it in clear (the local launcher masked it)."""
    value = "wandb-node-secret-0123456789abcdef"
    w = tiny(gpus_per_node=1, nodes=1, gpu="h100-sxm")
    printing = MegatronLMProgram(kind="megatron-lm", command=fake_command("--fake-print-env"), train_iters=8)
    result = asyncio.run(launcher(tmp_path, printing, pass_env=("WANDB_API_KEY",),
                                  runtime_env={"env_vars": {"WANDB_API_KEY": value}}).launch(
        w, strategy_from_mapping({}), trial_key="node-secret"))
    assert result.ok, result.log
    output = Path(result.log_path).read_text()  # the driver's copy of the whole output
    assert "WANDB_API_KEY=***" in output and value not in output and value not in result.log
    assert_clean(tmp_path)

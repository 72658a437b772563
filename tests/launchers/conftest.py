"""Fixtures of the launcher tests: tiny CPU workloads, the fake Megatron-LM program, a
leftover-process check, a two-node Ray cluster on this machine, and pool recording."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from optico.launchers.proc import processes_with_token
from optico.strategy import Strategy
from optico.trial import LaunchResult, TrialStatus
from optico.workload import PRESETS, Cluster, Workload

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_pretrain_gpt.py"
HAVE_MEGATRON = all(importlib.util.find_spec(m) is not None for m in ("torch", "megatron.core"))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_RAY = importlib.util.find_spec("ray") is not None
# Training processes of the real runs: one thread each, no warning noise.
CPU_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
STEPS = {"warmup": 1, "max_steps": 3, "min_steps": 2}


def tiny(model: str = "tiny-gpt", *, gpus_per_node: int = 2, nodes: int = 1, gbs: int = 4,
         gpu: str = "cpu") -> Workload:
    return Workload(model=PRESETS[model], seq_length=64, global_batch_size=gbs, precision="bf16",
                    cluster=Cluster(gpu=gpu, gpus_per_node=gpus_per_node, nodes=nodes))


def fake_command(*extra: str) -> list[str]:
    """The user's Megatron-LM command: their model, data and tokenizer flags, and their own
    (to be replaced) parallel layout, batch and checkpoint flags."""
    return [str(FAKE), "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "64", "--max-position-embeddings", "64", "--data-path", "/data/my-corpus_text_document",
            "--tokenizer-type", "GPT2BPETokenizer", "--split", "949,50,1", "--lr", "3e-4", "--bf16",
            "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size=2", "--micro-batch-size", "16",
            "--global-batch-size", "1024", "--train-iters", "500000", "--log-interval", "100",
            "--sequence-parallel", "--save", "/checkpoints/mine", "--load", "/checkpoints/mine",
            "--eval-iters", "100", *extra]


def trial_processes(root: Path) -> list[int]:
    """Live processes of any trial (every launcher marks its processes' environment) running in a
    directory under `root` (trials run in their run directory): other sessions' runs on this
    machine are not this test's."""
    found = []
    for pid in processes_with_token(None):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)):
            found.append(pid)
    return found


def assert_no_leftovers(root: Path, timeout_s: float = 5.0) -> None:
    """No process of a trial run under `root` is alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = trial_processes(root)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    details = []
    for pid in left:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:200]
            details.append(f"{pid}: {cmdline!r}")
        except OSError:
            pass
    assert not left, "processes left behind:\n" + "\n".join(details)


def record(store, job_id: int, index: int, strategy: Strategy, result: LaunchResult):
    """Records a launch in the pool as the loop's validate node does; returns the Trial."""
    trial = store.start_trial(job_id, index, strategy, "launcher test")
    return store.finish_trial(trial.id, status=TrialStatus.OK if result.ok else TrialStatus.FAILED,
                              metrics=result.metrics, gpu_seconds=result.gpu_seconds,
                              fingerprint=result.fingerprint, log_path=result.log_path,
                              log_excerpt=result.log[-4000:])


@pytest.fixture
def pool(tmp_path: Path):
    """(store, job id) of a fresh SQLite pool with one job on a tiny workload."""
    from optico.pool.store import SqlStore
    from optico.search_space import SearchSpace
    from optico.spec import JobSpec

    w = tiny()
    store = SqlStore(f"sqlite:///{tmp_path / 'pool.db'}")
    job_id = store.create_job(JobSpec(name="launcher-test", workload=w, search_space=SearchSpace.build(w, ["tp"])))
    yield store, job_id
    store.close()


@pytest.fixture(scope="module")
def ray_cluster():
    """A two-node Ray cluster on this machine, declaring logical GPUs: a head with 2 GPUs and
    2 CPUs, a worker with 1 GPU and 1 CPU. One per test module (Ray takes 15-25 s to start)."""
    if not HAVE_RAY:
        pytest.skip("ray is needed")
    import ray
    from ray.cluster_utils import Cluster as RayCluster

    tmp = tempfile.mkdtemp(prefix="optico-ray-", dir="/tmp")  # Ray's socket paths must stay short
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_TMPDIR", "HOME", "RAY_SCHEDULER_EVENTS")}
    # Ray 2.60 turns token auth on by default and writes to ~/.ray and /tmp/ray.
    os.environ.update({"RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": tmp, "HOME": tmp, "RAY_SCHEDULER_EVENTS": "0"})
    small = 80 * 1024 * 1024
    cluster = RayCluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2,
                                                               "object_store_memory": small})
    cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=small)
    ray.init(address=cluster.address, log_to_driver=False, namespace="optico-tests")
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def ray_leftovers() -> tuple[list, list]:
    """(alive actors, placement groups not removed) of the cluster, after a short settle."""
    from ray.util.state import list_actors, list_placement_groups

    deadline = time.monotonic() + 15
    while True:
        actors = [a for a in list_actors(filters=[("class_name", "=", "NodeAgent")], limit=1000)
                  if a.state != "DEAD"]
        groups = [g for g in list_placement_groups(limit=1000) if g.state != "REMOVED"]
        if (not actors and not groups) or time.monotonic() > deadline:
            return actors, groups
        time.sleep(0.5)

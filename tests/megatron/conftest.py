"""Runs the megatron-core benchmark driver for real, through torchrun, on CPU (gloo).

Each run is a tiny model (tiny-gpt / tiny-moe, seq 64) for 1 warm-up and at most 3 timed
steps, OMP_NUM_THREADS=1, at most 4 processes. Results are cached per configuration for the
session so that several tests can compare runs (TP1 vs TP2 losses) without re-running.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HAVE_STACK = all(importlib.util.find_spec(m) is not None for m in ("torch", "megatron.core"))
REPO = Path(__file__).resolve().parents[2]


@dataclass
class BenchRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    result: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        return (f"rc={self.returncode} wall={self.wall_s:.1f}s\n--- stdout ---\n{self.stdout[-4000:]}"
                f"\n--- stderr ---\n{self.stderr[-4000:]}")


def tiny_spec(nproc: int, strategy: dict[str, Any], *, model: Any = "tiny-gpt", gbs: int = 4,
              precision: str = "bf16", **top: Any) -> dict[str, Any]:
    spec = {
        "workload": {"model": model, "seq_length": 64, "global_batch_size": gbs, "precision": precision,
                     "cluster": {"gpu": "h100-sxm", "gpus_per_node": nproc}},
        "strategy": strategy,
        "warmup": 1, "max_steps": 3, "min_steps": 2, "seed": 1234,
    }
    spec.update(top)
    return spec


def run_bench(tmp_dir: Path, nproc: int, spec: dict[str, Any], *, env: dict[str, str] | None = None,
              timeout: float = 240) -> BenchRun:
    from optico.launchers.megatron.report import parse_output

    tmp_dir.mkdir(parents=True, exist_ok=True)
    path = tmp_dir / f"spec-{abs(hash(json.dumps(spec, sort_keys=True)))}.json"
    path.write_text(json.dumps(spec))
    full_env = dict(os.environ)
    full_env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO) + os.pathsep + full_env.get("PYTHONPATH", ""),
                     "PYTHONWARNINGS": "ignore"})
    full_env.pop("CUDA_VISIBLE_DEVICES", None)
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "optico.launchers.megatron.bench", "--spec-json", str(path)]
    for attempt in range(2):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=str(REPO), env=full_env, capture_output=True, text=True, timeout=timeout)
        run = BenchRun(proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - t0)
        parsed = parse_output(proc.stdout)
        run.result, run.errors, run.steps = parsed["result"], parsed["errors"], parsed["steps"]
        # torchrun itself failing to start (a rendezvous port taken between its probe and
        # its bind) leaves no line of ours: try once more; anything else is the driver's.
        if run.result is not None or run.errors or "OPTICO_" in proc.stdout:
            break
    return run


@pytest.fixture(scope="session")
def bench(tmp_path_factory):
    """bench(nproc, strategy, **spec options) -> BenchRun, cached per configuration."""
    if not HAVE_STACK:
        pytest.skip("torch and megatron-core are needed")
    cache: dict[str, BenchRun] = {}
    tmp = tmp_path_factory.mktemp("megatron-bench")

    def _run(nproc: int, strategy: dict[str, Any], *, env: dict[str, str] | None = None, **options: Any) -> BenchRun:
        spec = tiny_spec(nproc, strategy, **options)
        key = json.dumps([nproc, spec, env], sort_keys=True)
        if key not in cache:
            cache[key] = run_bench(tmp, nproc, spec, env=env)
        return cache[key]

    return _run

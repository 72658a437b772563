"""A tiny benchmark shared by the tests: two landscapes, two seeds, budget 6 (a few seconds)."""

from __future__ import annotations

from typing import Any

import pytest

from optico.bench.landscapes import PACKAGED_REPLAY, SimDef, replay_defs
from optico.bench.suite import run_benchmark
from optico.workload import PRESETS, Cluster, Workload

BUDGET, SEEDS = 6, 2
TUNERS = ("optico", "model-greedy", "random-fit", "tpe-warm")


def tiny_sim(effect_size: float = 0.0) -> SimDef:
    """Llama3-8B on 8 x A100 over a small space (TP, PP, MBS, recompute): ~40 configurations."""
    w = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=512, precision="fp16",
                 cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=1))
    return SimDef(name="tiny-llama3-8b-a100-8", preset="llama3-8b", workload=w,
                  tunables={"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "mbs": [1, 2], "recompute": [None, "full"]},
                  fixed={"use_distributed_optimizer": True}, effect_size=effect_size,
                  group="out-of-form" if effect_size else "self")


@pytest.fixture(scope="session")
def tiny_defs() -> list:
    return [tiny_sim(), *replay_defs(PACKAGED_REPLAY)]


@pytest.fixture(scope="session")
def tiny_doc(tiny_defs) -> dict[str, Any]:
    return run_benchmark(tiny_defs, TUNERS, budget=BUDGET, seeds=SEEDS, jobs=1, fidelity=False)

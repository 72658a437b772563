"""Every simulated example, over 10 seeds: started from the job's own start (the model's pick, not
the expert's baseline), the median run reaches the baseline's MFU within 10 trials, and at most 20 % of the
trials fail. The baseline's MFU is the simulator's noise-free answer for the expert configuration."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from optico.launchers.sim import SimLauncher
from optico.perfmodel.model import predict
from optico.pool.store import SqlStore
from optico.report import job_result
from optico.runner import run_job
from optico.spec import load_spec
from tests.conftest import EXAMPLES

SIMULATED = ["llama3-8b-a100.yaml", "gpt3-7b-a100-16.yaml", "qwen3-moe-a100.yaml", "llama3-70b-h100-64.yaml"]
SEEDS = range(10)


@pytest.mark.slow
@pytest.mark.parametrize("example", SIMULATED)
def test_example_reaches_the_expert_baseline(example: str, tmp_path: Path):
    spec = load_spec(EXAMPLES / example)
    assert spec.launcher.kind == "sim" and spec.baseline is not None
    expert_mfu = predict(spec.workload, spec.baseline, SimLauncher().constants).mfu
    reached, failed, total = [], 0, 0
    for seed in SEEDS:
        url = f"sqlite:///{tmp_path / f'pool{seed}.db'}"
        run = spec.model_copy(update={"seed": seed, "baseline": None})
        store = SqlStore(url)
        job_id = store.create_job(run)
        run_job(store, url, job_id)
        result = job_result(store, job_id)
        store.close()
        hit = next((t["index"] for t in result["trials"] if t["metrics"] and t["metrics"]["mfu"] >= expert_mfu),
                   run.budget.max_trials + 1)
        reached.append(hit)
        failed += result["failed_trials"]
        total += len(result["trials"])
    assert statistics.median(reached) <= 10, reached
    assert failed / total <= 0.20, (failed, total)


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_shipped_example_loads_and_has_a_configuration_to_try(example: str):
    """A user's first command is `optico tune examples/<one of these>`: each must load, name a
    search space with at least one valid configuration, and be predictable by the model."""
    from optico.candidates import valid_strategies

    spec = load_spec(EXAMPLES / example)
    first = next(iter(valid_strategies(spec.search_space, spec.workload)), None)
    assert first is not None, f"{example}: no valid configuration in its search space"
    assert predict(spec.workload, first).step_time_s > 0

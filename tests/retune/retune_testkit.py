"""Helpers shared by the retuning tests (a module name no other test folder will take)."""

from __future__ import annotations

from typing import Any

from optico.pool.store import SqlStore
from optico.retune.cron import next_fire
from optico.spec import JobSpec, parse_spec

UPGRADE_ENV = "OPTICO_SIM_FRAMEWORK_VERSION"


def sim_spec(name: str = "nightly", *, max_trials: int = 5, version: str | None = "24.10", **launcher: Any) -> dict:
    """A small sim workload (the service tests' one), on a simulated cluster running `version`."""
    return {
        "name": name, "seed": 0,
        "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "bf16",
                     "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
        "search_space": {"tunables": ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                                      "micro_batch_size", "recompute_granularity"]},
        "budget": {"max_trials": max_trials, "converge_tol": None},
        "launcher": {"kind": "sim", "hang_rate": 0.0, **({"framework_version": version} if version else {}),
                     **launcher},
    }


def add_schedule(store: SqlStore, name: str = "nightly", *, cron: str = "0 2 * * *", max_trials: int = 5,
                 spec: JobSpec | None = None, **kwargs: Any):
    spec = spec or parse_spec(sim_spec(name, max_trials=max_trials))
    return store.create_schedule(name, spec, cron=cron, next_fire_at=next_fire(cron, store.db_now()),
                                 max_trials=max_trials, **kwargs)

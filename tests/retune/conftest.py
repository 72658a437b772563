"""Fixtures for the retuning tests: every pool test runs on SQLite and on a real PostgreSQL.

The service tests reuse `service_testkit` (a real `optico serve` on a free port) from tests/service."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from optico.pool.store import SqlStore  # noqa: E402
from optico.retune.cron import next_fire  # noqa: E402
from optico.spec import JobSpec, parse_spec  # noqa: E402

BACKENDS = [pytest.param("sqlite", id="sqlite"),
            pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)]
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


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'pool.db'}"
    from pg_server import create_database

    return create_database(request.getfixturevalue("postgres_server_url"), f"optico_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    s = SqlStore(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def upgrade(monkeypatch: pytest.MonkeyPatch):
    """`upgrade("25.01")` upgrades the simulated cluster under everything running in this process."""
    def to(version: str) -> None:
        monkeypatch.setenv(UPGRADE_ENV, version)
    monkeypatch.delenv(UPGRADE_ENV, raising=False)
    return to

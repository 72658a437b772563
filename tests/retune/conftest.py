"""Fixtures for the retuning tests: every pool test runs on SQLite and on a real PostgreSQL.

The service tests reuse `service_testkit` (a real `optico serve` on a free port) from tests/service;
the helpers are in `retune_testkit` (`conftest` is a name every test folder has)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))

from retune_testkit import UPGRADE_ENV  # noqa: E402

from optico.pool.store import SqlStore  # noqa: E402

BACKENDS = [pytest.param("sqlite", id="sqlite"),
            pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)]


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

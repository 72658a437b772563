"""Fixtures for the pool's contract suite: every test runs on SQLite and on PostgreSQL.

PostgreSQL is real: `OPTICO_TEST_POSTGRES_URL` names a server to use (each test gets
its own database on it, so the role needs CREATEDB), else a throwaway server is started
from the local PostgreSQL binaries. Without binaries the PostgreSQL half is skipped —
unless `OPTICO_REQUIRE_POSTGRES=1` (CI), where that is a failure.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pool_testkit import make_spec

from optico.pool.store import SqlStore
from optico.spec import JobSpec

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """An empty database of the backend under test, no schema yet."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'pool.db'}"
    from pg_server import create_database

    server = request.getfixturevalue("postgres_server_url")
    return create_database(server, f"optico_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    s = SqlStore(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def spec_factory() -> Callable[..., JobSpec]:
    return make_spec

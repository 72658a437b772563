"""Shared fixtures: an isolated pool database per test, the example specs, the published data."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
# The published measurements (a copy of the shared data set, shipped in the repository).
SHARED_DATA = REPO / "benchmarks" / "data" / "published"
PACKAGED_OPTICO_CSV = REPO / "optico" / "data" / "optico_llama3_8b_a100.csv"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


@pytest.fixture
def cli_env(tmp_path: Path, db_url: str) -> dict[str, str]:
    """Environment for running `optico` in a subprocess against an isolated pool."""
    env = dict(os.environ)
    env["OPTICO_DATABASE_URL"] = db_url
    env["OPTICO_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "200")
    return env


def optico_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "optico.cli", *args]


def _unavailable(reason: str) -> None:
    if os.environ.get("OPTICO_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"OPTICO_REQUIRE_POSTGRES=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """A real PostgreSQL server for this test session: OPTICO_TEST_POSTGRES_URL, else a throwaway
    server started from the local binaries. Without binaries: skip, or fail when
    OPTICO_REQUIRE_POSTGRES=1 (CI)."""
    given = os.environ.get("OPTICO_TEST_POSTGRES_URL", "").strip()
    if given:
        yield given
        return
    try:
        from pg_server import find_pg_bin, start_postgres
    except ImportError as exc:  # psycopg missing
        _unavailable(f"cannot import the PostgreSQL driver: {exc}")
    if find_pg_bin() is None:
        _unavailable("no PostgreSQL server binaries found (apt-get install postgresql)")
    url, stop = start_postgres()
    try:
        yield url
    finally:
        stop()


@pytest.fixture
def postgres_db(postgres_server_url: str) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    import uuid

    from pg_server import create_database

    return create_database(postgres_server_url, f"optico_{uuid.uuid4().hex[:12]}")

"""The service tests run against a real `optico serve` process, on SQLite and on PostgreSQL.

`served` is one service per test module and backend (starting one costs seconds); tests that need
their own settings start their own with `make_service`."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from service_testkit import Service

from optico.pool.store import SqlStore

BACKENDS = [pytest.param("sqlite", id="sqlite"),
            pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres)]


def _database(backend: str, request: pytest.FixtureRequest, directory: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{directory / 'pool.db'}"
    from pg_server import create_database

    return create_database(request.getfixturevalue("postgres_server_url"), f"optico_{uuid.uuid4().hex[:12]}")


def _mint(db_url: str) -> dict[str, str]:
    with SqlStore(db_url) as store:
        return {scope: store.create_token(f"{scope}-{uuid.uuid4().hex[:6]}", scope)[1] for scope in ("write", "read")}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _database(backend, request, tmp_path)


@pytest.fixture
def tokens(db_url: str) -> dict[str, str]:
    """A write and a read token, minted in the pool the service will use."""
    return _mint(db_url)


@pytest.fixture
def make_service(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(*args: str, **env: str) -> Service:
        service = Service(db_url=db_url, home=tmp_path / f"home{len(started)}", extra_env=env, args=args)
        started.append(service)
        return service

    yield make
    for service in started:
        service.kill()


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[Service, dict[str, str]]]:
    """(a running `optico serve` with one worker, its write and read tokens), shared by a module."""
    directory = tmp_path_factory.mktemp(f"served-{request.param}")
    db = _database(str(request.param), request, directory)
    minted = _mint(db)
    service = Service(db_url=db, home=directory / "home").start()
    try:
        yield service, minted
    finally:
        service.kill()

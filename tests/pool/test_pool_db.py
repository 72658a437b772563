"""Where the pool lives and how engines are configured."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from optico.pool import db


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in (db.ENV_URL, db.ENV_HOME, "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_default_url_prefers_the_environment(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.ENV_URL, "postgresql://u@h/optico")
    monkeypatch.setenv(db.ENV_HOME, str(clean_env / "ignored"))
    assert db.default_database_url() == "postgresql://u@h/optico"
    assert not (clean_env / "ignored").exists()


def test_default_url_under_optico_home(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(db.ENV_HOME, str(clean_env / "oh"))
    monkeypatch.setenv("XDG_DATA_HOME", str(clean_env / "xdg"))
    assert db.default_database_url() == f"sqlite:///{clean_env / 'oh' / 'optico.db'}"
    assert (clean_env / "oh").is_dir()


def test_default_url_under_xdg_data_home(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(clean_env / "xdg"))
    assert db.default_database_url() == f"sqlite:///{clean_env / 'xdg' / 'optico' / 'optico.db'}"
    assert (clean_env / "xdg" / "optico").is_dir()


def test_default_url_under_home(clean_env: Path) -> None:
    expected = clean_env / "home" / ".local" / "share" / "optico"
    assert db.default_database_url() == f"sqlite:///{expected / 'optico.db'}"
    assert expected.is_dir()


@pytest.mark.parametrize("given", ["postgresql://u:pw@h:5433/d", "postgresql+psycopg://u:pw@h:5433/d",
                                   "postgres://u:pw@h:5433/d", "postgresql+psycopg2://u:pw@h:5433/d"])
def test_postgres_urls_normalise_to_psycopg(given: str) -> None:
    url = db.normalize_url(given)
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.password, url.host, url.port, url.database) == ("u", "pw", "h", 5433, "d")
    assert db.langgraph_url(given) == "postgresql://u:pw@h:5433/d"


def test_sqlite_langgraph_url_is_the_file_path(tmp_path: Path) -> None:
    assert db.langgraph_url(f"sqlite:///{tmp_path}/x.db") == f"{tmp_path}/x.db"
    assert db.langgraph_url("sqlite://") == ":memory:"


def test_unsupported_backend_is_named() -> None:
    with pytest.raises(ValueError, match="mysql"):
        db.normalize_url("mysql://u@h/d")


def test_sqlite_engine_pragmas(tmp_path: Path) -> None:
    engine = db.make_engine(f"sqlite:///{tmp_path / 'sub' / 'p.db'}")
    try:
        with engine.connect() as conn:
            pragma = lambda name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
            assert pragma("journal_mode") == "wal"
            assert pragma("busy_timeout") == db.SQLITE_BUSY_TIMEOUT_MS
            assert pragma("foreign_keys") == 1
        assert (tmp_path / "sub" / "p.db").exists()
    finally:
        engine.dispose()


def test_sqlite_checkpointer_syncs_at_wal_checkpoints_like_the_pool(tmp_path: Path) -> None:
    """The LangGraph checkpointer's own connection: WAL and synchronous=NORMAL, as the pool's. At the
    default FULL every checkpoint write waited for the disk (a benchmark's OptiCo runs took 11 % longer)."""
    import asyncio

    from optico.checkpoint import open_checkpointer

    async def pragmas() -> tuple:
        async with open_checkpointer(f"sqlite:///{tmp_path / 'p.db'}") as saver:
            found = []
            for name in ("journal_mode", "synchronous"):
                async with saver.conn.execute(f"PRAGMA {name}") as cursor:
                    found.append((await cursor.fetchone())[0])
            return tuple(found)

    assert asyncio.run(pragmas()) == ("wal", 1)  # 1: NORMAL (2 is FULL)


def test_sqlite_engine_is_usable_from_other_threads(tmp_path: Path) -> None:
    import threading

    engine = db.make_engine(f"sqlite:///{tmp_path / 't.db'}")
    results: list[int] = []
    try:
        with engine.connect() as conn:  # a pooled connection made on this thread...
            conn.execute(text("SELECT 1"))

        def use() -> None:  # ...then checked out on another
            with engine.connect() as conn:
                results.append(conn.execute(text("SELECT 2")).scalar_one())

        t = threading.Thread(target=use)
        t.start()
        t.join()
        assert results == [2]
    finally:
        engine.dispose()


def test_sqlite_transactions_take_the_write_lock_at_begin(tmp_path: Path) -> None:
    # A transaction that has only read already holds the write lock, so it can never
    # fail later when it writes ("database is locked" on the read-to-write upgrade);
    # other writers wait for it instead (here: time out at once).
    import sqlite3

    path = tmp_path / "l.db"
    engine = db.make_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        with engine.connect() as holder:
            assert holder.exec_driver_sql("SELECT count(*) FROM t").scalar() == 0
            raw = sqlite3.connect(path, timeout=0)
            try:
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    raw.execute("INSERT INTO t VALUES (1)")
            finally:
                raw.close()
            holder.rollback()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_checkpointers_opened_at_once_on_a_fresh_postgresql_database_all_open(postgres_db: str) -> None:
    """Workers starting their first jobs together on a fresh database: each job's checkpointer ran
    LangGraph's table migrations at once, and one in three rounds a job failed with 0 trials
    (UniqueViolation on checkpoint_migrations_pkey)."""
    import asyncio

    from optico.checkpoint import open_checkpointer

    async def open_one() -> None:
        async with open_checkpointer(postgres_db):
            pass

    async def open_all(n: int) -> list:
        return await asyncio.gather(*(open_one() for _ in range(n)), return_exceptions=True)

    failures = [r for r in asyncio.run(open_all(8)) if isinstance(r, BaseException)]
    assert failures == [], failures


def test_a_writer_holding_sqlites_lock_does_not_refuse_authenticated_requests(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """`authenticate` writes a token's "last used" once a minute: behind a paused worker's write lock,
    every authenticated request (reads too) waited the busy timeout and the API answered 503."""
    import sqlite3
    import time

    from optico.pool.store import SqlStore

    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_MS", 300)
    path = tmp_path / "pool.db"
    with SqlStore(f"sqlite:///{path}") as store:
        _, token = store.create_token("reader", "read")
        writer = sqlite3.connect(path, isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")
            assert store.authenticate(token) is not None  # the write waited, failed, and is let go
            start = time.monotonic()
            for _ in range(20):
                assert store.authenticate(token) is not None
            assert time.monotonic() - start < 1.0  # not tried again within the minute: no waiting
        finally:
            writer.rollback()
            writer.close()

"""Where the pool lives and how to connect to it.

One database holds both the pool (our `optico_*` tables) and LangGraph's checkpointer
tables, so a job's trials and its graph state commit to the same place. SQLite is the
zero-setup default for one machine; PostgreSQL is for a service with several workers.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import StaticPool

from optico.paths import ENV_HOME, default_data_dir  # noqa: F401  (re-exported; they live in optico.paths)
from optico.private_files import create_private_file, private_dir

ENV_URL = "OPTICO_DATABASE_URL"

# Long enough to ride out another writer's transaction (LangGraph's checkpointer
# included); short enough that a truly stuck lock surfaces as an error.
SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_database_url(*, create: bool = True) -> str:
    """$OPTICO_DATABASE_URL if set, else a per-user SQLite file (see `default_data_dir`).

    Per-user rather than per-directory, so `optico tune` and `optico serve` started from
    different places see the same jobs."""
    url = os.environ.get(ENV_URL, "").strip()
    if url:
        return url
    return f"sqlite:///{default_data_dir(create=create) / 'optico.db'}"


def normalize_url(url: str | URL) -> URL:
    """The SQLAlchemy URL we connect with: every PostgreSQL spelling goes to psycopg 3.

    `postgres://` (Heroku style), `postgresql://` (SQLAlchemy would pick psycopg2, which
    we do not depend on) and `postgresql+psycopg2://` all become `postgresql+psycopg://`."""
    parsed = make_url(url) if isinstance(url, str) else url
    backend = parsed.get_backend_name()
    if backend in ("postgres", "postgresql"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend != "sqlite":
        raise ValueError(f"database URL {parsed.render_as_string(hide_password=True)!r}: unsupported backend "
                         f"{backend!r}; use sqlite:///PATH or postgresql://USER@HOST/DB")
    if parsed.query:
        # With options SQLite may open another file than the path we make private and hand to the
        # checkpointer (`?uri=true&cache=shared` put the pool in "pool.db?cache=shared", mode 0644).
        raise ValueError(f"a SQLite URL takes no options (?{'&'.join(sorted(parsed.query))}): the pool sets its "
                         f"own; use sqlite:///PATH")
    return parsed


def is_sqlite(url: str | URL) -> bool:
    return normalize_url(url).get_backend_name() == "sqlite"


def langgraph_url(url: str | URL) -> str:
    """What LangGraph's checkpointer takes for the same database.

    PostgresSaver.from_conn_string wants a libpq URL (`postgresql://...`, no driver
    suffix, password included); SqliteSaver wants the file path (':memory:' for memory)."""
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return parsed.database if parsed.database not in (None, "", ":memory:") else ":memory:"
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def _enable_wal(cursor: sqlite3.Cursor) -> None:
    """WAL: readers never block the writer nor the writer the readers (LangGraph's
    checkpointer writes to the same file while the dashboard reads).

    WAL is a property of the file, so this only does work on a new database. Switching
    needs an exclusive lock and SQLite answers "database is locked" at once, without
    consulting busy_timeout, when another connection is using the file (several workers
    opening a new database together): retry until the busy timeout is spent."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    delay = 0.005
    while True:
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() in ("wal", "memory"):
            return
        try:
            mode = cursor.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        else:
            # A file system without shared memory keeps the old mode: work on without WAL.
            if str(mode).lower() == "wal" or time.monotonic() > deadline:
                return
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _sqlite_on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
    # Take transaction control away from the sqlite3 module: in its legacy mode it sends
    # no BEGIN for SELECT or DDL, so a read-then-write transaction starts as a reader and
    # must upgrade to a writer later. In WAL mode that upgrade fails at once with
    # "database is locked" (SQLITE_BUSY_SNAPSHOT) when another connection wrote in
    # between, and busy_timeout does not help. `_sqlite_on_begin` sends BEGIN IMMEDIATE.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _enable_wal(cursor)
        # SQLite ignores REFERENCES unless asked, per connection; must be outside a transaction.
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")  # durable at every checkpoint, safe with WAL
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Any) -> None:
    # Every transaction takes the write lock up front, waiting up to busy_timeout for it:
    # writers queue instead of failing. Reads are a few milliseconds, so serialising them
    # with writers costs nothing we would notice at the pool's scale.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _sqlite_on_begin_read(conn: Any) -> None:
    # A deferred BEGIN: in WAL mode a reader sees a consistent snapshot and never waits for a writer.
    conn.exec_driver_sql("BEGIN")


def make_engine(url: str | URL | None = None, *, readonly: bool = False, **kwargs: Any) -> Engine:
    """An Engine configured for the pool: safe to share between threads.

    SQLite: WAL, busy timeout, foreign keys on, `check_same_thread=False` (the engine's
    pool hands connections to whichever thread asks), writers queue via BEGIN IMMEDIATE;
    with `readonly=True` transactions start deferred instead, so readers (the API, the
    dashboard) never queue behind the workers' writes (they must not write).
    PostgreSQL: psycopg 3, connections checked before use (a restarted server is survived).
    Extra keyword arguments go to `create_engine`."""
    parsed = normalize_url(url or default_database_url())
    if parsed.get_backend_name() == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                        **kwargs.pop("connect_args", {})}
        if parsed.database in (None, "", ":memory:"):
            # One in-memory database per engine; StaticPool keeps it alive (tests only).
            kwargs.setdefault("poolclass", StaticPool)
        else:
            path = Path(parsed.database).expanduser()
            private_dir(path.parent)
            create_private_file(path)  # 0600 before SQLite creates it (its -wal/-shm files copy the mode)
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin_read if readonly else _sqlite_on_begin)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)

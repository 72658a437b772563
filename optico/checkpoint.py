"""The LangGraph checkpointer, in the same database as the pool.

One thread per job ("optico-job-<id>"): a killed process resumes the job where it
stopped. SQLite shares the pool's file (WAL); PostgreSQL gets the plain
postgresql:// URL the PostgresSaver wants, on an autocommit connection.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver
from sqlalchemy.engine import make_url


def thread_config(job_id: int) -> dict:
    return {"configurable": {"thread_id": f"optico-job-{job_id}"}}


@contextmanager
def open_checkpointer(database_url: str) -> Iterator[BaseCheckpointSaver]:
    """A checkpointer on `database_url` (the pool's URL), closed on exit."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        path = url.database or ":memory:"
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            yield saver
        finally:
            conn.close()
        return
    if url.get_backend_name() == "postgresql":
        from langgraph.checkpoint.postgres import PostgresSaver

        plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
        with PostgresSaver.from_conn_string(plain) as saver:
            saver.setup()
            yield saver
        return
    raise ValueError(f"OPTICO_DATABASE_URL: no LangGraph checkpointer for {url.get_backend_name()!r}")

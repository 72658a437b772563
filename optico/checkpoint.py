"""The LangGraph checkpointer, in the same database as the pool.

One thread per job ("optico-job-<id>"): a killed process resumes the job where it
stopped. SQLite shares the pool's file (WAL); PostgreSQL gets the plain
postgresql:// URL the PostgresSaver wants. LangGraph's tables (checkpoints, writes,
checkpoint_*) never collide with the pool's optico_* tables.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from langgraph.checkpoint.base import BaseCheckpointSaver

from optico.pool.db import is_sqlite, langgraph_url


def thread_config(job_id: int) -> dict:
    return {"configurable": {"thread_id": f"optico-job-{job_id}"}}


@contextmanager
def open_checkpointer(database_url: str) -> Iterator[BaseCheckpointSaver]:
    """A checkpointer on `database_url` (the pool's URL), closed on exit."""
    target = langgraph_url(database_url)
    if is_sqlite(database_url):
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(target, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            yield saver
        finally:
            conn.close()
        return
    from langgraph.checkpoint.postgres import PostgresSaver

    with PostgresSaver.from_conn_string(target) as saver:
        saver.setup()
        yield saver

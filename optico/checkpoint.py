"""The LangGraph checkpointer, in the same database as the pool, reading plain data only.

One thread per job ("optico-job-<id>"): a killed worker's successor resumes the job where it
stopped. SQLite shares the pool's file (WAL); PostgreSQL gets the plain postgresql:// URL the
saver wants and keeps its tables (checkpoints, checkpoint_*) apart from the pool's optico_* ones.

Safety: LangGraph's default serializer rebuilds arbitrary Python objects from stored rows, so
anyone able to write the checkpoint tables could run code on the workers. Our loop state is
JSON, so `PlainDataSerializer` writes JSON and reads back only JSON (and msgpack without
extension types, for checkpoints written before this serializer): any other payload is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import ormsgpack
from langgraph.checkpoint.base import BaseCheckpointSaver

from optico.pool.db import is_sqlite, langgraph_url


# Key of the PostgreSQL advisory lock held while LangGraph sets its tables up ("OPTICP" in ASCII:
# beside the pool's migration lock, optico.pool.schema.ADVISORY_LOCK_ID, not the same one).
CHECKPOINT_SETUP_LOCK_ID = 0x4F5054494350
SETUP_WAIT_S = 300.0  # a setup on a fresh database takes well under a second


class UnsafeCheckpoint(ValueError):
    """A stored checkpoint value is not plain data; it is refused rather than deserialized."""


class PlainDataSerializer:
    """LangGraph's SerializerProtocol over JSON: dicts, lists, str, int, float, bool and None only."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None:
            return "null", b""
        # A non-JSON value in the loop state is our bug: fail loudly where it is written.
        return "json", json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        kind, blob = data
        if kind == "null":
            return None
        if kind == "json":
            return json.loads(blob)
        if kind == "msgpack":
            try:
                # Without an ext_hook, ormsgpack refuses extension types (how objects are encoded).
                return ormsgpack.unpackb(blob)
            except (ValueError, TypeError) as exc:
                raise UnsafeCheckpoint(f"checkpoint value refused: it is not plain data ({exc})") from None
        raise UnsafeCheckpoint(f"checkpoint value of type {kind!r} refused: only plain data is read")


def thread_config(job_id: int) -> dict:
    return {"configurable": {"thread_id": f"optico-job-{job_id}"}}


@asynccontextmanager
async def open_checkpointer(database_url: str) -> AsyncIterator[BaseCheckpointSaver]:
    """An async checkpointer on `database_url` (the pool's URL) with the plain-data serializer."""
    target = langgraph_url(database_url)
    serde = PlainDataSerializer()
    if is_sqlite(database_url):
        import aiosqlite
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with aiosqlite.connect(target, timeout=30) as conn:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute("PRAGMA busy_timeout=30000")
            # As the pool's connections (optico.pool.db): with WAL, NORMAL syncs at WAL checkpoints, not
            # at every commit; a power cut may lose the last checkpoints, never corrupt them, and a
            # resume reads the job's progress from the pool, not from here.
            await conn.execute("PRAGMA synchronous=NORMAL")
            saver = AsyncSqliteSaver(conn, serde=serde)
            await saver.setup()
            yield saver
        return
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # A pool that checks each connection before lending it, not one connection: after a database
    # restart (a second's blip, a failover) the next checkpoint reconnects instead of failing the job.
    # The connection settings are those of AsyncPostgresSaver.from_conn_string.
    async with AsyncConnectionPool(target, min_size=1, max_size=2, check=AsyncConnectionPool.check_connection,
                                   kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                                   open=False) as pool:
        saver = AsyncPostgresSaver(pool, serde=serde)
        # LangGraph creates and migrates its tables in setup(), unlocked: workers starting their first
        # jobs together on a fresh database raced (UniqueViolation on checkpoint_migrations, the job
        # failed with 0 trials). One setup at a time, under a session advisory lock of its own.
        # Taken by polling, not by waiting in pg_advisory_lock: the setup creates an index CONCURRENTLY,
        # which waits for every open statement, a session blocked on the lock included (a deadlock).
        async with pool.connection() as conn:
            deadline = time.monotonic() + SETUP_WAIT_S
            while not (await (await conn.execute("SELECT pg_try_advisory_lock(%s)",
                                                 (CHECKPOINT_SETUP_LOCK_ID,))).fetchone())["pg_try_advisory_lock"]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"LangGraph's checkpoint tables: another process has been setting them up "
                                       f"for over {SETUP_WAIT_S:.0f} s")
                await asyncio.sleep(0.05)
            try:
                await saver.setup()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (CHECKPOINT_SETUP_LOCK_ID,))
        yield saver

"""The schema comes only from Alembic, is checked on open, and shares the database with
LangGraph's checkpointer. Every test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from pool_testkit import make_spec
from sqlalchemy import Engine, inspect, text

from optico.pool import SchemaError, SqlStore, langgraph_url, make_engine, schema
from optico.pool.models import OUR_TABLES, Base
from optico.strategy import Strategy

LANGGRAPH_TABLES = {"sqlite": {"checkpoints", "writes"},
                    "postgresql": {"checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"}}


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    try:
        yield e
    finally:
        e.dispose()


def tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names())


def schema_diff(engine: Engine, filtered: bool = True) -> list[Any]:
    """What autogenerate would put in a new migration (empty = models and database agree)."""
    opts: dict[str, Any] = {"compare_type": True, "target_metadata": Base.metadata}
    if filtered:
        opts["include_name"] = schema.include_name
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts=opts), Base.metadata)


def test_upgrade_creates_every_table_and_stamps_head(engine: Engine) -> None:
    assert tables(engine) == set()
    assert schema.current_revision(engine) is None
    schema.upgrade(engine)
    assert tables(engine) == OUR_TABLES | {"alembic_version"}
    assert schema.current_revision(engine) == schema.head_revision()
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [
            schema.head_revision()]


def test_the_migrations_match_the_models(engine: Engine) -> None:
    schema.upgrade(engine)
    assert schema_diff(engine) == []


def test_migrating_through_0005_keeps_every_schedule_tick_and_event(engine: Engine) -> None:
    # Alembic's SQLite batch mode rebuilds a table to add a column with an expression default, and with
    # foreign keys on, dropping the old optico_schedules cascaded to every tick and event.
    schema.upgrade(engine, "0004")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO optico_schedules (name, spec, workload_key, cron, max_trials, next_fire_at) "
                          "VALUES ('n', '{}', 'k', '0 2 * * *', 3, CURRENT_TIMESTAMP)"))
        sid = conn.execute(text("SELECT id FROM optico_schedules")).scalar_one()
        conn.execute(text("INSERT INTO optico_schedule_ticks (schedule_id, trigger, status, worker, report) "
                          "VALUES (:s, 'cron', 'done', 'w', '{}')"), {"s": sid})
        conn.execute(text("INSERT INTO optico_schedule_events (schedule_id, seq, kind, payload) "
                          "VALUES (:s, 1, 'tick', '{}')"), {"s": sid})

    def counts() -> tuple[int, int, int]:
        with engine.connect() as conn:
            return tuple(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                         for t in ("optico_schedules", "optico_schedule_ticks", "optico_schedule_events"))

    schema.upgrade(engine)
    assert counts() == (1, 1, 1)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT run_requested FROM optico_schedules")).scalar_one() in (False, 0)
        assert conn.execute(text("SELECT job_key FROM optico_schedule_ticks")).scalar_one() is None
    schema.downgrade(engine, "0004")
    assert counts() == (1, 1, 1)
    schema.upgrade(engine)
    assert counts() == (1, 1, 1) and schema_diff(engine) == []


def test_upgrade_twice_is_harmless(engine: Engine) -> None:
    schema.upgrade(engine)
    schema.upgrade(engine)
    assert schema.current_revision(engine) == schema.head_revision()


def test_downgrade_to_base_removes_our_tables(engine: Engine) -> None:
    schema.upgrade(engine)
    schema.downgrade(engine, "base")
    assert tables(engine) <= {"alembic_version"}
    assert schema.current_revision(engine) is None


def test_nothing_in_the_package_creates_tables_behind_alembic() -> None:
    package = Path(schema.__file__).resolve().parent.parent
    offenders = [str(p) for p in package.rglob("*.py") if "create_all(" in p.read_text()]
    assert offenders == []


def test_store_migrates_an_empty_database_on_open(db_url: str, engine: Engine) -> None:
    with SqlStore(db_url) as store:
        store.create_job(make_spec())
    assert schema.current_revision(engine) == schema.head_revision()


def test_ensure_current_names_the_fix_on_an_unmigrated_database(db_url: str, engine: Engine) -> None:
    with pytest.raises(SchemaError, match="optico db upgrade"):
        schema.ensure_current(engine)
    with pytest.raises(SchemaError, match="optico db upgrade"):
        SqlStore(db_url, upgrade=False)
    assert tables(engine) == set()  # refusing does not migrate


def test_ensure_current_names_the_fix_on_an_old_schema(db_url: str, engine: Engine) -> None:
    schema.upgrade(engine)
    schema.downgrade(engine, "base")  # the database of an optico older than the first revision
    with pytest.raises(SchemaError, match="run `optico db upgrade`"):
        SqlStore(db_url, upgrade=False)
    SqlStore(db_url).close()  # the fix works
    SqlStore(db_url, upgrade=False).close()


def test_a_schema_from_a_newer_optico_is_refused(db_url: str, engine: Engine) -> None:
    schema.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    with pytest.raises(SchemaError, match="newer optico"):
        schema.ensure_current(engine)
    with pytest.raises(SchemaError, match="upgrade the optico package"):
        SqlStore(db_url)  # migrating cannot help either


def test_concurrent_first_opens_migrate_once(db_url: str, engine: Engine) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def open_one() -> None:
        try:
            barrier.wait()
            SqlStore(db_url).close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert schema.current_revision(engine) == schema.head_revision()


# -- LangGraph's checkpointer in the same database -------------------------------------------------

@contextmanager
def checkpointer(backend: str, db_url: str) -> Iterator[Any]:
    """LangGraph's own saver for this database, its tables created with setup()."""
    if backend == "sqlite":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(langgraph_url(db_url), check_same_thread=False)
        try:
            saver = SqliteSaver(conn)
            saver.setup()
            yield saver
        finally:
            conn.close()
    else:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(langgraph_url(db_url)) as pg_saver:
            pg_saver.setup()
            yield pg_saver


class Counter(TypedDict):
    n: int


def run_graph(saver: Any, thread_id: str) -> dict[str, Any]:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(Counter)
    graph.add_node("inc", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "inc")
    graph.add_edge("inc", END)
    return graph.compile(checkpointer=saver).invoke({"n": 1}, {"configurable": {"thread_id": thread_id}})


def test_langgraph_checkpointer_shares_the_database(backend: str, db_url: str, engine: Engine) -> None:
    SqlStore(db_url).close()  # our schema first, as a service starting up would
    with checkpointer(backend, db_url) as saver:
        assert run_graph(saver, "job-1") == {"n": 2}
        assert LANGGRAPH_TABLES[backend] <= tables(engine)
        # Our migrations run again with LangGraph's tables present and leave them be,
        # down and up.
        schema.upgrade(engine)
        schema.downgrade(engine, "base")
        assert LANGGRAPH_TABLES[backend] <= tables(engine)
        schema.upgrade(engine)
        assert tables(engine) == OUR_TABLES | {"alembic_version"} | LANGGRAPH_TABLES[backend]
        # Without our filter autogenerate would want to drop LangGraph's tables; with it,
        # it sees nothing to do.
        unfiltered = {d[1].name for d in schema_diff(engine, filtered=False) if d[0] == "remove_table"}
        assert LANGGRAPH_TABLES[backend] <= unfiltered
        assert schema_diff(engine) == []
        # Both keep working side by side.
        with SqlStore(db_url) as store:
            job_id = store.create_job(make_spec())
            trial = store.start_trial(job_id, 1, Strategy())
            assert store.get_trial(trial.id).job_id == job_id
        state = saver.get_tuple({"configurable": {"thread_id": "job-1"}})
        assert state is not None and state.checkpoint["channel_values"]["n"] == 2
        assert run_graph(saver, "job-2") == {"n": 2}


def test_workers_starting_together_migrate_once(db_url: str, engine: Engine) -> None:
    # Separate processes, as several `optico` workers starting at once on a new database:
    # in-process locks cannot help here, only the database's own (advisory lock on
    # PostgreSQL, BEGIN IMMEDIATE on SQLite).
    import os
    import subprocess
    import sys

    # Each child imports optico, says "ready", and opens the store when told "go": all
    # three then race for the first migration.
    code = ("import sys; from optico.pool import SqlStore; print('ready', flush=True); sys.stdin.readline(); "
            "SqlStore(sys.argv[1]).close()")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(schema.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(3)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], "\n".join(outputs)
    assert schema.current_revision(engine) == schema.head_revision()
    assert schema_diff(engine) == []

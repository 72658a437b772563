"""Alembic environment for the pool.

Normally run through `optico.pool.schema.upgrade(engine)`, which passes an open
connection in `config.attributes["connection"]`. Run by the `alembic` command line it
connects to `sqlalchemy.url` from the config, else to `default_database_url()`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from optico.pool.db import default_database_url, make_engine, normalize_url
from optico.pool.models import Base
from optico.pool.schema import ADVISORY_LOCK_ID, include_name

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # LangGraph's checkpointer tables share the database: never touch them.
        include_name=include_name,
        compare_type=True,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=sqlite,
        # Our engine makes the sqlite3 driver send a real BEGIN, so SQLite's DDL is
        # transactional too: an upgrade that fails halfway leaves nothing behind.
        transactional_ddl=True,
    )


def _run(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            # Two workers starting at once must not both create the tables. On SQLite
            # the BEGIN IMMEDIATE of our engine already serialises them.
            connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": ADVISORY_LOCK_ID})
        context.run_migrations()


def run_migrations_offline() -> None:
    """`alembic upgrade --sql`: print the DDL instead of running it."""
    url = normalize_url(config.get_main_option("sqlalchemy.url") or default_database_url())
    context.configure(url=url, target_metadata=target_metadata, include_name=include_name,
                      literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or default_database_url())
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

"""The pool's schema version: Alembic is the only thing that creates or changes tables.

`SqlStore` calls `upgrade` on open (or `ensure_current` when told not to migrate), so a
database is never used with a schema older than the code. `optico db upgrade` is the
command-line way to do the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from optico.pool.models import OUR_TABLES

# Found next to this file, not through the working directory, so an installed wheel
# works (pyproject's package-data ships migrations/*.py, *.mako and versions/*.py).
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

FIX_COMMAND = "optico db upgrade"

# Key of the PostgreSQL advisory lock held while migrating ("OPTICO" in ASCII).
ADVISORY_LOCK_ID = 0x4F505449434F

# LangGraph's checkpointer tables (SqliteSaver and PostgresSaver) in the same database.
LANGGRAPH_TABLES: frozenset[str] = frozenset(
    {"checkpoints", "writes", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations"})


# Alembic's `context` is process-global, so two threads must not migrate at once even
# on different databases. Across processes the database serialises them (env.py).
_ALEMBIC_LOCK = threading.Lock()


class SchemaError(RuntimeError):
    """The database schema does not match this version of optico; the message says the fix."""


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic filter: only our tables exist for autogenerate.

    LangGraph's tables (and anything else sharing the database) must never show up as
    "removed" in a generated migration, which would drop them."""
    if type_ == "table":
        return name in OUR_TABLES
    return True


def alembic_config() -> Config:
    """A Config for our migrations, without any alembic.ini."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    return cfg


@lru_cache(maxsize=1)
def head_revision() -> str:
    """The revision this version of optico needs."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - a packaging error, not a runtime state
        raise SchemaError(f"no migrations found in {MIGRATIONS_DIR}; the optico package is incomplete")
    return head


def _known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None for a database optico never migrated."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrates the database to `revision` (default: this optico's head). Safe to run
    concurrently from several processes: one migrates, the others then find it done.
    SchemaError if a newer optico already migrated it past anything known here."""
    current = current_revision(engine)
    if current is not None and current not in _known_revisions():
        raise SchemaError(_newer_message(engine, current))
    _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    """Migrates the database down to `revision` ('base' drops every optico table,
    leaving LangGraph's alone)."""
    _run(engine, command.downgrade, revision)


def _run(engine: Engine, step: Callable[[Config, str], None], revision: str) -> None:
    cfg = alembic_config()
    with _ALEMBIC_LOCK, engine.connect() as conn:
        cfg.attributes["connection"] = conn
        step(cfg, revision)
        # env.py commits its own transaction; this closes any autobegun read.
        conn.commit()


def ensure_current(engine: Engine) -> None:
    """Returns when the schema is at head; else raises SchemaError naming the fix."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    where = engine.url.render_as_string(hide_password=True)
    if current is None:
        raise SchemaError(f"the optico database at {where} has no optico schema (revision {head} needed); "
                          f"run `{FIX_COMMAND}` to create it")
    if current not in _known_revisions():
        raise SchemaError(_newer_message(engine, current))
    raise SchemaError(f"the optico database at {where} is at schema revision {current} but this optico "
                      f"needs {head}; run `{FIX_COMMAND}` to migrate it")


def _newer_message(engine: Engine, current: str) -> str:
    return (f"the optico database at {engine.url.render_as_string(hide_password=True)} is at schema revision "
            f"{current}, which this optico does not know (it needs {head_revision()}): a newer optico migrated "
            f"it; upgrade the optico package rather than the database")

"""`optico db ...`: the pool's schema."""

from __future__ import annotations

from typing import Optional

import typer

from optico.cli.common import DatabaseOption, console

db_app = typer.Typer(no_args_is_help=True, help="The pool's database.")


@db_app.command("upgrade")
def db_upgrade(database: Optional[str] = DatabaseOption) -> None:
    """Create or migrate the pool's schema (Alembic)."""
    from optico.pool.db import default_database_url, make_engine
    from optico.pool.schema import current_revision, upgrade

    engine = make_engine(database or default_database_url())
    upgrade(engine)
    console.print(f"schema at {current_revision(engine)}")


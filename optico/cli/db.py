"""`optico db ...`: the pool's schema."""

from __future__ import annotations

from typing import Optional

import typer

from optico.cli.common import DatabaseOption, console, fail, pool_url, shown_url

db_app = typer.Typer(no_args_is_help=True, help="The pool's database.")


@db_app.command("upgrade")
def db_upgrade(database: Optional[str] = DatabaseOption) -> None:
    """Create or migrate the pool's schema (Alembic)."""
    from optico.pool.db import make_engine
    from optico.pool.schema import current_revision, upgrade

    url, option = pool_url(database)
    try:
        engine = make_engine(url)
        upgrade(engine)
        console.print(f"schema at {current_revision(engine)}")
    except Exception as exc:  # noqa: BLE001 - the driver's errors vary by backend; all mean "cannot open"
        fail(f"{option}: cannot upgrade the pool at {shown_url(url)}: {str(exc).strip().splitlines()[0]}")


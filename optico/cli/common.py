"""What every command shares: the consoles, the one-line error, the pool options."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

console = Console()
err = Console(stderr=True)

# Click options take one value each; the files after the first come in as arguments, so both
# `--data a.csv b.csv` (a shell glob) and `--data a.csv --data b.csv` work.
MoreFilesArgument = typer.Argument(None, metavar="[FILE.csv ...]", show_default=False,
                                   help="More CSV files after the first --data one.")
DatabaseOption = typer.Option(None, "--database", envvar="OPTICO_DATABASE_URL",
                              help="SQLAlchemy URL of the pool (default: SQLite in the user data dir).")


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def open_store(database: str | None):
    from optico.pool.db import default_database_url
    from optico.pool.store import SqlStore

    url = database or default_database_url()
    return SqlStore(url), url


def require_files(option: str, paths: list[Path]) -> None:
    for path in paths:
        if not path.is_file():
            fail(f"{option}: no such file: {path}")

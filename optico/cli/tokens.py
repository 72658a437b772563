"""`optico token ...`: the REST API's bearer tokens (only their hash is stored)."""

from __future__ import annotations

from typing import Optional

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from optico.cli.common import DatabaseOption, console, err, fail, open_store
from optico.redact import redact
from optico.textsafe import terminal_text

token_app = typer.Typer(no_args_is_help=True, help="API tokens of the REST service.")


@token_app.command("create")
def token_create(name: str = typer.Argument(..., help="A name to tell the token apart (unique)."),
                 scope: str = typer.Option(..., "--scope", help="read (GET endpoints) or write (everything)."),
                 database: Optional[str] = DatabaseOption) -> None:
    """Mint a token and print it once: it cannot be shown again."""
    from optico.pool.tokens import token_name_problem

    if scope not in ("read", "write"):
        fail(f"--scope: must be read or write, got {scope!r}")
    problem = token_name_problem(name)
    if problem:
        fail(f"name: {problem}")  # before the pool is opened: a refused name creates nothing
    store, _ = open_store(database)
    with store:
        try:
            record, token = store.create_token(name, scope)
        except ValueError as exc:
            fail(str(exc))
    # Not markup: a name like 'a[/]' is text (read as markup, it raised after the token was stored).
    err.print(f"token {record.name!r} ({record.scope}); shown once, store it now:", highlight=False, markup=False)
    print(token)


@token_app.command("list")
def token_list(database: Optional[str] = DatabaseOption) -> None:
    """Every token: name, scope, prefix, created, last used, revoked."""
    store, _ = open_store(database, empty="no tokens")
    with store:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        # The name is what `token revoke` needs: folded, never squeezed out (beside columns that may not
        # wrap, a narrow terminal gave it no width at all); dates wrap between day and time.
        table.add_column("name", overflow="fold", min_width=12)
        for header in ("scope", "prefix", "created", "last used", "revoked"):
            table.add_column(header)
        for t in store.tokens():
            when = lambda d: d.strftime("%Y-%m-%d %H:%M") if d else "-"  # noqa: E731
            # A name comes back from the database: escaped and masked like any stored text.
            table.add_row(Text(terminal_text(redact(t.name), one_line=True, max_chars=120)), t.scope, t.prefix + "…", when(t.created_at), when(t.last_used_at),
                          when(t.revoked_at))
        console.print(table)


@token_app.command("revoke")
def token_revoke(name: str, database: Optional[str] = DatabaseOption) -> None:
    """Revoke a token: every request with it gets 401 from now on."""
    store, _ = open_store(database, absent=f"token: no token named {name!r}")
    with store:
        try:
            record = store.revoke_token(name)
        except KeyError:
            fail(f"token: no token named {name!r}")
    console.print(f"token {record.name!r} revoked", highlight=False, markup=False)

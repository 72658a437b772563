"""What every command shares: the consoles, the one-line error, the pool options and checks.

Bad input from the command line (an argument, an option, a file, a database URL) ends in one
line on stderr, `error: <field>: <reason>`, and exit status 2, before anything is written.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import click
import typer

from optico.errors import SpecError
from optico.sql_limits import SQL_INT_MAX
# Every command imports these from here.
from optico.terminal import (ANY_COUNT, check_output_path, console, decimal_number, err, fail,  # noqa: F401
                             output_file, whole_number)
from optico.textsafe import markup

# Click options take one value each; the files after the first come in as arguments, so both
# `--data a.csv b.csv` (a shell glob) and `--data a.csv --data b.csv` work.
# Hidden from the argument list (its type would show as <list[Path]>); --data's help says it.
MoreFilesArgument = typer.Argument(None, metavar="[FILE.csv ...]", show_default=False, hidden=True)


def files_by_option(ctx: typer.Context, more: list[Path] | None, options: tuple[str, ...]) -> dict[str, list[Path]]:
    """The extra (positional) files by the option they followed on the command line, the first of
    `options` for those before any: `--data a.csv b.csv --holdout c.csv d.csv` holds out c and d,
    not only c (a shell glob after --holdout was fitted on). Matched by position, so a file given
    after both options counts for each."""
    argv = list((ctx.find_root().obj or {}).get("argv") or [])
    takes_value = {name for p in ctx.command.params if isinstance(p, click.Option) and not p.is_flag
                   for name in p.opts}
    pending = list(more or [])
    found: dict[str, list[Path]] = {option: [] for option in options}
    current = options[0]
    tokens = iter(argv[argv.index(ctx.info_name) + 1:] if ctx.info_name in argv else argv)
    for token in tokens:
        name = token.split("=", 1)[0]
        if name in options:
            current = name
        if name in takes_value and "=" not in token:
            next(tokens, None)  # the option's own value, not a positional file
        elif not token.startswith("-") and pending and Path(token) == pending[0]:
            found[current].append(pending.pop(0))
    found[options[0]] += pending  # whatever could not be placed: as before, fitted on
    return found


DatabaseOption = typer.Option(None, "--database", envvar="OPTICO_DATABASE_URL", metavar="URL",
                              help="SQLAlchemy URL of the pool (default: SQLite in the user data dir).")
# Job ids are SQL integers: anything outside this range is no job and must not reach the driver.
MAX_ID = SQL_INT_MAX

# The first bytes of every SQLite 3 database file.
_SQLITE_MAGIC = b"SQLite format 3\x00"


def parse_id(value: str | int) -> int:
    """An id (a job's, an iteration's) as typed: plain decimal digits, 1 to MAX_ID. Not int(): it reads
    "1_0" as job 10 and takes "+1" and " 1" (and typer's own int parsing "1.0"), so a typo would
    act on another job. The bound is checked here, not as a typer range: its help would print it."""
    if isinstance(value, int):  # a default, never typed
        return value
    if not (value.isascii() and value.isdigit()):
        raise typer.BadParameter(f"{value!r} is not an id: give plain digits, e.g. 12")
    # Length first: int() refuses over 4,300 digits, and no id has more than MAX_ID's.
    if len(value) > len(str(MAX_ID)) or not 1 <= int(value) <= MAX_ID:
        raise typer.BadParameter(f"{value} is not a valid id (1 to {MAX_ID})")
    return int(value)


# Every id on the command line is parsed by `parse_id`: these, or an option with `parser=parse_id`.
JobIdArgument = typer.Argument(..., metavar="JOB_ID", parser=parse_id, show_default=False)


def check_database_url(url: str, option: str = "--database") -> None:
    """Fails, naming `option`, on a URL the pool cannot use, before anything is created:
    not a URL, an unsupported backend, a missing driver, a SQLite path that is not a database, a
    SQLite database in memory."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from optico.pool.db import normalize_url

    try:
        parsed = normalize_url(make_url(url))
    except ArgumentError:
        fail(SpecError(option, "not a database URL; use sqlite:///PATH or postgresql://USER@HOST/DB"))
    except ValueError as exc:
        fail(SpecError(option, str(exc)))
    if parsed.get_backend_name() != "sqlite":
        if importlib.util.find_spec("psycopg") is None:
            fail(SpecError(option, "PostgreSQL needs the psycopg driver: pip install 'optico[postgres]'"))
        return
    # In memory (no path, ":memory:", SQLite's URI "mode=memory"): each connection of the command, its
    # job runner and checkpointer would see its own empty database, gone when the command ends.
    if parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory" \
            or "mode=memory" in (parsed.database or ""):
        fail(SpecError(option, "an in-memory SQLite database cannot hold a pool; give a file, "
                               "sqlite:///PATH, or postgresql://USER@HOST/DB"))
    path = Path(parsed.database).expanduser()
    try:
        exists = path.exists()
    except OSError as exc:  # a name the file system refuses (too long, ...)
        fail(SpecError(option, f"cannot use {path}: {exc.strerror or exc}"))
    if exists:
        if not path.is_file():
            fail(SpecError(option, f"{path} is not a regular file"))
        try:
            with open(path, "rb") as handle:
                head = handle.read(len(_SQLITE_MAGIC))
        except OSError as exc:
            fail(SpecError(option, f"cannot read {path}: {exc.strerror or exc}"))
        if head and head != _SQLITE_MAGIC:
            fail(SpecError(option, f"{path} is not a SQLite database"))
        return
    check_output_path(path, option)


def pool_url(database: str | None, *, create: bool = True) -> tuple[str, str]:
    """(the pool's URL, the option or variable it came from), checked with `check_database_url`;
    `create=False`: the default data directory is not made (a lookup writes nothing)."""
    from optico.pool.db import ENV_HOME, default_database_url

    if database:
        option = "OPTICO_DATABASE_URL" if os.environ.get("OPTICO_DATABASE_URL") == database else "--database"
    else:
        option = ENV_HOME if os.environ.get(ENV_HOME) else "data dir"
        try:
            database = default_database_url(create=create)
        except OSError as exc:
            fail(SpecError(option, f"cannot create the data directory: {exc.strerror or exc}: "
                                   f"{getattr(exc, 'filename', '') or ''}"))
    check_database_url(database, option)
    return database, option


def open_store(database: str | None, *, job: int | None = None, job_option: str = "JOB_ID",
               absent: str | None = None, empty: str | None = None):
    """(the pool, its URL) — every failure to open it is a one-line error naming the option. With
    `job` (a command about one job) or `absent` (the error of a lookup of something else), a SQLite
    pool that does not exist yet is that error, and is not created: a lookup that fails writes nothing.
    With `empty` (a listing), it is that line and exit 0: nothing to list, nothing created."""
    from optico.pool.store import SqlStore
    from optico.redact import redact

    lookup = job is not None or absent is not None or empty is not None
    url, option = pool_url(database, create=not lookup)
    if lookup and _missing_sqlite_file(url):
        if job is not None:
            fail(SpecError(job_option, f"no job {job} in {shown_url(url)} (no pool there yet)"))
        if empty is not None:
            console.print(f"{empty} (no pool at {markup(shown_url(url), one_line=True)} yet)", highlight=False)
            raise typer.Exit(0)
        fail(f"{absent} (no pool at {shown_url(url)} yet)")
    try:
        return SqlStore(url), url
    except Exception as exc:  # noqa: BLE001 - the driver's errors vary by backend; all mean "cannot open"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        fail(SpecError(option, f"cannot open the pool at {shown_url(url)}: {redact(reason)}"))


def _missing_sqlite_file(url: str) -> bool:
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
        and not Path(parsed.database).expanduser().exists()


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - checked elsewhere; only printing here
        return "<database URL>"


def require_files(option: str, paths: list[Path], what: str = "CSV file") -> None:
    """Every path is a readable UTF-8 text file within the input size bound."""
    from optico.input_files import read_text
    from optico.replay_csv import MAX_CSV_BYTES

    for path in paths:
        try:
            read_text(path, option, what, MAX_CSV_BYTES)
        except SpecError as exc:
            fail(exc)

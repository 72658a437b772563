"""The consoles and the one-line error of every command, the check that an output path can be written,
and the reading of a count or a decimal number typed on the command line.

Shared by `optico.cli` and `optico.bench.cli` (which `optico.cli` registers, so it cannot import
`optico.cli` back): bad input from the command line ends in one line on stderr,
`error: <field>: <reason>`, and exit status 2, before anything is written.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TextIO

import typer
from rich.console import Console

from optico.errors import SpecError
from optico.redact import redact
from optico.textsafe import markup


class _Unpadded:
    """sys.stdout or sys.stderr as rich writes to it, looked up at each write (a test runner swaps them).
    Going to a pipe or a file, lines lose the spaces rich pads table cells and indented blocks with up to
    the console's width: trailing spaces break diffs and `grep 'x$'`. A terminal gets the text as is."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def _stream(self) -> TextIO:
        return getattr(sys, self._name)

    def write(self, text: str) -> int:
        stream = self._stream
        return stream.write(text if stream.isatty() else _TRAILING_SPACES.sub("", text))

    def __getattr__(self, name: str) -> Any:  # isatty, flush, fileno, encoding: the stream's own
        return getattr(self._stream, name)


# Spaces before a line break, also when a style's reset code sits between them (FORCE_COLOR in a pipe).
# A run is tried from its first space only: from each of its spaces, a long run took its square.
_TRAILING_SPACES = re.compile(r"(?<! ) +(?=(?:\x1b\[[0-9;]*m)*\n)")

def _console(stream: str) -> Console:
    """A console on sys.<stream>; ":ok:" in a file name is text, not an emoji. Rich fixes the width COLUMNS
    gives when a console is built; like the stream, it is read at each print instead (a test sets it)."""
    made = Console(file=_Unpadded(stream), emoji=False)  # type: ignore[arg-type]
    made.width = None  # type: ignore[assignment]
    return made


# One console per stream for every command.
console = _console("stdout")
err = _console("stderr")


def fail(message: str | SpecError, code: int = 2) -> NoReturn:
    """Prints `error: <message>` as one line (redacted and escaped: the message may quote user input,
    a credential in the wrong field included) and exits."""
    err.print(f"[bold red]error:[/] {markup(_redacted(message), one_line=True, max_chars=1000)}", highlight=False,
              soft_wrap=True)
    raise typer.Exit(code)


def _redacted(message: str | SpecError) -> str:
    """The message redacted. A field and a reason that quotes no value are redacted apart: joined,
    'launcher.password: unknown field' reads as a password assignment, and the reason was masked."""
    if isinstance(message, SpecError) and message.field and not _QUOTES.search(message.reason):
        return f"{redact(message.field)}: {redact(message.reason)}"
    return redact(str(message))


_QUOTES = re.compile("[\"'`]")


def check_output_path(path: Path, option: str) -> None:
    """Fails unless `path` can be written later (by a job that may run for hours): an existing
    regular file we may open for writing, or a new file whose nearest existing folder is a
    writable directory. Nothing is left behind (a probe file is made and removed at once)."""
    try:
        _check_output_path(path, option)
    except (OSError, ValueError) as exc:  # a name the file system refuses (too long, a NUL): stat() raises
        fail(SpecError(option, f"cannot use {path}: {getattr(exc, 'strerror', None) or exc}"))


def _check_output_path(path: Path, option: str) -> None:
    target = path.expanduser()
    if target.is_symlink() and not target.exists():
        fail(SpecError(option, f"{path} is a symbolic link to nothing"))
    if target.exists():
        if not target.is_file():
            fail(SpecError(option, f"{path} is not a regular file"))
        try:
            with open(target, "ab"):  # append mode without writing: the file is left as it was
                pass
        except OSError as exc:
            fail(SpecError(option, f"cannot write {path}: {exc.strerror or exc}"))
        return
    folder = target.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        fail(SpecError(option, f"cannot create {path}: {folder} is not a directory"))
    try:  # a file made and removed at once: os.access says yes to root in /proc and /sys
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        fail(SpecError(option, f"cannot create {path}: {folder} is not writable ({exc.strerror or exc})"))


def _mode_for(target: Path) -> int:
    """The permissions a file written in place would have: the earlier file's, else the umask's."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextmanager
def output_file(path: Path, option: str) -> Iterator[TextIO]:
    """`path` opened for writing text, its missing folders made first (`check_output_path` allowed
    them). Written to a temporary file beside it and moved into place at the end, so a failure (a
    full disk, a file system gone read-only) leaves any earlier file whole and is the one-line
    error, not a traceback."""
    target = path.expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile("w", dir=target.parent, prefix=".optico-", suffix=".part",
                                             delete=False, newline="", encoding="utf-8")
    except OSError as exc:
        fail(SpecError(option, f"cannot write {path}: {exc.strerror or exc}"))
    try:
        with handle:
            yield handle
        os.chmod(handle.name, _mode_for(target))  # the temporary file is 0600
        os.replace(handle.name, target)
    except BaseException as exc:
        Path(handle.name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            fail(SpecError(option, f"cannot write {path}: {exc.strerror or exc}"))
        raise


# The bound of a count whose range the command checks itself (with its own message): digits only here.
ANY_COUNT = 10**18


def whole_number(low: int, high: int) -> Callable[[str | int], int]:
    """A parser for a count option (`typer.Option(..., parser=whole_number(1, 10_000))`): plain decimal
    digits from `low` to `high`, as ids and specs take them; int() would read '1_0' as 10 and take
    '+2', ' 2' and, through typer, '2.0'."""
    def parse(value: str | int) -> int:
        if isinstance(value, int):  # a default, never typed
            return value
        if not (value.isascii() and value.isdigit()):
            raise typer.BadParameter(f"{value[:40]!r} is not a whole number: give plain digits, e.g. {max(low, 1)}")
        if len(value) > len(str(high)) or not low <= int(value) <= high:
            raise typer.BadParameter(f"must be {low:,} to {high:,}, got {value[:40]}")
        return int(value)
    return parse


# A decimal as people type one: '2', '0.5', '.5', '1e3'. float() also takes '1_0' (10), ' 2', '+2',
# 'inf', 'nan' and non-ASCII digits, none of which a user means as a budget or a weight.
_PLAIN_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")


def read_decimal(text: str) -> float | None:
    """`text` as a non-negative decimal, or None when it is not written as one ('1e999' reads as inf:
    the caller's bounds refuse it)."""
    if len(text) > 40 or not _PLAIN_DECIMAL.fullmatch(text):
        return None
    return float(text)


def _range(low: float, high: float) -> str:
    return f" from {low:g}" + (f" to {high:g}" if math.isfinite(high) else "")


def decimal_number(low: float, high: float) -> Callable[[str | float], float]:
    """A parser for a decimal option (`typer.Option(..., parser=decimal_number(0, 100))`): a plain
    non-negative decimal from `low` to `high`."""
    def parse(value: str | float) -> float:
        if isinstance(value, (int, float)):  # a default, never typed
            return float(value)
        number = read_decimal(value)
        if number is None:
            raise typer.BadParameter(f"{value[:40]!r} is not a plain decimal number{_range(low, high)}")
        if not low <= number <= high:
            raise typer.BadParameter(f"must be a number{_range(low, high)}, got {value[:40]}")
        return number
    return parse

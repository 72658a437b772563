"""The one error every input check raises: which field, and why, in one line."""

from __future__ import annotations

import re

# Room for a dotted path and a reason quoting a value; a 50 MB value must not become a 50 MB
# message (the REST API returns it, the CLI prints it).
MAX_FIELD_CHARS = 200
MAX_REASON_CHARS = 500


def _one_line(text: str, limit: int) -> str:
    # A line break shows as "\n": turned into a space, a key like "colour\nerror: fine" would print
    # as a second error message on the same line.
    text = str(text).replace("\r", "\\r").replace("\n", "\\n")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class SpecError(ValueError):
    """Input that cannot run: `field` is the dotted path into the spec (or the command-line
    option, or the file), `reason` says why. Both are one line and bounded in length."""

    def __init__(self, field: str, reason: str):
        self.field = _one_line(field, MAX_FIELD_CHARS)
        self.reason = _one_line(reason, MAX_REASON_CHARS)
        super().__init__(f"{self.field}: {self.reason}" if self.field else self.reason)


def first_line(exc: BaseException) -> str:
    """What an exception says, as one line: an OSError's reason and file, else the first line of
    its message, else its type's name (an exception raised without a message)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def loc_fields(loc: tuple | list) -> list[str]:
    """A pydantic error location as the fields it names: without the validator and union-member
    tags pydantic puts in it ("function-after[...]", "constrained-int", "list[literal[0,1]]")."""
    return [str(p) for p in loc if not str(p).startswith(("function-", "constrained-")) and "[" not in str(p)]


def settings_variable(exc: BaseException, prefix: str, default: str) -> str:
    """The environment variable a settings source could not decode: pydantic-settings names its field
    (`error parsing value for field "x"`), a RecursionError (JSON nested too deep) nothing, then `default`."""
    found = None if isinstance(exc, RecursionError) else re.search(r'field "(\w+)"', str(exc))
    return f"{prefix}{found.group(1).upper()}" if found else default

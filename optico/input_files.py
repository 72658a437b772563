"""Files a spec or a command names, read within bounds and checked before anything runs.

Spec YAML, replay CSV and calibration JSON all come from a user (or, through the REST API,
from anyone holding a token). Each is read here whole, once, at spec load: a size cap first
(`/dev/zero`, a 4 GB log), then regular-file, UTF-8 and no-NUL checks (a binary, a FIFO,
`/etc/shadow`), then the format. Errors are `SpecError(field, reason)` naming the field that
pointed at the file, so a broken file is one line at load time and never a traceback after
the job row exists.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from optico.errors import SpecError

MAX_SPEC_BYTES = 256 * 1024  # a full spec is a few KB
MAX_JSON_BYTES = 1024 * 1024  # a calibration is ~2 KB


def resolve(path_text: str, base_dir: Path | None) -> Path:
    """A path from a spec: `~` expanded, relative ones taken from `base_dir` (the spec's folder)."""
    path = Path(path_text)
    try:
        path = path.expanduser()
    except RuntimeError:  # "~nosuchuser/x": no home to expand; read as written, it is "no such file"
        pass
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path


def read_text(path: Path, field: str, what: str, max_bytes: int) -> str:
    """The file's text, or SpecError(field) saying why it is not a readable `what`."""
    try:
        # Opened first and checked by what was opened (fstat), so a file swapped for a FIFO or a
        # device after a check cannot slip through; O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SpecError(field, f"no such file: {path}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise SpecError(field, f"cannot read {path}: {_os_reason(exc)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SpecError(field, f"{path} is a directory, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(field, f"{path} is not a regular file (a device, pipe or socket), not a {what}")
        if info.st_size > max_bytes:
            raise SpecError(field, f"{path} is {info.st_size:,} bytes; a {what} may be at most {max_bytes:,}")
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(max_bytes + 1)  # st_size can lie (/proc); the read is bounded anyway
    except OSError as exc:
        raise SpecError(field, f"cannot read {path}: {_os_reason(exc)}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise SpecError(field, f"{path} is more than {max_bytes:,} bytes; a {what} may be at most {max_bytes:,}")
    return decode_text(data, field, f"{path}", what)


class DuplicateKeyError(ValueError):
    """A JSON object gives one key twice."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s object_pairs_hook for a JSON object whose keys appear once: a repeated key is an
    error, not "the last one wins" (a proxy, a log or a person may read the other copy)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"duplicate key {key[:60]!r}")
        out[key] = value
    return out


def json_problem(exc: Exception) -> str:
    """Why `json.loads` refused a text, in our words: Python's own messages for a huge integer or a deep
    nesting name its internals ("use sys.set_int_max_str_digits()", "recursion depth")."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "integer string conversion" in message:
        return "an integer with more than 4300 digits"
    return message[:200]


def decode_text(data: bytes, field: str, name: str, what: str) -> str:
    """UTF-8 text (a BOM allowed) without NUL characters, or SpecError(field)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # Excel's "Unicode text", Windows editors
        raise SpecError(field, f"{name} is UTF-16 text (it starts with a UTF-16 byte-order mark); save it as UTF-8")
    if b"\x00" in data:
        raise SpecError(field, f"{name} is binary (it holds NUL bytes), not a {what}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SpecError(field, f"{name} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}), "
                               f"not a {what}") from None


def _os_reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc).splitlines()[0]

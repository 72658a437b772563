"""Files only their owner may read: the pool and the run logs.

A pool holds every job's spec (environment values included) and every log a trial printed; a
run directory holds the command line and the logs. On a shared machine others must not read
them, so folders we create are 0700 and files 0600, whatever the umask.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Creates `path` (and missing parents) as 0700 folders; an existing folder is left as it is
    (it may be one the user chose and shares on purpose)."""
    missing = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(folder, DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=private_opener)`: a file created by the open is 0600 from the start."""
    return os.open(path, flags, FILE_MODE)


def write_private_text(path: Path, text: str) -> None:
    """Writes `text` to `path`, created 0600 (an existing file keeps its mode)."""
    with open(path, "w", encoding="utf-8", opener=private_opener) as handle:
        handle.write(text)


def create_private_file(path: Path) -> None:
    """Creates `path` empty and 0600 unless it exists (a new SQLite database is an empty file)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass

"""Where OptiCo keeps its files on this machine (the pool's SQLite file, trial run directories).

A module of its own so that launchers can find the data directory without importing the pool.
"""

from __future__ import annotations

import os
from pathlib import Path

from optico.private_files import private_dir

ENV_HOME = "OPTICO_HOME"


def default_data_dir(*, create: bool = True) -> Path:
    """$OPTICO_HOME, else $XDG_DATA_HOME/optico, else ~/.local/share/optico (created 0700: it holds
    the pool and the run logs, see `optico.private_files`; not created with `create=False`, for a
    lookup that must write nothing)."""
    if os.environ.get(ENV_HOME):
        path = Path(os.environ[ENV_HOME]).expanduser()
    elif os.environ.get("XDG_DATA_HOME"):
        path = Path(os.environ["XDG_DATA_HOME"]).expanduser() / "optico"
    else:
        path = Path.home() / ".local" / "share" / "optico"
    return private_dir(path) if create else path

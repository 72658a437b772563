"""Shared fixtures: an isolated pool database per test, the example specs, the shared data."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
SHARED_DATA = REPO.parent / "shared" / "data"
PACKAGED_OPTICO_CSV = REPO / "optico" / "data" / "optico_llama3_8b_a100.csv"


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pool.db'}"


@pytest.fixture
def cli_env(tmp_path: Path, db_url: str) -> dict[str, str]:
    """Environment for running `optico` in a subprocess against an isolated pool."""
    env = dict(os.environ)
    env["OPTICO_DATABASE_URL"] = db_url
    env["OPTICO_HOME"] = str(tmp_path / "home")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("COLUMNS", "200")
    return env


def optico_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "optico.cli", *args]

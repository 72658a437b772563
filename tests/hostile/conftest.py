"""The harness for hostile input: run `optico` in this process, capture everything, and check the
promise of issue 14 — a one-line `error: <field>: <reason>`, exit status 2, no traceback, nothing
written to the pool, within 5 s and 1 GB.

In-process (the CLI's own entry point, `optico.cli.run_cli`) keeps ~150 cases cheap; a few cases
also run in a subprocess under a hard 1 GiB address-space limit (`run_limited`)."""

from __future__ import annotations

import contextlib
import io
import os
import resource
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SECONDS = 5.0
MEMORY_BYTES = 1 << 30


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str
    seconds: float
    rss_growth: int  # bytes the process's peak RSS grew by during the run
    exception: BaseException | None = None


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run_in_process(args: list[str]) -> Outcome:
    """`optico ARGS` through the console entry point, in this process."""
    from optico.cli import run_cli

    out, err = io.StringIO(), io.StringIO()
    before, t0, caught = _peak_rss(), time.monotonic(), None
    code = -1
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = run_cli(args)
        except SystemExit as exc:  # not expected: run_cli returns its status
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # noqa: BLE001 - a traceback is exactly what we look for
            caught = exc
    return Outcome(code, out.getvalue(), err.getvalue(), time.monotonic() - t0, _peak_rss() - before, caught)


def run_limited(args: list[str], env: dict[str, str]) -> Outcome:
    """`optico ARGS` in a subprocess with its address space capped at 1 GiB and a 5 s wall clock."""
    def cap() -> None:  # pragma: no cover - runs in the child
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))

    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "optico.cli", *args], env=env, capture_output=True, text=True,
                              timeout=SECONDS * 3, preexec_fn=cap)
    except subprocess.TimeoutExpired as exc:
        return Outcome(-9, str(exc.stdout or ""), str(exc.stderr or ""), time.monotonic() - t0, 0)
    return Outcome(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0, 0)


def job_rows(db: Path) -> int:
    """Jobs in the SQLite pool at `db` (0 when the file or the table does not exist)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            return conn.execute("SELECT count(*) FROM optico_jobs").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def assert_refused(outcome: Outcome, db: Path, field: str | None = None, *, startup_s: float = 0.0) -> None:
    """The promise: one line naming the field, exit 2, no traceback, no job row, 5 s, 1 GB.
    `startup_s`: interpreter start-up a subprocess adds to the clock (not the command's time)."""
    assert outcome.exception is None, f"raised {type(outcome.exception).__name__}: {outcome.exception}"
    lines = outcome.stderr.strip().splitlines()
    assert outcome.code == 2, (outcome.code, outcome.stdout[-2000:], outcome.stderr[-2000:])
    assert "Traceback" not in outcome.stderr + outcome.stdout, outcome.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr[-2000:]
    if field is not None:
        assert lines[0].startswith(f"error: {field}"), lines[0]
    assert not lines[0].rstrip().endswith(":"), f"no reason given: {lines[0]}"
    assert outcome.seconds < SECONDS + startup_s, f"took {outcome.seconds:.1f} s"
    assert outcome.rss_growth < MEMORY_BYTES, f"peak RSS grew by {outcome.rss_growth >> 20} MiB"
    assert job_rows(db) == 0, "a job row was written"


@pytest.fixture
def pool_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated pool (its SQLite path is returned), an isolated data dir, 80 columns, no
    calibration or LLM settings from the caller's environment."""
    db = tmp_path / "pool.db"
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{db}")
    monkeypatch.setenv("OPTICO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "80")
    for name in list(os.environ):
        if name.startswith("OPTICO_LLM_") or name == "OPTICO_CALIBRATION":
            monkeypatch.delenv(name)
    return db

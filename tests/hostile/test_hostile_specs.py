"""Hostile specs: every one a one-line error naming its field, exit 2, no traceback, no job row,
within 5 s and 1 GB (`conftest.assert_refused`). The table is in `cases.py`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile.cases import CASES, GOOD, REPLAY, TINY_CPU, Case, edit
from tests.hostile.conftest import assert_refused, run_in_process, run_limited

# The most expensive families again in a subprocess under a hard 1 GiB address-space limit.
LIMITED = ["50 MB name", "20000 nested lists", "alias bomb in runtime_env", "5000-digit integer",
           "replay CSV is /dev/zero", "replay CSV of 9 MB", "calibration nested 100000 deep",
           "all-invalid space of 196,608"]


def test_the_table_is_large_enough():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_spec_is_refused_in_one_line(case: Case, tmp_path: Path, pool_env: Path):
    spec = case.write(tmp_path)
    outcome = run_in_process(["tune", str(spec)])
    assert_refused(outcome, pool_env, case.field)


@pytest.mark.parametrize("name", LIMITED)
def test_hostile_spec_within_a_hard_memory_limit(name: str, tmp_path: Path, pool_env: Path):
    case = next(c for c in CASES if c.id == name)
    spec = case.write(tmp_path)
    outcome = run_limited(["tune", str(spec)], dict(os.environ))
    # the clock includes the interpreter's start and imports (~1-2 s on a loaded 2-core machine)
    assert_refused(outcome, pool_env, case.field, startup_s=3.0)


@pytest.mark.parametrize("where", ["loop", "~no-such-user-x/f"])
@pytest.mark.parametrize("base, field", [(REPLAY, "launcher.data"), (GOOD, "calibration"),
                                         (edit(TINY_CPU, "launcher", {"kind": "local"}), "launcher.run_dir")])
def test_a_path_that_cannot_resolve_is_refused_in_one_line(base, field: str, where: str, tmp_path: Path,
                                                          pool_env: Path):
    # A symlink loop made Path.resolve() raise RuntimeError, and "~user" of no such user made
    # expanduser() raise it: a traceback (exit 1), not an error naming the field.
    (tmp_path / "loop").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop")
    path = str(tmp_path / where) if where == "loop" else where
    spec = Case(f"{field} {where}", edit(base, field, path + ("/runs" if field == "launcher.run_dir" else "")),
                field).write(tmp_path)
    assert_refused(run_in_process(["tune", str(spec)]), pool_env, field)


def test_a_resumed_job_whose_replay_csv_was_swapped_for_a_fifo_is_refused_in_one_line(tmp_path: Path,
                                                                                     pool_env: Path):
    # The CSV was checked at submission; swapped for a FIFO since, a resume failed the job (exit 1)
    # instead of refusing the input (exit 2) before anything ran.
    from tests.hostile.cases import PAPER_CSV

    spec = Case("replay", REPLAY, "launcher.data", {"runs.csv": PAPER_CSV.encode()}).write(tmp_path)
    submitted = run_in_process(["jobs", "submit", str(spec)])
    assert submitted.code == 0, submitted.stderr
    (tmp_path / "runs.csv").unlink()
    os.mkfifo(tmp_path / "runs.csv")
    outcome = run_in_process(["tune", "--resume", "1"])
    assert outcome.code == 2 and outcome.exception is None, (outcome.code, outcome.stderr)
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: launcher.data") and "not a regular file" in lines[0], lines
    assert outcome.seconds < 5

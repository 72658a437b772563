"""Hostile specs: every one a one-line error naming its field, exit 2, no traceback, no job row,
within 5 s and 1 GB (`conftest.assert_refused`). The table is in `cases.py`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hostile.cases import CASES, Case
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

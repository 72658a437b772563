"""`optico schedule ...` on a SQLite pool: one-line errors and exit 2 on bad input (the commands run in this
process through typer's runner: a subprocess costs seconds of imports each), and run-now's JSON outcome
across an upgrade of the simulated cluster as a user runs it (real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from retune_testkit import UPGRADE_ENV, sim_spec
from typer.testing import CliRunner

from optico.cli import app


@pytest.fixture
def run(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
    env.update(OPTICO_DATABASE_URL=f"sqlite:///{tmp_path / 'pool.db'}", OPTICO_HOME=str(tmp_path / "home"),
               COLUMNS="200", PYTHONUNBUFFERED="1")

    def optico(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "optico.cli", "schedule", *args], env={**env, **extra},
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    return optico


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "nightly.yaml"
    path.write_text(yaml.safe_dump(sim_spec("nightly", max_trials=4)))
    return path


@pytest.fixture
def run_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{tmp_path / 'pool.db'}")
    monkeypatch.setenv("OPTICO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def optico(*args: str):
        return runner.invoke(app, ["schedule", *args])
    return optico


def test_bad_input_is_one_line_and_exit_2(run_here, spec_file: Path, tmp_path: Path) -> None:
    run = run_here
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump({**sim_spec(), "budget": {"max_trials": -1}}))
    cases = [
        (("add", "n", "--spec", str(spec_file), "--cron", "61 * * * *"), "error: --cron: '61 * * * *' is not a valid"),
        (("add", "n", "--spec", str(spec_file), "--cron", "0 2 * *"), "error: --cron: '0 2 * *' has 4 fields"),
        (("add", "n", "--spec", str(tmp_path / "none.yaml")), "error: --spec: no such spec file"),
        (("add", "n", "--spec", str(broken)), "error: budget.max_trials:"),
        (("add", "bad name", "--spec", str(spec_file)), "error: name: 'bad name' must be"),
        (("add", "nl\n", "--spec", str(spec_file)), "error: name: 'nl\\n' must be"),  # '$' took the newline
        # A name is how a schedule is looked up, so it cannot be kept masked: a credential is refused.
        (("add", "ghp_" + "a1B2" * 9, "--spec", str(spec_file)), "error: name: looks like a credential"),
        (("add", "n", "--spec", str(spec_file), "--max-trials", "0"), "error: --max-trials: must be 1 to 10,000"),
        (("add", "n", "--spec", str(spec_file), "--webhook", "file:///etc/passwd"), "error: --webhook: must be an"),
        (("remove", "nope"), "error: schedule: no schedule named 'nope'"),
        (("show", "nope"), "error: schedule: no schedule named 'nope'"),
        (("run-now", "nope"), "error: schedule: no schedule named 'nope'"),
        (("run-now", "nope", "--json", "/etc/hostname/out.json"), "error: --json: cannot create"),  # under a file
    ]
    for args, message in cases:
        done = run(*args)
        assert done.exit_code == 2, (args, done.stdout, done.stderr)
        assert done.stderr.strip().startswith(message), (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    assert run("add", "n", "--spec", str(spec_file)).exit_code == 0
    taken = run("add", "n", "--spec", str(spec_file))
    assert taken.exit_code == 2 and taken.stderr.startswith("error: name: a schedule named 'n' exists")


def test_add_list_run_now_across_an_upgrade_then_remove(run, run_here, spec_file: Path, tmp_path: Path) -> None:
    added = run_here("add", "nightly", "--spec", str(spec_file), "--cron", "15 1 * * *", "--max-trials", "4")
    assert added.exit_code == 0 and "cron '15 1 * * *'" in added.stdout, added.stderr
    listed = run_here("list")
    assert "nightly" in listed.stdout and "15 1 * * *" in listed.stdout

    outcomes = []
    for version in (None, "25.01", "25.01"):  # a fresh process each, as cron or a person would run it
        out = tmp_path / f"tick{len(outcomes)}.json"
        done = run("run-now", "nightly", "--json", str(out), **({UPGRADE_ENV: version} if version else {}))
        assert done.returncode == 0, done.stderr
        outcomes.append(json.loads(out.read_text()))
    first, upgraded, again = outcomes
    keys = {"outcome", "fingerprint_changed", "incumbent", "regression_pct", "retune_job_id", "new_best_mfu"}
    assert all(keys <= set(o) and set(o["incumbent"]) == {"mfu_before", "mfu_after"} for o in outcomes)
    assert first["outcome"] == "first-tune" and first["retune_job_id"] == 1 and first["new_best_mfu"] > 0
    assert upgraded["outcome"] in ("regression", "improvement") and upgraded["fingerprint_changed"] is True
    assert upgraded["incumbent"]["mfu_before"] == first["new_best_mfu"]
    assert upgraded["retune_job_id"] == 2 and upgraded["new_best_mfu"] > 0
    assert abs(upgraded["regression_pct"]) > upgraded["noise_pct"]
    assert again["outcome"] == "no-change" and again["retune_job_id"] is None and again["fingerprint_changed"] is False

    shown = run_here("show", "nightly")
    assert shown.exit_code == 0 and upgraded["outcome"] in shown.stdout and "framework_version 25.01" in shown.stdout
    narrow = run("show", "nightly", COLUMNS="80").stdout  # the history, every figure whole, in 80 columns
    rows = narrow[narrow.index("tick "):].splitlines()
    assert len(rows) == 5 and all(len(r) <= 80 and "…" not in r for r in rows), narrow
    assert upgraded["outcome"] in narrow and f"{100 * upgraded['new_best_mfu']:.1f}" in narrow
    assert run_here("remove", "nightly").exit_code == 0
    assert "nightly" not in run_here("list").stdout


def test_text_from_the_spec_and_the_probe_is_shown_literally_never_as_markup(run_here, tmp_path: Path) -> None:
    """A model's name and a framework version come from the spec (or a probed image tag): Rich markup in
    them ('[/x]' closes nothing and raised a MarkupError traceback, after `add` had already written the
    schedule) is printed as the text it is."""
    body = sim_spec("marked", max_trials=2, version="[/x]24.10[link=http://evil.example]")
    body["workload"]["model"] = {"preset": "llama3-8b", "name": "m[/x][bold red]X"}
    path = tmp_path / "marked.yaml"
    path.write_text(yaml.safe_dump(body))
    added = run_here("add", "marked", "--spec", str(path))
    assert added.exit_code == 0, added.output
    assert "m[/x][bold red]X seq 8192" in added.stdout
    listed = run_here("list")
    assert listed.exit_code == 0 and "m[/x][bold" in listed.stdout, listed.output
    assert run_here("run-now", "marked").exit_code == 0
    shown = run_here("show", "marked")
    assert shown.exit_code == 0, shown.output
    assert "framework_version [/x]24.10[link=http://evil.example]" in shown.stdout

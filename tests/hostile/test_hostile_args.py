"""Hostile command lines: every one a one-line error naming the option, exit 2, no traceback, no job
row, within 5 s and 1 GB — checked before a job could be created, so a valid spec is used where the
spec is not the point."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.hostile.cases import GOOD
from tests.hostile.conftest import assert_refused, job_rows, run_in_process, run_limited

import yaml


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "good.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    return str(path)


def _dangling(tmp_path: Path) -> str:
    link = tmp_path / "result.json"
    link.symlink_to(tmp_path / "gone" / "result.json")
    return str(link)


def _not_a_db(tmp_path: Path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    return str(path)


# (id, argv builder given (spec path, tmp_path), the field the error names)
ARGS = [
    ("mysql URL", lambda s, t: ["tune", s, "--database", "mysql://root:hunter2@db/optico"], "--database"),
    ("not a URL", lambda s, t: ["tune", s, "--database", "::::"], "--database"),
    ("sqlite under a file", lambda s, t: ["tune", s, "--database", "sqlite:////etc/hostname/pool.db"], "--database"),
    ("sqlite file that is not a database", lambda s, t: ["tune", s, "--database", f"sqlite:///{_not_a_db(t)}"],
     "--database"),
    ("sqlite path is a directory", lambda s, t: ["tune", s, "--database", f"sqlite:///{t}"], "--database"),
    # In memory: each connection (the command's, the job runner's) would see its own empty database.
    ("sqlite in memory", lambda s, t: ["tune", s, "--database", "sqlite://"], "--database"),
    ("sqlite in memory, URI form", lambda s, t: ["tune", s, "--database", "sqlite:///file:x?mode=memory&uri=true"],
     "--database"),
    # With options SQLite opened "pool.db?cache=shared" (mode 0644) beside the private pool.db.
    ("sqlite URL with options", lambda s, t: ["tune", s, "--database", f"sqlite:///{t}/pool.db?cache=shared&uri=true"],
     "--database"),
    ("token list in memory", lambda s, t: ["token", "list", "--database", "sqlite:///:memory:"], "--database"),
    ("postgres server not there", lambda s, t: ["tune", s, "--database", "postgresql://u:s3cret@127.0.0.1:1/x"],
     "--database"),
    ("--json under a file", lambda s, t: ["tune", s, "--json", "/etc/hostname/result.json"], "--json"),
    ("--json is a directory", lambda s, t: ["tune", s, "--json", str(t)], "--json"),
    # os.access says yes to root there; no file can be made in it (it failed after the whole job)
    ("--json under /proc", lambda s, t: ["tune", s, "--json", "/proc/optico-nowhere/result.json"], "--json"),
    ("--json a symbolic link to nothing", lambda s, t: ["tune", s, "--json", _dangling(t)], "--json"),
    ("jobs export --out a symbolic link to nothing", lambda s, t: ["jobs", "export", "1", "--out", _dangling(t)],
     "--out"),
    ("jobs export without --out", lambda s, t: ["jobs", "export", "1"], "--out"),
    ("token create without --scope", lambda s, t: ["token", "create", "someone"], "--scope"),
    ("schedule add without --spec", lambda s, t: ["schedule", "add", "n1"], "--spec"),
    ("jobs show without an id", lambda s, t: ["jobs", "show"], "JOB_ID"),
    ("--max-trials negative", lambda s, t: ["tune", s, "--max-trials", "-1"], "--max-trials"),
    ("--max-trials huge", lambda s, t: ["tune", s, "--max-trials", "1" + "0" * 30], "--max-trials"),
    ("--max-trials float", lambda s, t: ["tune", s, "--max-trials", "2.5"], "--max-trials"),
    ("--seed negative", lambda s, t: ["tune", s, "--seed", "-5"], "--seed"),
    ("--seed not a number", lambda s, t: ["tune", s, "--seed", "abc"], "--seed"),
    # int() reads '1_0' as 10 and takes '+2', ' 2'; typer took '2.0': a count is plain digits, as an id is.
    ("--max-trials with an underscore", lambda s, t: ["tune", s, "--max-trials", "1_0"], "--max-trials"),
    ("--max-trials with a sign", lambda s, t: ["tune", s, "--max-trials", "+2"], "--max-trials"),
    ("--max-trials written as a float", lambda s, t: ["tune", s, "--max-trials", "2.0"], "--max-trials"),
    ("--seed in Unicode digits", lambda s, t: ["tune", s, "--seed", "\u0662"], "--seed"),
    ("jobs list --limit with a space", lambda s, t: ["jobs", "list", "--limit", " 5"], "--limit"),
    ("schedule --max-trials with an underscore", lambda s, t: ["schedule", "add", "n2", "--spec", s, "--max-trials",
                                                               "1_0"], "--max-trials"),
    ("serve --port with an underscore", lambda s, t: ["serve", "--port", "80_80"], "--port"),
    ("--resume zero", lambda s, t: ["tune", "--resume", "0"], "--resume"),
    ("--resume beyond SQL integers", lambda s, t: ["tune", "--resume", "9" * 25], "--resume"),
    ("--resume and a spec", lambda s, t: ["tune", s, "--resume", "1"], "--resume"),
    ("--launcher unknown", lambda s, t: ["tune", s, "--launcher", "slurm"], "--launcher"),
    ("--launcher replay without data", lambda s, t: ["tune", s, "--launcher", "replay"], "--launcher"),
    ("--launcher local without GPUs", lambda s, t: ["tune", s, "--launcher", "local"], "workload.cluster.gpu"),
    ("--reasoner unknown", lambda s, t: ["tune", s, "--reasoner", "gpt-9"], "--reasoner"),
    ("--reasoner openai without settings", lambda s, t: ["tune", s, "--reasoner", "openai"], "reasoner model-guided"),
    ("unknown option", lambda s, t: ["tune", s, "--turbo"], "--turbo"),
    ("no spec", lambda s, t: ["tune"], "SPEC.yaml"),
    ("two specs", lambda s, t: ["tune", s, s], "optico tune"),
    ("spec is a directory", lambda s, t: ["tune", str(t)], None),
    ("spec is /dev/zero", lambda s, t: ["tune", "/dev/zero"], "zero"),
    ("spec with a NUL in its path", lambda s, t: ["tune", s + "\0.yaml"], None),
    ("jobs show negative id", lambda s, t: ["jobs", "show", "-1"], "-1: a negative number"),
    ("jobs export negative id", lambda s, t: ["jobs", "export", "-1", "--out", str(t / "x.csv")], "-1: a negative"),
    ("jobs show huge id", lambda s, t: ["jobs", "show", "1" + "0" * 25], "JOB_ID"),
    ("jobs show unknown id", lambda s, t: ["jobs", "show", "999"], "JOB_ID"),
    ("jobs show --iteration 0", lambda s, t: ["jobs", "show", "1", "--iteration", "0"], "--iteration"),
    ("jobs cancel huge id", lambda s, t: ["jobs", "cancel", "9" * 25], "JOB_ID"),
    ("jobs show id beyond 32-bit integers", lambda s, t: ["jobs", "show", str(2**31)], "JOB_ID"),
    ("jobs budget huge id", lambda s, t: ["jobs", "budget", "9" * 25, "--max-trials", "3"], "JOB_ID"),
    ("jobs budget unknown id", lambda s, t: ["jobs", "budget", "999", "--max-trials", "3"], "JOB_ID"),
    ("jobs budget --max-trials beyond a spec's", lambda s, t: ["jobs", "budget", "1", "--max-trials", "999999999"],
     "--max-trials"),
    ("jobs budget --gpu-hours nan", lambda s, t: ["jobs", "budget", "1", "--gpu-hours", "nan"], "--gpu-hours"),
    # float() reads '1_0' as 10 and takes ' 2' and '+2': a budget is a plain decimal.
    ("jobs budget --gpu-hours with an underscore", lambda s, t: ["jobs", "budget", "1", "--gpu-hours", "1_0"],
     "--gpu-hours"),
    ("jobs budget --gpu-hours with a sign", lambda s, t: ["jobs", "budget", "1", "--gpu-hours", "+2"], "--gpu-hours"),
    ("jobs budget --gpu-hours 1e999", lambda s, t: ["jobs", "budget", "1", "--gpu-hours", "1e999"], "--gpu-hours"),
    ("perfmodel --prior with an underscore", lambda s, t: ["perfmodel", "calibrate", "--data", "x.csv",
                                                           "--prior", "1_0"], "--prior"),
    ("jobs cancel unknown id", lambda s, t: ["jobs", "cancel", "999"], "JOB_ID"),
    ("spec path too long for the file system", lambda s, t: ["tune", str(t / ("a" * 300 + ".yaml"))], None),
    ("--json path too long for the file system", lambda s, t: ["tune", s, "--json", str(t / ("a" * 300))],
     "--json"),
    ("schedule --max-trials beyond 64 bits", lambda s, t: ["schedule", "add", "n1", "--spec", s, "--max-trials",
                                                           str(2**63)], "--max-trials"),
    ("schedule --webhook broken IPv6", lambda s, t: ["schedule", "add", "n1", "--spec", s, "--webhook",
                                                     "http://[::1"], "--webhook"),
    ("schedule --cron far too long", lambda s, t: ["schedule", "add", "n1", "--spec", s, "--cron",
                                                   "1," * 300 + "1 * * * *"], "--cron"),
    ("jobs resume id 0", lambda s, t: ["jobs", "resume", "0"], "JOB_ID"),
    ("serve with a dead database", lambda s, t: ["serve", "--database", "postgresql://u:hunter2@127.0.0.1:1/x"],
     "--database"),
    ("serve --log-level unknown", lambda s, t: ["serve", "--log-level", "bogus"], "--log-level"),
    # Resolved before a pool is opened or a worker started (uvicorn found out after its workers ran).
    ("serve --host with control characters", lambda s, t: ["serve", "--host", "\x1b[31m"], "--host"),
    ("serve --host that does not resolve", lambda s, t: ["serve", "--host", "no-such-host.invalid"], "--host"),
    ("worker with a dead database", lambda s, t: ["worker", "--database", "postgresql://u:hunter2@127.0.0.1:1/x"],
     "--database"),
    ("jobs list --limit 0", lambda s, t: ["jobs", "list", "--limit", "0"], "--limit"),
    ("jobs list --limit huge", lambda s, t: ["jobs", "list", "--limit", "9" * 20], "--limit"),
    ("unknown command", lambda s, t: ["jobs", "lst"], "optico jobs"),
    ("db upgrade with a mysql URL", lambda s, t: ["db", "upgrade", "--database", "mysql://db/x"], "--database"),
    ("db upgrade of a text file", lambda s, t: ["db", "upgrade", "--database", f"sqlite:///{_not_a_db(t)}"],
     "--database"),
    ("perfmodel --data is /etc/passwd", lambda s, t: ["perfmodel", "evaluate", "--data", "/etc/passwd"], "--data"),
    ("perfmodel --data binary", lambda s, t: ["perfmodel", "evaluate", "--data", "/bin/sh"], "--data"),
    ("perfmodel --calibration not JSON", lambda s, t: ["perfmodel", "evaluate", "--data", str(
        Path(__file__).resolve().parents[2] / "optico" / "data" / "optico_llama3_8b_a100.csv"),
        "--calibration", "/etc/passwd"], "--calibration"),
    # A path is written back normalized ("https:/u:p@h"): the password in it is masked all the same.
    ("spec path a URL with a password", lambda s, t: ["tune", "https://bob:hunter2@x.example.com/spec.yaml"], None),
    ("--landscape a URL with a password", lambda s, t: ["bench", "--landscape",
                                                         "https://bob:hunter2@x.example.com/t.csv"], "--landscape"),
    ("perfmodel --data a URL with a password", lambda s, t: ["perfmodel", "evaluate", "--data",
                                                             "postgresql://admin:hunter2@db.example.com/x"], "--data"),
    ("perfmodel calibrate --max-evals negative", lambda s, t: ["perfmodel", "calibrate", "--data", "x.csv",
                                                               "--max-evals", "-3"], "--max-evals"),
]


@pytest.mark.parametrize("case", ARGS, ids=[a[0] for a in ARGS])
def test_hostile_arguments_are_refused_in_one_line(case, spec: str, tmp_path: Path, pool_env: Path):
    _, argv, field = case
    outcome = run_in_process(argv(spec, tmp_path))
    assert_refused(outcome, pool_env, field)
    assert "hunter2" not in outcome.stderr and "s3cret" not in outcome.stderr  # passwords never printed


# int() reads "1_0" as 10 and takes "+1" and " 1": each once looked up (or acted on) another job.
@pytest.mark.parametrize("argv, field", [
    (["jobs", "show", "1_0"], "JOB_ID"),
    (["jobs", "show", "+1"], "JOB_ID"),
    (["jobs", "show", " 1"], "JOB_ID"),
    (["jobs", "show", "1.0"], "JOB_ID"),
    (["jobs", "show", "1", "--iteration", "1_0"], "--iteration"),
    (["jobs", "export", "1_0", "--out", "x.csv"], "JOB_ID"),
    (["jobs", "cancel", "1_0"], "JOB_ID"),
    (["jobs", "stop", "+1"], "JOB_ID"),
    (["jobs", "resume", "1_0"], "JOB_ID"),
    (["jobs", "budget", "1_0", "--max-trials", "3"], "JOB_ID"),
    (["tune", "--resume", "1_0"], "--resume"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_ids_are_plain_decimal_digits(argv: list[str], field: str, pool_env: Path):
    outcome = run_in_process(argv)
    assert_refused(outcome, pool_env, field)
    assert "is not an id" in outcome.stderr and "no job" not in outcome.stderr, outcome.stderr


def test_a_sqlite_url_with_options_creates_no_file(spec: str, tmp_path: Path, pool_env: Path):
    # SQLAlchemy opened "pool.db?cache=shared" (0644, the whole pool) beside the private pool.db (the
    # checkpointer's): the pool split in two, one of them readable by everyone.
    outcome = run_in_process(["tune", spec, "--database", f"sqlite:///{tmp_path}/pool.db?cache=shared&uri=true"])
    assert_refused(outcome, pool_env, "--database")
    assert "takes no options" in outcome.stderr and not list(tmp_path.glob("pool.db*"))


def test_the_table_is_large_enough():
    assert len(ARGS) >= 15


def test_missing_postgres_driver(spec: str, pool_env: Path, monkeypatch: pytest.MonkeyPatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "psycopg" else real(name, *a))
    outcome = run_in_process(["tune", spec, "--database", "postgresql://u@db/optico"])
    assert_refused(outcome, pool_env, "--database")
    assert "psycopg" in outcome.stderr


def test_environment_variables_are_inputs_too(spec: str, tmp_path: Path, pool_env: Path,
                                              monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPTICO_CALIBRATION", "/etc/passwd")
    assert_refused(run_in_process(["tune", spec]), pool_env, "OPTICO_CALIBRATION")
    monkeypatch.delenv("OPTICO_CALIBRATION")
    monkeypatch.delenv("OPTICO_DATABASE_URL")
    monkeypatch.setenv("OPTICO_HOME", "/etc/hostname/optico")  # a data dir that cannot be created
    assert_refused(run_in_process(["jobs", "list"]), pool_env, "OPTICO_HOME")


@pytest.mark.parametrize(("variable", "value"), [
    ("OPTICO_LEASE_S", "abc"), ("OPTICO_LEASE_S", "nan"), ("OPTICO_LEASE_S", "1e999"), ("OPTICO_LEASE_S", "0"),
    ("OPTICO_LEASE_S", "-5"), ("OPTICO_LEASE_RENEW_S", "abc"), ("OPTICO_LEASE_RENEW_S", "0"),
    ("OPTICO_LEASE_RENEW_S", "120"),  # longer than the lease
])
def test_a_lease_setting_out_of_bounds_is_refused_before_the_job_is_created(
        variable: str, value: str, spec: str, pool_env: Path, monkeypatch: pytest.MonkeyPatch):
    """A traceback after the job row was written left the job queued, for a worker to run later."""
    monkeypatch.setenv(variable, value)
    assert_refused(run_in_process(["tune", spec]), pool_env, variable)


def test_serve_on_a_port_in_use_is_refused_before_any_worker_starts(spec: str, pool_env: Path):
    """uvicorn binds after its startup: a port in use was found once the workers had claimed the
    queued job, which was left interrupted."""
    import socket

    from optico.pool.store import SqlStore
    from optico.spec import load_spec

    with SqlStore(f"sqlite:///{pool_env}") as store:
        job = store.create_job(load_spec(spec))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        outcome = run_in_process(["serve", "--port", str(taken.getsockname()[1])])
    assert outcome.code == 2 and outcome.stderr.startswith("error: --port: cannot listen on 127.0.0.1:"), outcome.stderr
    with SqlStore(f"sqlite:///{pool_env}") as store:
        assert store.get_job(job).status.value == "queued"


def test_a_hostile_url_in_a_hard_memory_limit(spec: str, tmp_path: Path, pool_env: Path):
    outcome = run_limited(["tune", spec, "--database", "mysql://root:hunter2@db/optico"], dict(os.environ))
    assert_refused(outcome, pool_env, "--database", startup_s=3.0)
    assert job_rows(pool_env) == 0 and "hunter2" not in outcome.stderr


@pytest.mark.parametrize("argv", [["tune", "--resume", "999"], ["jobs", "cancel", "999"],
                                  ["jobs", "budget", "999", "--max-trials", "3"]])
def test_a_lookup_of_a_job_in_a_pool_that_does_not_exist_creates_no_pool(argv, pool_env: Path):
    outcome = run_in_process(argv)
    assert_refused(outcome, pool_env, "--resume" if argv[0] == "tune" else "JOB_ID")
    assert "no job 999" in outcome.stderr and not pool_env.exists()


@pytest.mark.parametrize("argv", [["jobs", "list"], ["schedule", "list"], ["token", "list"],
                                  ["schedule", "run-now", "nightly"], ["schedule", "show", "nightly"],
                                  ["jobs", "show", "1"]])
def test_lookups_and_listings_create_no_pool(argv: list[str], pool_env: Path):
    outcome = run_in_process(argv)
    assert outcome.exception is None and "Traceback" not in outcome.stderr
    assert outcome.code in (0, 2) and "no pool" in outcome.stdout + outcome.stderr, outcome
    assert not pool_env.exists(), "a lookup created the pool"


@pytest.mark.parametrize("argv", [["jobs", "show", "1"], ["jobs", "list"], ["token", "list"],
                                  ["schedule", "show", "nightly"]])
def test_lookups_on_the_default_pool_create_no_data_directory(argv: list[str], pool_env: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    # The pool was not created, but its empty 0700 data directory was.
    monkeypatch.delenv("OPTICO_DATABASE_URL")
    home = tmp_path / "nohome"
    monkeypatch.setenv("OPTICO_HOME", str(home))
    outcome = run_in_process(argv)
    assert outcome.code in (0, 2) and "no pool" in outcome.stdout + outcome.stderr, outcome
    assert not home.exists(), "a lookup created the data directory"


def test_jobs_stop_cancels_a_queued_job_and_stops_a_running_one_like_the_api(spec: str, pool_env: Path):
    from optico.pool.lifecycle import JobStatus
    from optico.pool.store import SqlStore

    assert run_in_process(["jobs", "submit", spec]).code == 0
    assert run_in_process(["jobs", "submit", spec]).code == 0
    with SqlStore(f"sqlite:///{pool_env}") as store:
        running = store.claim_job("w1", 60)  # the oldest: job 1
    stopped = run_in_process(["jobs", "stop", "1"])
    queued = run_in_process(["jobs", "stop", "2"])
    assert (stopped.code, queued.code) == (0, 0), (stopped, queued)
    assert "job 1 is stopping" in stopped.stdout and "job 2 is cancelled" in queued.stdout
    with SqlStore(f"sqlite:///{pool_env}") as store:
        assert running.id == 1 and store.get_job(1).status is JobStatus.STOPPING
        assert store.get_job(2).stop_reason == "stopped before it started (CLI)"


def test_a_written_file_has_the_permissions_a_plain_write_gives(tmp_path: Path) -> None:
    """Written through a temporary file (0600), the result still gets the umask's mode, or the
    earlier file's: an exported CSV is for the team to read."""
    from optico.terminal import output_file

    mask = os.umask(0o022)
    try:
        with output_file(tmp_path / "new.csv", "--out") as f:
            f.write("a\n")
        earlier = tmp_path / "earlier.csv"
        earlier.write_text("old\n")
        earlier.chmod(0o640)
        with output_file(earlier, "--out") as f:
            f.write("new\n")
    finally:
        os.umask(mask)
    assert (tmp_path / "new.csv").stat().st_mode & 0o777 == 0o644
    assert earlier.stat().st_mode & 0o777 == 0o640 and earlier.read_text() == "new\n"


def test_a_write_that_fails_at_the_end_is_one_line_and_leaves_the_earlier_file(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 capsys: pytest.CaptureFixture):
    import errno

    import typer

    from optico.terminal import output_file

    target = tmp_path / "result.json"
    target.write_text("the earlier result\n")

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # the disk fills as the file is moved into place
    with pytest.raises(typer.Exit) as stop:
        with output_file(target, "--json") as f:
            f.write("{}\n")
    assert stop.value.exit_code == 2
    assert capsys.readouterr().err.strip().startswith("error: --json: cannot write")
    assert target.read_text() == "the earlier result\n" and sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_a_list_setting_that_is_no_json_is_one_line(command: str, pool_env: Path, monkeypatch: pytest.MonkeyPatch):
    # A bare directory in OPTICO_FILE_ROOTS (a JSON list) failed before validation, with a traceback.
    monkeypatch.setenv("OPTICO_FILE_ROOTS", "/data/optico")
    outcome = run_in_process([command])
    assert_refused(outcome, pool_env, "OPTICO_FILE_ROOTS")
    assert "JSON" in outcome.stderr

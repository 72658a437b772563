"""The first hour as a user: where files go (and who may read them), what `tune` and `jobs` print at 80
columns, a job whose worker died, `jobs show` filters, the spec-parsing entry point the REST API
shares, devices checked before a run, impossible measurements refused."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.conftest import EXAMPLES
from tests.hostile.cases import GOOD
from tests.hostile.conftest import run_in_process


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory):
    """One short tuning job on the defaults (no --database: the data dir), run as a newcomer would."""
    home = tmp_path_factory.mktemp("first") / "home"
    saved = {k: os.environ.get(k) for k in ("OPTICO_HOME", "OPTICO_DATABASE_URL", "COLUMNS")}
    os.environ["OPTICO_HOME"] = str(home)
    os.environ.pop("OPTICO_DATABASE_URL", None)
    os.environ["COLUMNS"] = "80"
    out = home.parent / "out" / "result.json"
    try:
        outcome = run_in_process(["tune", str(EXAMPLES / "llama3-8b-a100.yaml"), "--max-trials", "3",
                                  "--json", str(out)])
        listed = run_in_process(["jobs", "list"])
        shown = run_in_process(["jobs", "show", "1", "--agent", "analysis"])
        iteration = run_in_process(["jobs", "show", "1", "--iteration", "2"])
        unknown_agent = run_in_process(["jobs", "show", "1", "--agent", "oracle"])
        no_iteration = run_in_process(["jobs", "show", "1", "--iteration", "999"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return SimpleNamespace(home=home, out=out, tune=outcome, listed=listed, shown=shown, iteration=iteration,
                           unknown_agent=unknown_agent, no_iteration=no_iteration)


def test_the_pool_is_private_and_announced(first_run):
    assert first_run.tune.code == 0, first_run.tune.stderr
    home = first_run.home
    assert _mode(home) == 0o700
    for path in home.glob("optico.db*"):  # the database and SQLite's -wal/-shm files
        assert _mode(path) == 0o600, path
    text = first_run.tune.stdout
    assert f"pool: sqlite:///{home}/optico.db" in text
    assert "run logs: none: the sim launcher starts no process" in text


def test_tune_fits_80_columns_and_keeps_words_whole(first_run):
    lines = first_run.tune.stdout.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    # the flags wrap between flags, each line a shell continuation
    flags = [line for line in lines if line.startswith("  --")]
    assert flags and all(line.endswith(" \\") for line in flags[:-1])
    assert " ".join(line.rstrip(" \\").strip() for line in flags).count("--tensor-model-parallel-size") == 1


def test_json_result_names_each_trial_log(first_run):
    result = json.loads(first_run.out.read_text())
    assert all("log_path" in t for t in result["trials"])


def test_jobs_list_is_one_row_per_job_at_80_columns(first_run):
    rows = [line for line in first_run.listed.stdout.splitlines() if line.strip()]
    assert first_run.listed.code == 0 and len(rows) == 3, rows  # header, rule, one job
    assert all(len(line) <= 80 for line in rows)
    # Only the free text (name, stop reason) gives way: the figures are never cut.
    assert rows[0].split()[:4] == ["id", "name", "status", "trials"], rows[0]
    trials = json.loads(first_run.out.read_text())["trials"]
    best = max(t["metrics"]["mfu"] for t in trials if t["metrics"])
    assert rows[2].split()[0] == "1" and " succeeded " in rows[2] and f" {best:.1%} " in rows[2], rows[2]


def test_jobs_show_filters(first_run):
    shown = first_run.shown.stdout
    assert "· analysis ·" in shown and "· generation ·" not in shown and "· guard ·" not in shown
    iteration = first_run.iteration.stdout
    assert "iteration 2 ·" in iteration and "iteration 3 ·" not in iteration
    assert first_run.unknown_agent.code == 2
    assert first_run.unknown_agent.stderr.startswith("error: --agent: no messages from 'oracle'")
    assert first_run.unknown_agent.stdout == ""  # refused before the job is printed
    assert first_run.no_iteration.code == 2 and first_run.no_iteration.stdout == ""
    assert first_run.no_iteration.stderr.startswith("error: --iteration: job 1 has no iteration 999; its iterations: 1 to ")


def test_a_job_whose_worker_died_says_so_and_how_to_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from optico.pool.store import SqlStore
    from tests.pool.pool_testkit import make_spec

    db = tmp_path / "pool.db"
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{db}")
    with SqlStore(f"sqlite:///{db}") as store:
        alive = store.create_job(make_spec("alive"))
        dead = store.create_job(make_spec("dead"))
        for job in (alive, dead):
            store.claim_job(f"worker-{job}", 600, job_id=job)
    with sqlite3.connect(db) as conn:  # the dead one's worker stopped renewing its lease a day ago
        conn.execute("UPDATE optico_jobs SET lease_expires_at = ? WHERE id = ?", ("2000-01-01 00:00:00", dead))
    listed = run_in_process(["jobs", "list"])
    assert listed.code == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert "running (worker gone)" in rows[str(dead)] and "worker gone" not in rows[str(alive)]
    assert f"optico tune --resume {dead}" in listed.stdout
    shown = run_in_process(["jobs", "show", str(dead)])
    assert "running (worker gone)" in shown.stdout and f"optico tune --resume {dead}" in shown.stdout


@pytest.mark.parametrize("command", ["show", "list"])
def test_jobs_show_and_list_settle_a_job_cancelled_after_its_worker_died(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch, command: str):
    """`optico tune` killed, then the job cancelled while its lease still ran: with no worker ever
    polling this pool, its trial stayed `running` for ever."""
    from optico.pool.records import JobStatus
    from optico.pool.store import SqlStore
    from optico.strategy import Strategy
    from tests.pool.pool_testkit import make_spec

    db = tmp_path / "pool.db"
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{db}")
    with SqlStore(f"sqlite:///{db}") as store:
        job = store.create_job(make_spec("killed"), origin="cli")
        store.claim_job("tune-1", 600, job_id=job)
        store.begin_attempt(store.start_trial(job, 1, Strategy(), worker="tune-1").id, worker="tune-1")
        assert store.transition(job, JobStatus.CANCELLED).lease_owner == "tune-1"
    with sqlite3.connect(db) as conn:  # the killed process never renewed its lease again
        conn.execute("UPDATE optico_jobs SET lease_expires_at = ? WHERE id = ?", ("2000-01-01 00:00:00", job))
    shown = run_in_process(["jobs", command] + ([str(job)] if command == "show" else []))
    assert shown.code == 0, shown.stderr
    with SqlStore(f"sqlite:///{db}") as store:
        assert [t.status.value for t in store.trials(job)] == ["lost"]
        assert store.get_job(job).lease_owner is None
        assert [e.kind for e in store.events(job)][-2:] == ["job_done", "lease"]
    if command == "show":
        assert "lost" in shown.stdout


def test_worker_gone_reads_the_lease():
    from optico.cli.views import worker_gone
    from optico.pool.records import JobStatus
    from tests.pool.pool_testkit import make_spec

    now = datetime.now(timezone.utc)
    job = SimpleNamespace(status=JobStatus.RUNNING, spec=make_spec(), lease_owner="w1",
                          lease_expires_at=now + timedelta(seconds=30))
    job.lease_live = lambda at: job.lease_owner is not None and job.lease_expires_at > at
    assert not worker_gone(job, now)
    job.lease_expires_at = now - timedelta(seconds=1)
    assert worker_gone(job, now)
    job.status = JobStatus.SUCCEEDED
    assert not worker_gone(job, now)


def test_parse_spec_text_is_the_cli_s_validation(tmp_path: Path):
    from optico.spec import SpecError, load_spec, parse_spec_text

    text = yaml.safe_dump(GOOD)
    path = tmp_path / "good.yaml"
    path.write_text(text)
    assert parse_spec_text(text, origin_name="good.yaml") == load_spec(path)
    assert parse_spec_text(text.encode()) == parse_spec_text(__import__("json").dumps(GOOD))  # JSON is YAML
    with pytest.raises(SpecError) as err:
        parse_spec_text(b"name: x\nname: y\n", origin_name="body")
    assert err.value.field == "body" and "duplicate key 'name'" in err.value.reason
    # a server confines the files a spec may name to its data folder
    replay = (EXAMPLES / "llama3-8b-a100-replay.yaml").read_text()
    assert parse_spec_text(replay, base_dir=EXAMPLES, files_within=EXAMPLES.parent).launcher.kind == "replay"
    with pytest.raises(SpecError) as err:
        parse_spec_text(replay, base_dir=EXAMPLES, files_within=tmp_path)
    assert err.value.field == "launcher.data" and "outside" in err.value.reason


def test_flag_lines_wrap_between_flags():
    from optico.cli.views import flag_lines

    args = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-granularity", "full",
            "--cross-entropy-loss-fusion"] * 3
    lines = flag_lines(args, 60)
    assert all(len(line) <= 60 - 4 for line in lines)
    units = " ".join(line.rstrip(" \\") for line in lines).split(" --")
    assert all(not u.startswith("-") for u in units[1:]) and "--tensor-model-parallel-size 2" in lines[0]


def test_visible_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from optico.launchers.preflight import visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""})[0] == 0
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: a)'\necho 'GPU 1: NVIDIA H100 (UUID: b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert visible_gpus({})[0] == 2
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1"})[0] == 1
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    count, how = visible_gpus({})
    assert count == 0 and "could not communicate" in how


def test_a_ray_address_nothing_answers_at_is_one_line_before_a_job_exists(tmp_path: Path):
    """`optico tune` with a dead Ray head: `error: launcher.address: ...`, exit 2, no pool written
    (it was a job failed after Ray's 30 s client timeout, its trial left running)."""
    import socket

    from optico.errors import SpecError
    from optico.launchers.preflight import _check_ray_address

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        _check_ray_address(f"ray://127.0.0.1:{port}")  # something answers: fine
        _check_ray_address(f"127.0.0.1:{port}")
    for bad in (f"ray://127.0.0.1:{port}", "127.0.0.1", "ray://:10001", "ray://h:notaport"):
        with pytest.raises(SpecError) as given:
            _check_ray_address(bad)
        assert given.value.field == "launcher.address", bad
    spec = tmp_path / "dead.yaml"
    text = (EXAMPLES / "tiny-gpt-cpu.yaml").read_text().replace("address: local", f'address: "ray://127.0.0.1:{port}"')
    spec.write_text(text)
    refused = run_in_process(["tune", str(spec), "--launcher", "ray", "--database", f"sqlite:///{tmp_path / 'pool.db'}"])
    assert refused.code == 2 and refused.stderr.startswith("error: launcher.address: no Ray cluster answers"), refused
    assert len(refused.stderr.splitlines()) == 1 and not (tmp_path / "pool.db").exists()


def test_impossible_launcher_measurement_is_a_failed_trial():
    from optico.plausible import checked_result
    from optico.spec import parse_spec
    from optico.trial import FailureCategory, LaunchResult, Metrics

    workload = parse_spec(GOOD).workload
    real = Metrics(step_time_s=10.0, tflops_per_gpu=200.0, mfu=0.64, tokens_per_s_per_gpu=3000.0, mem_max_gib=60.0)
    assert checked_result(LaunchResult(ok=True, metrics=real), workload).ok
    for impossible in (real.model_copy(update={"mfu": 4000.0}), real.model_copy(update={"mem_max_gib": 310.0}),
                       real.model_copy(update={"step_time_s": -1.0})):
        result = checked_result(LaunchResult(ok=True, metrics=impossible, log="ran\n"), workload)
        assert not result.ok and result.metrics is None
        assert result.category_hint == FailureCategory.INFRASTRUCTURE and "measurement refused" in result.log


def test_trial_dirs_and_files_are_private(tmp_path: Path):
    from optico.launchers.local import trial_dir, write_files
    from optico.launchers.program import PreparedRun

    directory = trial_dir(tmp_path / "runs", "job1-trial1")
    write_files(PreparedRun(kind="megatron-core", nnodes=1, nproc_per_node=1, files={"spec.json": "{}"}), directory)
    assert _mode(tmp_path / "runs") == 0o700 and _mode(directory) == 0o700
    assert _mode(directory / "spec.json") == 0o600


def test_health_reasons_never_read_as_equal_to_their_threshold():
    from optico.agents.analysis import diagnose_health
    from optico.strategy import Strategy
    from optico.trial import Metrics, Trial, TrialStatus

    ref = Trial(id=1, job_id=1, index=1, strategy=Strategy(), signature="s", status=TrialStatus.OK,
                metrics=Metrics(step_time_s=1, tflops_per_gpu=1, mfu=0.6, tokens_per_s_per_gpu=1,
                                mem_max_gib=75.08, mem_limit_gib=79.0))
    _, why = diagnose_health(ref, None)
    assert why.startswith("memory 95.0") and "95% > 95%" not in why


def test_tune_on_a_moe_preset_with_the_default_knobs_says_what_it_fixed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    # Qwen3-30B-A3B on 64 GPUs: every default knob makes 2.6 M combinations (refused before); the
    # default space drops recipe flags until it fits, and says which, before the first trial.
    spec = tmp_path / "moe.yaml"
    spec.write_text("workload:\n  model: {preset: qwen3-30b-a3b}\n  seq_length: 4096\n  global_batch_size: 512\n"
                    "  cluster: {gpu: h100-sxm, gpus_per_node: 8, nodes: 8}\nlauncher: {kind: sim}\n")
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{tmp_path / 'pool.db'}")
    outcome = run_in_process(["tune", str(spec), "--max-trials", "2"])
    assert outcome.code == 0, outcome.stderr
    # The console's width is fixed when it is made (by whichever test imported it first): unwrapped here.
    said = " ".join(outcome.stdout.split())
    assert "search space: the default knobs, with cross_entropy_loss_fusion true, moe_grouped_gemm true" in said
    assert "--cross-entropy-loss-fusion" in outcome.stdout and "--moe-grouped-gemm" in outcome.stdout


def test_an_infeasible_spec_says_why_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Llama3-70B on one A100: nothing fits. The reason was printed twice, in the summary and on stderr.
    spec = tmp_path / "huge.yaml"
    spec.write_text("workload:\n  model: llama3-70b\n  seq_length: 8192\n  global_batch_size: 16\n"
                    "  cluster: {gpu: a100-80gb, gpus_per_node: 1, nodes: 1}\nlauncher: {kind: sim}\n")
    monkeypatch.setenv("OPTICO_DATABASE_URL", f"sqlite:///{tmp_path / 'pool.db'}")
    outcome = run_in_process(["tune", str(spec), "--max-trials", "2"])
    assert outcome.code == 1, outcome.stderr
    said = " ".join((outcome.stdout + outcome.stderr).split())
    assert said.count("is expected to fit") == 1, said
    assert outcome.stderr.startswith("job 1 failed: no configuration in the search space is expected to fit")
    assert len(outcome.stderr.strip().splitlines()) == 1, outcome.stderr


def test_the_command_line_starts_without_the_store_or_the_benchmark():
    """Every `optico` command, `--help` and a spec's one-line error included, imports the command line
    first: the store (SQLAlchemy, Alembic), the benchmark and the service are imported by the commands
    that use them, not by all (they were a second of start-up for each command)."""
    heavy = ("sqlalchemy", "alembic", "optico.pool", "optico.bench.suite", "langgraph", "fastapi", "torch", "optuna",
             "ray")
    probe = f"import sys, optico.cli; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr

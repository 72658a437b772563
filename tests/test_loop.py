"""The tuning loop end to end on embedded defaults: SQLite, the simulator, the offline rules."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from optico.launchers.base import Launcher
from optico.pool.lifecycle import JobStatus
from optico.pool.store import SqlStore
from optico.report import job_result
from optico.runner import run_job
from optico.spec import ReasonerSpec, load_spec
from optico.trial import TrialStatus
from tests.conftest import EXAMPLES, optico_cmd


def run_spec(spec, url: str) -> tuple[dict, SqlStore]:
    store = SqlStore(url)
    job_id = store.create_job(spec)
    run_job(store, url, job_id)
    return job_result(store, job_id), store


def test_sim_job_end_to_end(db_url: str):
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    result, store = run_spec(spec, db_url)
    assert result["status"] == "succeeded" and result["stop_reason"]
    assert 1 <= len(result["trials"]) <= spec.budget.max_trials
    assert result["best"]["mfu"] >= result["baseline"]["mfu"]
    assert result["best"]["megatron_args"][0] == "--tensor-model-parallel-size"
    signatures = [json.dumps(t["strategy"], sort_keys=True) for t in result["trials"] if "RETRY" not in t["rationale"]]
    assert len(signatures) == len(set(signatures)), "a configuration was tried twice"
    # every iteration left its agents' messages in the pool
    kinds = {(m.agent, m.kind) for m in store.messages(result["job_id"])}
    assert {("seed", "seed"), ("validation", "result"), ("analysis", "output"), ("generation", "output"),
            ("guard", "verdict")} <= kinds
    analysis = next(m for m in store.messages(result["job_id"]) if m.agent == "analysis")
    assert analysis.content["health"] in {"SEVERELY_UNDERUTILIZED", "HIGH_PP_OVERHEAD", "MEMORY_BOUND",
                                          "PERFORMANCE_TUNE"}
    assert analysis.content["suggestions"][0]["changes"]
    events = [e.kind for e in store.events(result["job_id"])]
    assert events.count("trial_done") == len(result["trials"]) and events[-1] == "job_done"
    for t in result["trials"]:
        assert t["status"] in ("ok", "failed")
        if t["status"] == "failed":
            assert t["failure"]["summary"] and 0 <= t["failure"]["confidence"] <= 100
    store.close()


def test_replay_example_finds_table_best(db_url: str):
    """GBS 512 rows: twelve configurations, three OOM; the best is TP1/PP2/MBS1 at 68 %."""
    spec = load_spec(EXAMPLES / "llama3-8b-a100-replay.yaml")
    result, store = run_spec(spec, db_url)
    best = result["best"]
    assert best["mfu"] == pytest.approx(0.68)
    assert (best["strategy"]["tensor_model_parallel_size"], best["strategy"]["pipeline_model_parallel_size"],
            best["strategy"]["micro_batch_size"]) == (1, 2, 1)
    assert best["trial"] <= 8
    ooms = [t for t in result["trials"] if t["failure"] and t["failure"]["category"] == "oom"]
    assert len(ooms) <= 1
    assert not any(t["failure"] and t["failure"]["category"] == "not_measured" for t in result["trials"])
    store.close()


def test_warm_start_uses_earlier_jobs(db_url: str):
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"baseline": None, "budget": spec.budget.model_copy(update={"max_trials": 6})})
    first, store = run_spec(spec, db_url)
    job2 = store.create_job(spec)
    run_job(store, db_url, job2)
    second = job_result(store, job2)
    assert second["trials"][0]["strategy"] == first["best"]["strategy"]
    assert "warm start" in second["trials"][0]["rationale"]
    first_failures = {json.dumps(t["strategy"], sort_keys=True) for t in first["trials"] if t["status"] == "failed"
                      and t["failure"]["category"] == "oom"}
    assert not first_failures & {json.dumps(t["strategy"], sort_keys=True) for t in second["trials"]}
    store.close()


def _running_trial(db: Path, index: int) -> bool:
    if not db.exists():
        return False
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            row = conn.execute("SELECT status FROM optico_trials WHERE \"index\" = ?", (index,)).fetchone()
    except sqlite3.OperationalError:
        return False
    return bool(row) and row[0] == "running"


@pytest.mark.slow
def test_sigkill_mid_trial_then_resume(tmp_path: Path, cli_env: dict):
    """Kill `optico tune` with SIGKILL during trial 3; --resume finishes with the exact trial count,
    no duplicated configuration and no lost result — the same trials an uninterrupted run makes."""
    # The lease outlives the kill by longer than a loaded 2-core machine takes to start `optico tune`
    # (at 4 s a resume started after it had expired, and the refusal asserted below did not come).
    lease_s = 12.0
    cli_env = dict(cli_env, OPTICO_LEASE_S=str(lease_s), OPTICO_LEASE_RENEW_S="0.5")
    spec_text = (EXAMPLES / "llama3-8b-a100.yaml").read_text().replace(
        "budget: {max_trials: 20}", "budget: {max_trials: 6, converge_tol: null}").replace(
        "launcher: {kind: sim}", "launcher: {kind: sim, trial_seconds: 1.0, hang_rate: 0.0}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text)
    db = tmp_path / "pool.db"
    proc = subprocess.Popen(optico_cmd("tune", str(spec)), env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 180
    while not _running_trial(db, 3):
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, "trial 3 never started"
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait(timeout=30)
    assert _running_trial(db, 3), "the kill should leave trial 3 unfinished"

    # The dead process still holds the lease until it expires: a resume is refused until then.
    refused = subprocess.run(optico_cmd("tune", "--resume", "1"), env=cli_env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "job 1 is held by worker" in refused.stderr, refused.stderr
    assert refused.stdout == "", refused.stdout  # one line on stderr, nothing before it
    time.sleep(max(0.0, killed_at + lease_s + 0.5 - time.monotonic()))  # the lease was renewed before the kill

    resumed = subprocess.run(optico_cmd("tune", "--resume", "1", "--json", str(tmp_path / "r.json")), env=cli_env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert [t["index"] for t in result["trials"]] == [1, 2, 3, 4, 5, 6]
    assert all(t["status"] in ("ok", "failed") for t in result["trials"])
    sigs = [json.dumps(t["strategy"], sort_keys=True) for t in result["trials"]]
    assert len(set(sigs)) == 6

    # An uninterrupted run with the same seed makes exactly the same trials with the same results.
    env2 = dict(cli_env, OPTICO_DATABASE_URL=f"sqlite:///{tmp_path / 'clean.db'}")
    clean = subprocess.run(optico_cmd("tune", str(spec), "--json", str(tmp_path / "c.json")), env=env2,
                           capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    reference = json.loads((tmp_path / "c.json").read_text())
    assert [t["strategy"] for t in reference["trials"]] == [t["strategy"] for t in result["trials"]]
    assert [t["metrics"] for t in reference["trials"]] == [t["metrics"] for t in result["trials"]]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signal handlers: main thread")
def test_sigterm_under_tune_lands_at_the_next_await_not_inside_a_statement():
    """SIGTERM during a job takes Ctrl-C's path under asyncio.run: the job's task is cancelled at its
    next await. Raised from the handler, it once cut a pool commit short on PostgreSQL, and the job
    failed ("This session is in 'committed' state") instead of being interrupted."""
    from optico.cli.tune import SigtermSeen, sigterm_as_interrupt

    statement_done: list[bool] = []

    async def job() -> None:
        # A synchronous statement in the loop's thread (a commit), with SIGTERM arriving inside it.
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        until = time.monotonic() + 0.5
        while time.monotonic() < until:
            pass
        statement_done.append(True)
        await asyncio.sleep(30)

    seen = SigtermSeen()
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt(seen):
        asyncio.run(job())
    assert statement_done == [True] and seen.seen


def test_sigterm_of_a_stopping_tune_says_how_the_job_ended(tmp_path: Path, cli_env: dict):
    """`jobs stop`, then SIGTERM during the running trial: the job ends stopped, and tune said it was
    "resumable with optico tune --resume" (a resume of it is refused: it succeeded)."""
    spec_text = (EXAMPLES / "llama3-8b-a100.yaml").read_text().replace(
        "budget: {max_trials: 20}", "budget: {max_trials: 6, converge_tol: null}").replace(
        "launcher: {kind: sim}", "launcher: {kind: sim, trial_seconds: 3.0, hang_rate: 0.0}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text)
    db = tmp_path / "pool.db"
    proc = subprocess.Popen(optico_cmd("tune", str(spec)), env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not _running_trial(db, 2):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "trial 2 never started"
        time.sleep(0.1)
    stopped = subprocess.run(optico_cmd("jobs", "stop", "1"), env=cli_env, capture_output=True, text=True,
                             timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143
    store = SqlStore(f"sqlite:///{db}")
    job = store.get_job(1)
    store.close()
    assert job.status is JobStatus.SUCCEEDED and job.stop_reason.startswith("stopped on request")
    assert "resumable" not in stderr and "interrupted: job 1 is succeeded (stopped on request" in stderr, stderr


# A space of ~95,000 configurations of a model with up to 1,024 pipeline stages: predicting it takes
# the seeding agent's thread many minutes, which SIGTERM could not stop (the process waited for it).
HUGE = """
name: huge
workload:
  model: {name: huge, num_layers: 1024, hidden_size: 262144, num_attention_heads: 4096, num_query_groups: 4096,
          ffn_hidden_size: 1048576, vocab_size: 16777216, num_experts: 4096, moe_router_topk: 256,
          moe_ffn_hidden_size: 1048576}
  seq_length: 16777216
  global_batch_size: 1048576
  precision: fp8
  cluster: {gpu: gb300, gpus_per_node: 1024, nodes: 1024}
search_space:
  tunables: {tp: [1,2,4,8,16,32,64,128,256,512,1024], pp: [1,2,4,8,16,32,64,128,256,512,1024],
             cp: [1,2,4,8,16,32,64,128,256,512,1024], ep: [1,2,4,8,16,32,64,128,256,512,1024],
             mbs: [1,2,4,8,16,32,64,128,256]}
budget: {max_trials: 3}
launcher: {kind: sim}
"""


@pytest.mark.parametrize("after_s", [1, 8], ids=["building-its-context", "predicting"])
def test_sigterm_while_an_agent_still_predicts_a_huge_space_ends_tune_at_once(tmp_path: Path, cli_env: dict,
                                                                               after_s: int):
    """1 s after the run begins its context is still being built (the candidate pool takes ~3 s, far
    longer on a loaded machine); 8 s after, the seeding agent is usually predicting the pool. Either
    way the job ends interrupted with its lease released."""
    spec = tmp_path / "huge.yaml"
    spec.write_text(HUGE)
    proc = subprocess.Popen(optico_cmd("tune", str(spec)), env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while "run logs:" not in (line := proc.stdout.readline()):
        assert line or proc.poll() is None, "tune ended before the run began"
        assert time.time() < deadline, "the run never began"
    try:
        time.sleep(after_s)
        assert proc.poll() is None, "the run should still be going"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
        assert time.monotonic() - sent < 20, "the agent's thread kept the process alive"
    finally:
        proc.kill()  # a no-op once it has ended; else it would predict for minutes after a failure
    with SqlStore(cli_env["OPTICO_DATABASE_URL"]) as store:
        job = store.get_job(1)
        assert job.status is JobStatus.INTERRUPTED and job.lease_owner is None


def test_a_job_whose_context_cannot_be_built_fails_saying_why(db_url: str, monkeypatch: pytest.MonkeyPatch):
    """An LLM reasoner on a worker without OPTICO_LLM_MODEL: the claimed job fails naming the
    variable and its lease is released (it was left running, retaken every lease period)."""
    for name in ("OPTICO_LLM_MODEL", "OPTICO_LLM_BASE_URL", "OPTICO_LLM_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"reasoner": ReasonerSpec.every("model-guided")})
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    final = run_job(store, db_url, job_id)
    assert final.status is JobStatus.FAILED and final.lease_owner is None
    assert "OPTICO_LLM_MODEL is not set" in (final.stop_reason or "")
    assert store.trials(job_id) == []


def test_a_space_too_large_to_model_in_time_fails_its_job_saying_so(tmp_path: Path, db_url: str,
                                                                     monkeypatch: pytest.MonkeyPatch):
    """Left alone, the huge space above would be predicted for ~20 minutes before its first trial."""
    from optico.perfmodel import online

    monkeypatch.setattr(online, "POOL_PREDICT_SECONDS", 0.5)
    spec = tmp_path / "huge.yaml"
    spec.write_text(HUGE)
    started = time.monotonic()
    result, _ = run_spec(load_spec(spec), db_url)
    assert time.monotonic() - started < 60
    assert result["status"] == "failed" and result["trials"] == []
    assert "search_space: modelling" in result["stop_reason"] and "took over 0.5 s" in result["stop_reason"]


def test_cli_tune_json_and_jobs_commands(tmp_path: Path, cli_env: dict):
    out = tmp_path / "result.json"
    proc = subprocess.run(optico_cmd("tune", str(EXAMPLES / "llama3-8b-a100.yaml"), "--max-trials", "5",
                                     "--seed", "4", "--json", str(out)),
                          env=cli_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "best MFU" in proc.stdout and "--tensor-model-parallel-size" in proc.stdout
    result = json.loads(out.read_text())
    assert set(result) >= {"job_id", "status", "baseline", "best", "trials"}
    assert set(result["best"]) >= {"strategy", "mfu", "tflops_per_gpu", "megatron_args"}
    assert set(result["trials"][0]) >= {"index", "strategy", "status", "metrics", "failure", "rationale"}
    assert set(result["trials"][0]["metrics"]) == {"mfu", "tflops_per_gpu", "step_time_s",
                                                   "tokens_per_s_per_gpu", "mem_max_gib"}
    assert len(result["trials"]) <= 5
    listed = subprocess.run(optico_cmd("jobs", "list"), env=cli_env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "llama3-8b-a100" in listed.stdout
    shown = subprocess.run(optico_cmd("jobs", "show", str(result["job_id"]), "--messages"), env=cli_env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "analysis" in shown.stdout and "Change " in shown.stdout
    missing = subprocess.run(optico_cmd("jobs", "show", "999"), env=cli_env, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "no job 999" in missing.stderr
    # a simulated job's trials are predictions: `jobs export` refuses them and writes nothing
    exported = tmp_path / "trials.csv"
    refused = subprocess.run(optico_cmd("jobs", "export", str(result["job_id"]), "--out", str(exported)),
                             env=cli_env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "sim launcher" in refused.stderr and not exported.exists(), refused.stderr
    unknown = subprocess.run(optico_cmd("jobs", "export", "999", "--out", str(exported)), env=cli_env,
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "no job 999" in unknown.stderr and not exported.exists()


class CrashingLauncher(Launcher):
    """Wraps a real launcher and dies (like a killed process) when trial `crash_at` starts."""

    kind = "sim"

    def __init__(self, inner, crash_at: int):
        self.inner, self.crash_at = inner, crash_at

    async def launch(self, workload, strategy, *, trial_key, progress=None):
        if trial_key.endswith(f"trial{self.crash_at}"):
            raise KeyboardInterrupt("simulated kill")
        return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)

    def candidates(self, workload):
        return None

    def describe(self):
        return {"kind": "crashing-sim"}


class BrokenLauncher(CrashingLauncher):
    """Its cluster goes away when trial `crash_at` starts (a launcher error, not a failed run)."""

    async def launch(self, workload, strategy, *, trial_key, progress=None):
        if trial_key.endswith(f"trial{self.crash_at}"):
            raise ConnectionError("ray client connection timeout")
        return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)


def test_a_broken_run_fails_the_job_and_records_its_running_trial_lost(db_url: str):
    from optico.launchers.factory import build_launcher

    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    run_job(store, db_url, job_id, launcher=BrokenLauncher(build_launcher(spec.launcher, spec.seed), crash_at=2))
    job = store.get_job(job_id)
    assert job.status.value == "failed" and "ConnectionError: ray client connection timeout" in job.stop_reason
    trials = store.trials(job_id)
    assert [t.status for t in trials] == [TrialStatus.OK, TrialStatus.LOST], trials
    assert "ConnectionError" in trials[-1].failure.summary and job.lease_owner is None
    store.transition(job_id, JobStatus.QUEUED, reason="resumed")  # the cluster is back: resumed
    run_job(store, db_url, job_id)
    signatures = [t.signature for t in store.trials(job_id)]
    assert len(signatures) > 3 and len(set(signatures)) == len(signatures)  # the lost one is not launched again
    store.close()


class DatabaseBlip(CrashingLauncher):
    """The database connection drops while trial `crash_at` runs (a restart, a failover)."""

    async def launch(self, workload, strategy, *, trial_key, progress=None):
        if trial_key.endswith(f"trial{self.crash_at}"):
            import psycopg

            raise psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")
        return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)


def test_a_lost_database_connection_interrupts_the_job_and_a_resume_finishes_it(db_url: str):
    """Not `failed`: a second's database restart failed every running job for good."""
    from optico.launchers.factory import build_launcher

    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 4, "converge_tol": None})})
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    run_job(store, db_url, job_id, launcher=DatabaseBlip(build_launcher(spec.launcher, spec.seed), crash_at=2))
    job = store.get_job(job_id)
    assert job.status.value == "interrupted" and "database connection was lost" in job.stop_reason
    assert [t.status for t in store.trials(job_id)] == [TrialStatus.OK, TrialStatus.RUNNING]  # re-run on resume
    run_job(store, db_url, job_id)
    assert store.get_job(job_id).status.value == "succeeded" and len(store.trials(job_id)) == 4
    store.close()


def test_a_stopping_job_whose_worker_stops_ends_as_stopped_not_resumed(db_url: str):
    """A stop, then SIGTERM to the worker (a rolling restart): the job ends `stopped on request`; it
    was made `interrupted` and the next worker ran the rest of its budget."""
    from optico.launchers.factory import build_launcher

    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    store = SqlStore(db_url)
    job_id = store.create_job(spec)

    class StopThenKill(CrashingLauncher):
        async def launch(self, workload, strategy, *, trial_key, progress=None):
            if trial_key.endswith("trial2"):
                store.transition(job_id, JobStatus.STOPPING, reason="stopped on request (token t)")
                raise KeyboardInterrupt("SIGTERM")
            return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)

    with pytest.raises(KeyboardInterrupt):
        run_job(store, db_url, job_id, launcher=StopThenKill(build_launcher(spec.launcher, spec.seed), crash_at=2))
    job = store.get_job(job_id)
    assert job.status.value == "succeeded" and job.stop_reason.startswith("stopped on request")
    assert [t.status for t in store.trials(job_id)] == [TrialStatus.OK, TrialStatus.LOST] and job.lease_owner is None
    store.close()


@pytest.mark.parametrize("request_to", [JobStatus.STOPPING, JobStatus.CANCELLED])
def test_a_stop_or_cancel_while_the_agents_choose_starts_no_new_trial(db_url: str, request_to: JobStatus):
    """The stop lands after trial 2, while the agents choose trial 3 (with an LLM, minutes of round-trips):
    trial 3 was launched anyway, and after a cancel its result was recorded on the cancelled job."""
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 6, "converge_tol": None})})
    store = SqlStore(db_url)
    job_id = store.create_job(spec)

    def on_event(kind: str, payload: dict) -> None:
        # The guard admitted trial 3's configuration: the next step would launch it.
        if kind == "agent" and payload["agent"] == "guard" and payload["iteration"] == 3:
            store.transition(job_id, request_to, reason="stopped on request (test)")

    run_job(store, db_url, job_id, on_event=on_event)
    job = store.get_job(job_id)
    assert [t.index for t in store.trials(job_id)] == [1, 2]
    assert all(t.status == TrialStatus.OK for t in store.trials(job_id))
    expected = JobStatus.CANCELLED if request_to is JobStatus.CANCELLED else JobStatus.SUCCEEDED
    assert job.status is expected and job.lease_owner is None
    kinds = [e.kind for e in store.events(job_id)]
    assert kinds.count("trial_started") == 2 and kinds.count("job_done") == 1
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_interrupted_job_resumes_on_both_backends(backend: str, request, tmp_path: Path):
    from optico.launchers.factory import build_launcher

    url = f"sqlite:///{tmp_path / 'pool.db'}" if backend == "sqlite" else request.getfixturevalue("postgres_db")
    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 5, "converge_tol": None}),
                                   "launcher": spec.launcher.model_copy(update={"hang_rate": 0.0})})
    store = SqlStore(url)
    job_id = store.create_job(spec)
    inner = build_launcher(spec.launcher, spec.seed)
    with pytest.raises(KeyboardInterrupt):
        run_job(store, url, job_id, launcher=CrashingLauncher(inner, crash_at=3))
    trials = store.trials(job_id)
    assert [t.index for t in trials] == [1, 2, 3] and trials[-1].status == TrialStatus.RUNNING
    job = store.get_job(job_id)
    assert job.status.value == "interrupted" and job.lease_owner is None  # Ctrl-C releases the job
    run_job(store, url, job_id)  # resume: the interrupted node runs again
    result = job_result(store, job_id)
    assert [t["index"] for t in result["trials"]] == [1, 2, 3, 4, 5]
    assert len({json.dumps(t["strategy"], sort_keys=True) for t in result["trials"]}) == 5
    assert result["status"] == "succeeded"
    # The checkpointer's tables live beside the pool's, in the same database.
    from sqlalchemy import inspect

    names = set(inspect(store.engine).get_table_names())
    assert {"optico_jobs", "optico_trials", "checkpoints"} <= names
    store.close()


def test_replay_of_the_h100_sweep_finds_its_best(db_url: str):
    """The real H100 measurements of benchmarks/data: the tuner reaches the sweep's best within 10 trials."""
    import csv

    rows = list(csv.DictReader((EXAMPLES.parent / "benchmarks" / "data" / "h100-llama-1b.csv").open()))
    best_measured = max(float(r["mfu"]) for r in rows if r["result"] == "ok")
    result, store = run_spec(load_spec(EXAMPLES / "llama-1b-h100-replay.yaml"), db_url)
    assert result["best"]["mfu"] == pytest.approx(best_measured, abs=1e-3)
    assert result["best"]["trial"] <= 10
    assert result["failed_trials"] <= 1
    store.close()


def test_two_clean_interruptions_of_one_trial_re_run_it_rather_than_lose_it(db_url: str):
    """Two rolling restarts (Ctrl-C, SIGTERM) during one long trial recorded it lost: a clean
    interruption was counted as a death of its worker."""
    from optico.launchers.factory import build_launcher

    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 3, "converge_tol": None}),
                                   "launcher": spec.launcher.model_copy(update={"hang_rate": 0.0})})
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            run_job(store, db_url, job_id, launcher=CrashingLauncher(build_launcher(spec.launcher, spec.seed),
                                                                     crash_at=3))
        assert store.get_job(job_id).status is JobStatus.INTERRUPTED
    interrupted = store.trials(job_id)[-1]
    assert interrupted.status is TrialStatus.RUNNING and (interrupted.attempts, interrupted.interruptions) == (2, 2)
    run_job(store, db_url, job_id)
    trials = store.trials(job_id)
    assert [t.status for t in trials] == [TrialStatus.OK] * 3
    assert (trials[-1].attempts, trials[-1].interruptions) == (3, 2)
    assert store.get_job(job_id).status is JobStatus.SUCCEEDED
    store.close()


def test_a_trial_interrupted_at_every_launch_is_lost_after_max_launches(db_url: str):
    """Clean interruptions are re-run, but not for ever: a trial that gets its worker stopped each time
    (an eviction it causes) ends lost."""
    from optico.launchers.factory import build_launcher
    from optico.loop import MAX_LAUNCHES

    spec = load_spec(EXAMPLES / "llama3-8b-a100.yaml")
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_trials": 2, "converge_tol": None}),
                                   "launcher": spec.launcher.model_copy(update={"hang_rate": 0.0})})
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    for _ in range(MAX_LAUNCHES):
        with pytest.raises(KeyboardInterrupt):
            run_job(store, db_url, job_id, launcher=CrashingLauncher(build_launcher(spec.launcher, spec.seed),
                                                                     crash_at=2))
    run_job(store, db_url, job_id)
    lost = store.trials(job_id)[1]
    assert lost.status is TrialStatus.LOST and lost.attempts == MAX_LAUNCHES
    assert f"launched {MAX_LAUNCHES} times and never finished" in lost.failure.summary
    store.close()


def test_a_job_with_nothing_left_to_try_says_why(db_url: str):
    """A 405B model on one node from a spec's baseline stopped after one trial with "search space
    exhausted", which read as a bug: every other configuration is predicted to run out of memory."""
    from optico.spec import parse_spec_text

    spec = parse_spec_text("""
name: too-big
workload:
  model: llama3.1-405b
  seq_length: 8192
  global_batch_size: 64
  cluster: {gpu: h100-sxm, gpus_per_node: 8, nodes: 1}
search_space: {tunables: [tp, pp, mbs, sp, recompute]}
baseline: {tp: 8, pp: 1, mbs: 1, recompute: full, sp: true}
budget: {max_trials: 6}
launcher: {kind: sim}
""")
    with SqlStore(db_url) as store:
        job_id = store.create_job(spec)
        job = run_job(store, db_url, job_id)
        assert job.status is JobStatus.FAILED and len(store.trials(job_id)) == 1
        assert job.stop_reason.startswith("search space exhausted: the guard admits none of its ")
        assert "predicted-oom" in job.stop_reason and "1 duplicate" in job.stop_reason


def test_a_best_with_little_memory_left_is_flagged_with_the_best_that_has_room():
    """A best measured at 99 % of the GPU's memory ran a few steps; a run of days may not fit. The
    report says so and names the best trial with 5 % free (a performance engineer's fallback)."""
    from optico.report import memory_note
    from optico.strategy import Strategy
    from optico.trial import Metrics, Trial, TrialStatus

    def trial(index: int, mfu: float, mem: float | None) -> Trial:
        strategy = Strategy(micro_batch_size=index)
        return Trial(id=index, job_id=1, index=index, strategy=strategy, signature=strategy.signature(),
                     status=TrialStatus.OK, metrics=Metrics(step_time_s=1, tflops_per_gpu=400, mfu=mfu,
                                                            tokens_per_s_per_gpu=1, mem_max_gib=mem, mem_limit_gib=80))

    tight, roomy, roomier = trial(4, 0.40, 79.2), trial(2, 0.38, 70.0), trial(1, 0.30, 40.0)
    note = memory_note(tight, [roomier, roomy, tight], 80)
    assert note is not None and "79.2 GiB, leaves 1.0%" in note and "trial 2" in note and "38.0%" in note
    assert memory_note(roomy, [roomy], 80) is None  # 12.5 % free
    assert memory_note(trial(3, 0.4, None), [], 80) is None  # not measured: nothing claimed
    assert "the best with" not in memory_note(tight, [tight], 80)  # no roomier trial: the warning alone


def test_an_unreadable_trial_of_an_earlier_job_costs_the_warm_start_not_the_job(tmp_path: Path, cli_env: dict):
    """One trial row written by hand ('{not json' as its strategy) failed every later job on the same
    workload, from `tune` and from the workers alike (JSONDecodeError reading the pool's earlier trials)."""
    spec = str(EXAMPLES / "llama3-8b-a100.yaml")
    first = subprocess.run(optico_cmd("tune", spec, "--max-trials", "2"), env=cli_env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    with sqlite3.connect(tmp_path / "pool.db") as conn:
        conn.execute("UPDATE optico_trials SET strategy = '{not json' WHERE id = 1")
    second = subprocess.run(optico_cmd("tune", spec, "--max-trials", "2"), env=cli_env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "earlier trials of this workload cannot be read" in second.stderr

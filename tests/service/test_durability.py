"""Killed services, dead workers, two workers on one job — on SQLite and PostgreSQL.

The service is a real `optico serve` process, killed with SIGKILL at precise points of an iteration
(`OPTICO_FAULT_KILL_AT`, optico/faults.py), then restarted. Whatever happens, every job ends with
exactly the trials an uninterrupted run makes: same configurations, same results, none twice, none lost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from service_testkit import FAST, spec, wait_for

from optico.pool import JobStatus, SqlStore
from optico.runner import run_job
from optico.spec import parse_spec
from optico.trial import TrialStatus

# Kill points in an order where no trial can be killed mid-launch twice (it would then be recorded
# lost, by design): the first process dies launching its first trial, which the next process re-runs
# first (the oldest job) to its end; the three after it die where no trial runs; the lease-renewal
# kill, which may land mid-launch, comes last, and the final process re-runs that trial once.
KILLS = ["trial:1", "analysis:1", "before_checkpoint:1", "after_trial:1", "lease_renewal:3"]


def reference(bodies: list[dict], tmp_path: Path) -> dict[int, list[tuple[str, str, dict | None]]]:
    """(signature, metrics) of each trial of uninterrupted in-process runs of the same specs, created in
    the same order in a fresh pool (the simulator's noise is keyed by job id and trial index)."""
    url = f"sqlite:///{tmp_path / ('reference-' + bodies[0]['name'] + '.db')}"
    with SqlStore(url) as store:
        ids = [store.create_job(parse_spec({**b, "launcher": {**b["launcher"], "trial_seconds": 0}})) for b in bodies]
        for job_id in ids:
            run_job(store, url, job_id)
        return {job_id: outcome(store, job_id) for job_id in ids}


def outcome(store: SqlStore, job_id: int) -> list[tuple[str, str, dict | None]]:
    """What a job found: each trial's configuration, outcome and metrics (an OOM is a result too)."""
    return [(t.signature, t.status.value, t.metrics.model_dump() if t.metrics else None) for t in store.trials(job_id)]


def test_sigkill_at_five_points_then_restart(make_service, db_url: str, tmp_path: Path):
    # Two workloads: a job warm-starts from earlier jobs of its own workload, and the order in which a
    # restarted worker picks jobs up must not change what they find.
    second = spec("durable-b", max_trials=4, trial_seconds=0.6, seed=2)
    second["workload"]["seq_length"] = 4096
    bodies = [spec("durable-a", max_trials=6, trial_seconds=0.6, seed=1), second]
    with SqlStore(db_url) as store:
        jobs = [store.create_job(parse_spec(body)) for body in bodies]
        expected = reference(bodies, tmp_path)
        assert sorted(expected) == jobs
        for point in KILLS:
            # Not waiting for /healthz: the worker may reach the kill point before the API answers.
            service = make_service().start(wait=False, OPTICO_FAULT_KILL_AT=point)
            code = service.wait_dead(timeout=180)
            assert code == -signal.SIGKILL, f"{point}: the service should have died there ({code})"
        finals = {}
        service = make_service().start()
        for job_id in jobs:
            finals[job_id] = wait_for(lambda j=job_id: (job := store.get_job(j)).status is JobStatus.SUCCEEDED
                                      and job, timeout=180, what=f"job {job_id} to finish after the kills")
        service.kill()
        for job_id, body in zip(jobs, bodies, strict=True):
            trials = store.trials(job_id)
            story = [(e.seq, e.kind, e.event.model_dump(exclude={"kind"})) for e in store.events(job_id)
                     if e.kind in ("state", "lease", "trial_started", "trial_done", "trial_lost")]
            assert [t.index for t in trials] == list(range(1, body["budget"]["max_trials"] + 1)), story
            assert not [t for t in trials if t.status is TrialStatus.LOST], story  # no result lost
            assert len({t.signature for t in trials}) == len(trials), "a configuration ran twice"
            assert all(t.attempts <= 2 for t in trials)
            assert outcome(store, job_id) == expected[job_id], "the kills changed what the job found"
        assert sum(finals[j].takeovers for j in jobs) >= len(KILLS) - 1  # each restart took an expired lease over
        events = [e.event for e in store.events(jobs[0])]
        assert [e.kind for e in events].count("job_done") == 1


def _worker(db_url: str, home: Path, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
    env.update(FAST, OPTICO_DATABASE_URL=db_url, OPTICO_HOME=str(home), PYTHONUNBUFFERED="1")
    home.mkdir(parents=True, exist_ok=True)
    log = (home / f"worker-{time.monotonic_ns()}.log").open("w")
    return subprocess.Popen([sys.executable, "-m", "optico.cli", "worker", *extra], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def test_two_workers_one_job_and_a_killed_worker_is_taken_over(db_url: str, tmp_path: Path):
    body = spec("contended", max_trials=5, trial_seconds=1.2, seed=3)
    with SqlStore(db_url) as store:
        job_id = store.create_job(parse_spec(body))
        first, second = _worker(db_url, tmp_path / "w1"), _worker(db_url, tmp_path / "w2")
        try:
            holder = wait_for(lambda: store.get_job(job_id).lease_owner, what="a worker to claim the job")
            # A second claimer — another worker, or `optico tune --resume` — is refused while the lease lives.
            env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
            resume = subprocess.run([sys.executable, "-m", "optico.cli", "tune", "--resume", str(job_id)],
                                    env={**env, "OPTICO_DATABASE_URL": db_url, "OPTICO_HOME": str(tmp_path)},
                                    capture_output=True, text=True, timeout=120)
            assert resume.returncode == 2, resume.stdout + resume.stderr
            assert f"job {job_id} is held by worker {holder} until" in resume.stderr
            assert resume.stdout == "", resume.stdout  # refused before any header line
            wait_for(lambda: any(t.status is TrialStatus.RUNNING for t in store.trials(job_id))
                     and len(store.trials(job_id)) >= 2, what="trial 2 running")
            pid = int(holder.split(":")[1])
            victim = first if first.pid == pid else second
            survivor = second if victim is first else first
            os.kill(victim.pid, signal.SIGKILL)
            victim.wait(timeout=30)
            done = wait_for(lambda: (job := store.get_job(job_id)).status is JobStatus.SUCCEEDED and job,
                            timeout=180, what="the survivor to finish the job")
            assert done.takeovers == 1
            trials = store.trials(job_id)
            assert [t.index for t in trials] == [1, 2, 3, 4, 5]
            assert not [t for t in trials if t.status in (TrialStatus.LOST, TrialStatus.RUNNING)]
            assert max(t.attempts for t in trials) == 2  # the trial that was running, re-run once
            workers = {e.event.worker for e in store.events(job_id) if e.kind == "lease"}
            assert len(workers) == 2 and holder in workers  # the holder, then the survivor; nobody else
            assert any(f":{survivor.pid}:" in w for w in workers)
            assert outcome(store, job_id) == reference([body], tmp_path)[job_id]
        finally:
            for proc in (first, second):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=60)


def test_sigterm_interrupts_and_another_service_resumes(make_service, db_url: str, tmp_path: Path):
    """A rolling restart: SIGTERM interrupts the running job at once (its trial re-runs on the next
    service), without waiting for its lease to expire."""
    body = spec("rolling", max_trials=4, trial_seconds=1.0, seed=4)
    with SqlStore(db_url) as store:
        job_id = store.create_job(parse_spec(body))
        old = make_service().start()
        wait_for(lambda: len(store.trials(job_id)) >= 2, what="trial 2")
        old.stop()
        assert old.proc.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after a clean shutdown
        interrupted = store.get_job(job_id)
        assert interrupted.status is JobStatus.INTERRUPTED and interrupted.lease_owner is None
        make_service().start()
        done = wait_for(lambda: (job := store.get_job(job_id)).status is JobStatus.SUCCEEDED and job,
                        timeout=120, what="the job to finish on the new service")
        assert done.takeovers == 0  # nothing expired: the old service handed the job back
        assert outcome(store, job_id) == reference([body], tmp_path)[job_id]


def test_sigterm_while_a_client_follows_the_job_interrupts_it_at_once(make_service, db_url: str,
                                                                      tokens: dict[str, str]):
    """A rolling restart while a client (the dashboard, `curl -N`) follows the running job: uvicorn
    waits for open connections before the app's shutdown, and an event stream stays open as long as
    its job runs, so the service did not stop and its worker went on launching trials until the
    client left. The stream now ends without `end` (the client reconnects elsewhere with
    Last-Event-ID) and the job is interrupted at once."""
    from service_testkit import client, sse_events

    body = spec("sigterm-with-stream", max_trials=4, trial_seconds=20, seed=7)
    with SqlStore(db_url) as store:
        job_id = store.create_job(parse_spec(body))
        service = make_service().start()
        wait_for(lambda: store.trials(job_id), what="trial 1")
        with client(service, tokens["read"]).stream("GET", f"/api/v1/jobs/{job_id}/events") as stream:
            events = sse_events(stream)
            next(events)  # the stream is open
            service.proc.send_signal(signal.SIGTERM)
            assert service.wait_dead(timeout=20) in (0, -signal.SIGTERM)
            kinds = [kind for _, kind, _ in events]
        assert "end" not in kinds, kinds
        job = store.get_job(job_id)
        assert job.status is JobStatus.INTERRUPTED and job.lease_owner is None
        assert len(store.trials(job_id)) == 1  # nothing launched after SIGTERM


def test_the_event_stream_of_an_interrupted_queue_job_goes_on_to_its_real_end(make_service, db_url: str,
                                                                             tokens: dict[str, str]):
    """A rolling restart interrupts a queue job; the next worker runs it on. The stream sent
    `end: interrupted` at once, and its clients stopped following a job that then finished."""
    import httpx
    from service_testkit import client, sse_events

    body = spec("stream-across-restart", max_trials=4, trial_seconds=1.0, seed=5)
    with SqlStore(db_url) as store:
        job_id = store.create_job(parse_spec(body))
        old = make_service().start()
        wait_for(lambda: len(store.trials(job_id)) >= 2, what="trial 2")
        old.stop()
        assert store.get_job(job_id).status is JobStatus.INTERRUPTED
        api = make_service("--no-worker").start()
        http = client(api, tokens["read"])
        kinds: list[str] = []
        with pytest.raises(httpx.ReadTimeout):  # nothing more to say yet, and no `end`
            with http.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=httpx.Timeout(30, read=4)) as stream:
                for _, kind, _ in sse_events(stream):
                    kinds.append(kind)
        assert "end" not in kinds and kinds, kinds
        make_service().start()  # a worker takes the job again
        with http.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=120) as stream:
            ends = [data for _, kind, data in sse_events(stream) if kind == "end"]
        assert ends == [{"status": "succeeded"}]


def test_a_job_cancelled_after_its_worker_died_is_settled_by_its_event_stream(make_service, db_url: str,
                                                                             tokens: dict[str, str]):
    """Cancelled while its dead worker's lease still ran, with no worker left: the trial stayed
    `running` for ever, no `job_done` was written, and the stream ended without one."""
    from service_testkit import client, sse_events

    body = spec("cancel-after-death", max_trials=3, trial_seconds=60, seed=6)
    with SqlStore(db_url) as store:
        job_id = store.create_job(parse_spec(body))
        api = make_service("--no-worker").start()
        worker = make_service().start()
        wait_for(lambda: [t for t in store.trials(job_id) if t.status is TrialStatus.RUNNING], what="trial 1 running")
        worker.kill()  # SIGKILL: its lease (3 s) still runs, so the cancel leaves it to that worker
        http = client(api, tokens["write"])
        assert http.post(f"/api/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
        assert store.get_job(job_id).lease_owner is not None
        with http.stream("GET", f"/api/v1/jobs/{job_id}/events", timeout=60) as stream:
            kinds = [(kind, data) for _, kind, data in sse_events(stream)]
        tail = [kind for kind, _ in kinds][-3:]
        assert tail == ["job_done", "lease", "end"], kinds[-6:]
        assert kinds[-3][1]["status"] == "cancelled" and kinds[-2][1]["action"] == "expired"
        assert [t.status for t in store.trials(job_id)] == [TrialStatus.LOST]
        assert store.get_job(job_id).lease_owner is None


@pytest.mark.parametrize("point", ["bogus"])
def test_an_unknown_fault_point_is_refused(point: str, monkeypatch: pytest.MonkeyPatch):
    from optico import faults

    monkeypatch.setenv(faults.ENV, point)
    with pytest.raises(ValueError, match="unknown point"):
        faults.point("analysis")


def test_sigterm_to_optico_tune_interrupts_the_job_and_releases_it(db_url: str, tmp_path: Path):
    """`optico tune` stopped by SIGTERM (a batch scheduler, `docker stop`) hands the job back as Ctrl-C
    does: interrupted, no lease held, exit 143, and `--resume` runs at once (it waited out the lease)."""
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(spec("slow-cli", max_trials=4, trial_seconds=1.5, seed=5)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
    env.update(FAST, OPTICO_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "optico.cli", "tune", str(path), "--database", db_url], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with SqlStore(db_url) as store:
        wait_for(lambda: store.list_jobs() and len(store.trials(store.list_jobs()[0].id)) >= 2, what="trial 2")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        job = store.list_jobs()[0]
        assert proc.returncode == 143 and "is resumable" in stderr, stderr
        assert job.status is JobStatus.INTERRUPTED and job.lease_owner is None
        resumed = subprocess.run([sys.executable, "-m", "optico.cli", "tune", "--resume", str(job.id), "--database",
                                  db_url], env=env, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert store.get_job(job.id).status is JobStatus.SUCCEEDED and len(store.trials(job.id)) == 4

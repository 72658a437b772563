"""The job lifecycle, leases, idempotent submission, tokens and redaction — on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import threading
from datetime import datetime, timedelta, timezone

import pytest
from pool_testkit import make_spec
from sqlalchemy import select, text, update
from test_pool_concurrency import run_threads

from optico.events import TrialStarted
from optico.pool import IdempotencyConflict, IllegalTransition, JobStatus, LeaseHeld, LeaseLost, SqlStore
from optico.pool.lifecycle import ALLOWED, LifecycleError, NoNewTrial
from optico.pool.models import JobRow, TokenRow, TrialRow
from optico.strategy import Strategy
from optico.trial import Metrics, TrialStatus

S = JobStatus
METRICS = Metrics(step_time_s=1.0, tflops_per_gpu=400.0, mfu=0.4, tokens_per_s_per_gpu=1000.0)


def put_in(store: SqlStore, status: JobStatus, worker: str = "w1") -> int:
    """A job in `status`, reached through legal transitions only."""
    job_id = store.create_job(make_spec())
    if status is S.QUEUED:
        return job_id
    if status is S.CANCELLED:
        store.transition(job_id, S.CANCELLED)
        return job_id
    store.claim_job(worker, 60, job_id=job_id)
    if status is S.STOPPING:
        store.transition(job_id, S.STOPPING)
    elif status in (S.SUCCEEDED, S.FAILED, S.INTERRUPTED):
        store.transition(job_id, status, worker=worker)
    return job_id


def expire_lease(store: SqlStore, job_id: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(JobRow).where(JobRow.id == job_id)
                     .values(lease_expires_at=datetime(2020, 1, 1, tzinfo=timezone.utc)))


@pytest.mark.parametrize(("start", "wanted"), list(itertools.product(list(S), list(S))))
def test_every_transition_follows_the_table(store: SqlStore, start: JobStatus, wanted: JobStatus) -> None:
    job_id = put_in(store, start)
    before = store.get_job(job_id)
    events_before = len(store.events(job_id))
    worker = "w1" if before.lease_owner == "w1" else None
    if start in ALLOWED[wanted] and not (worker is None and wanted in (S.SUCCEEDED, S.FAILED, S.INTERRUPTED)):
        after = store.transition(job_id, wanted, reason="why", worker=worker)
        assert after.status is wanted
        assert store.events(job_id)[-1].event.status == wanted.value
        return
    with pytest.raises((IllegalTransition, ValueError)) as info:
        store.transition(job_id, wanted, worker=worker)
    if isinstance(info.value, IllegalTransition):
        assert f"job {job_id} is {start.value}" in str(info.value)
    after = store.get_job(job_id)
    assert after.status is start and after.updated_at == before.updated_at  # nothing written
    assert len(store.events(job_id)) == events_before


def test_only_from_refuses_a_state_that_changed_since_it_was_read(store: SqlStore) -> None:
    """A stop reads a queued job and cancels it only if still queued: claimed meanwhile, it is refused."""
    job_id = put_in(store, S.QUEUED)
    store.claim_job("w1", 60, job_id=job_id)  # between the caller's read and its write
    with pytest.raises(IllegalTransition, match="is running"):
        store.transition(job_id, S.CANCELLED, reason="stop", only_from=frozenset({S.QUEUED}))
    assert store.get_job(job_id).status is S.RUNNING
    assert store.submit_job(make_spec("new"), idempotency_key="k1")[1] is True
    assert store.submit_job(make_spec("new"), idempotency_key="k1")[1] is False


def test_a_cancel_is_not_overwritten_by_the_worker(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING)
    store.transition(job_id, S.CANCELLED, reason="user asked")
    with pytest.raises(IllegalTransition, match="is cancelled"):
        store.transition(job_id, S.SUCCEEDED, reason="max trials", worker="w1")
    job = store.get_job(job_id)
    assert job.status is S.CANCELLED and job.stop_reason == "user asked"
    # The live worker keeps the lease until it has killed its trial and released it.
    assert job.lease_owner == "w1"
    assert store.renew_lease(job_id, "w1", 60).status is S.CANCELLED
    store.release_lease(job_id, "w1")
    assert store.get_job(job_id).lease_owner is None


def test_claim_takes_the_oldest_queue_job_once(store: SqlStore) -> None:
    first, second = store.create_job(make_spec("a")), store.create_job(make_spec("b"))
    store.create_job(make_spec("mine"), origin="cli")  # never picked up by a worker
    got = store.claim_job("w1", 60)
    assert got is not None and got.id == first and got.status is S.RUNNING and got.lease_owner == "w1"
    assert got.started_at is not None and got.lease_expires_at > store.db_now()
    assert store.claim_job("w2", 60).id == second
    assert store.claim_job("w3", 60) is None
    kinds = [e.kind for e in store.events(first)]
    assert kinds == ["state", "state", "lease"]


def test_a_cli_job_queued_again_is_the_workers(store: SqlStore) -> None:
    # `optico tune` interrupted, then `optico jobs resume` (or the API): it was queued and never claimed.
    job_id = store.create_job(make_spec("mine"), origin="cli")
    store.claim_job("tune", 60, job_id=job_id)
    store.transition(job_id, S.INTERRUPTED, worker="tune")
    store.release_lease(job_id, "tune")
    assert store.claim_job("w1", 60) is None  # interrupted under `optico tune`: its own to resume
    store.transition(job_id, S.QUEUED)
    got = store.claim_job("w1", 60)
    assert got is not None and got.id == job_id and got.origin == "queue"


def test_a_live_lease_refuses_another_worker_naming_the_holder(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING, worker="alpha")
    with pytest.raises(LeaseHeld) as info:
        store.claim_job("beta", 60, job_id=job_id)
    assert str(info.value).startswith(f"job {job_id} is held by worker alpha until ")
    with pytest.raises(LeaseLost):
        store.renew_lease(job_id, "beta", 60)
    assert store.claim_job("alpha", 60, job_id=job_id).lease_owner == "alpha"  # the holder may re-claim


def test_an_expired_lease_is_taken_over_and_fences_the_old_worker(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING, worker="dead")
    trial = store.start_trial(job_id, 1, Strategy(), worker="dead")
    assert store.claim_job("live", 60) is None  # live lease: nothing claimable
    expire_lease(store, job_id)
    taken = store.claim_job("live", 60)
    assert taken is not None and taken.id == job_id and taken.lease_owner == "live" and taken.takeovers == 1
    last = store.events(job_id)[-1].event
    assert last.kind == "lease" and last.action == "taken_over" and last.previous_worker == "dead"
    # The old worker wakes up: every write of its job is refused, nothing is written.
    for write in (lambda: store.finish_trial(trial.id, status=TrialStatus.OK, metrics=METRICS, worker="dead"),
                  lambda: store.start_trial(job_id, 2, Strategy(), worker="dead"),
                  lambda: store.add_message(job_id, 1, "analysis", "output", {}, worker="dead"),
                  lambda: store.add_event(job_id, TrialStarted(index=1, strategy="x"), worker="dead"),
                  lambda: store.transition(job_id, S.SUCCEEDED, worker="dead"),
                  lambda: store.renew_lease(job_id, "dead", 60)):
        with pytest.raises(LeaseLost, match="worker dead lost the lease"):
            write()
    assert store.get_trial(trial.id).status is TrialStatus.RUNNING and len(store.trials(job_id)) == 1
    assert store.service_stats()["lease_takeovers"] == 1


@pytest.mark.parametrize("settler", ["claimer", "reader"])
def test_a_job_cancelled_while_its_worker_was_gone_is_settled_once_the_lease_expires(store: SqlStore,
                                                                                     settler: str) -> None:
    job_id = put_in(store, S.RUNNING, worker="dead")
    trial = store.start_trial(job_id, 1, Strategy(), worker="dead")
    cancelled = store.transition(job_id, S.CANCELLED)
    assert cancelled.lease_owner == "dead"  # a live-looking worker keeps it, to record its trial lost
    assert store.claim_job("live", 60) is None and store.get_job(job_id).lease_owner == "dead"  # not yet expired
    expire_lease(store, job_id)
    other = put_in(store, S.QUEUED)
    assert store.settle_abandoned_cancels(other) == 0  # only the job asked about, and only an abandoned one
    if settler == "claimer":
        assert store.claim_job("live", 60).id == other  # the claimer settled the job before taking work
    else:
        assert store.settle_abandoned_cancels(job_id) == 1  # an event stream, `optico jobs show`
        assert store.claim_job("live", 60).id == other
    job = store.get_job(job_id)
    assert job.status is S.CANCELLED and job.lease_owner is None and job.lease_expires_at is None
    lost = store.get_trial(trial.id)
    assert lost.status is TrialStatus.LOST and lost.failure.summary.startswith("lost: the job was cancelled")
    said, done, lease = (e.event for e in store.events(job_id)[-3:])
    assert said.kind == "trial_lost" and said.index == 1  # as a worker says it (it was not said at all)
    assert done.kind == "job_done" and done.status == "cancelled" and done.trials == 1
    assert lease.kind == "lease" and lease.action == "expired" and lease.worker == "dead"
    seq = store.last_event_seq(job_id)
    assert store.claim_job("live", 60) is None and store.last_event_seq(job_id) == seq  # settled once
    assert store.settle_abandoned_cancels() == 0 and store.last_event_seq(job_id) == seq


@pytest.mark.parametrize("nobody_runs_it", ["interrupted", "lease_expired"])
def test_a_cancel_of_a_run_nobody_runs_is_settled_in_its_own_transaction(store: SqlStore,
                                                                         nobody_runs_it: str) -> None:
    # Cancelling an interrupted job (its running trial kept for the re-run) or one whose worker's lease
    # had expired left that trial running for ever, with no job_done.
    job_id = put_in(store, S.RUNNING, worker="w1")
    trial = store.start_trial(job_id, 1, Strategy(), worker="w1")
    store.begin_attempt(trial.id, worker="w1")
    if nobody_runs_it == "interrupted":
        store.transition(job_id, S.INTERRUPTED, worker="w1")
    else:
        expire_lease(store, job_id)
    job = store.transition(job_id, S.CANCELLED, reason="cancelled on request")
    assert job.status is S.CANCELLED and job.lease_owner is None and job.lease_expires_at is None
    lost = store.get_trial(trial.id)
    assert lost.status is TrialStatus.LOST and "no worker ran it" in lost.failure.summary
    events = [e.event for e in store.events(job_id)]
    cancel = next(i for i, e in enumerate(events) if e.kind == "state" and e.status == "cancelled")
    assert events[cancel + 1].kind == "trial_lost" and events[cancel + 1].index == 1  # in the cancel's transaction
    assert events[cancel + 2].kind == "job_done" and events[cancel + 2].trials == 1
    assert [e.kind for e in events].count("job_done") == 1
    expired = [e.event for e in store.events(job_id) if e.kind == "lease" and e.event.action == "expired"]
    assert len(expired) == (1 if nobody_runs_it == "lease_expired" else 0)


def test_a_cancel_of_a_live_run_or_of_a_queued_job_settles_nothing_itself(store: SqlStore) -> None:
    queued = put_in(store, S.QUEUED)
    store.transition(queued, S.CANCELLED)
    assert "job_done" not in [e.kind for e in store.events(queued)]  # it never ran: no run to settle
    live = put_in(store, S.RUNNING, worker="w1")
    trial = store.start_trial(live, 1, Strategy(), worker="w1")
    assert store.transition(live, S.CANCELLED).lease_owner == "w1"  # its worker records the trial lost
    assert store.get_trial(trial.id).status is TrialStatus.RUNNING
    assert "job_done" not in [e.kind for e in store.events(live)]


def test_a_clean_interruption_is_counted_apart_from_deaths(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING, worker="w1")
    launched = store.start_trial(job_id, 1, Strategy(), worker="w1")
    store.begin_attempt(launched.id, worker="w1")
    store.transition(job_id, S.INTERRUPTED, worker="w1")
    trial = store.get_trial(launched.id)
    assert (trial.attempts, trial.interruptions) == (1, 1)
    store.claim_job("w2", 60, job_id=job_id)
    assert store.begin_attempt(trial.id, worker="w2").attempts == 2  # then w2 is killed: a death
    expire_lease(store, job_id)
    store.claim_job("w3", 60, job_id=job_id)
    store.begin_attempt(trial.id, worker="w3")
    unlaunched = store.start_trial(job_id, 2, Strategy(tensor_model_parallel_size=2), worker="w3")
    store.transition(job_id, S.INTERRUPTED, worker="w3")
    assert (store.get_trial(trial.id).attempts, store.get_trial(trial.id).interruptions) == (3, 2)
    assert store.get_trial(unlaunched.id).interruptions == 0  # never launched: nothing interrupted


def test_interrupted_queue_jobs_are_claimed_again_and_finished_ones_never(store: SqlStore) -> None:
    interrupted = put_in(store, S.INTERRUPTED)
    done = put_in(store, S.SUCCEEDED)
    cancelled = put_in(store, S.CANCELLED)
    assert store.claim_job("w9", 60).id == interrupted
    assert store.claim_job("w9", 60) is None
    for job_id, status in ((done, "succeeded"), (cancelled, "cancelled")):
        with pytest.raises(IllegalTransition, match=f"is {status}"):
            store.claim_job("w9", 60, job_id=job_id)


def test_concurrent_claimers_never_share_a_job(db_url: str) -> None:
    stores = [SqlStore(db_url) for _ in range(2)]
    try:
        jobs = [stores[0].create_job(make_spec(f"j{i}")) for i in range(12)]
        got: dict[str, list[int]] = {f"w{i}": [] for i in range(4)}
        lock = threading.Lock()

        def claimer(store: SqlStore, worker: str):
            def run() -> None:
                while (job := store.claim_job(worker, 60)) is not None:
                    with lock:
                        got[worker].append(job.id)
            return run

        errors = run_threads([claimer(stores[i % 2], w) for i, w in enumerate(got)])
        assert errors == []
        claimed = [j for ids in got.values() for j in ids]
        assert sorted(claimed) == jobs  # every job exactly once
    finally:
        for s in stores:
            s.close()


def test_stop_budget_and_best_are_live(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING)
    assert store.set_budget(job_id, max_trials=3, gpu_hours=2.5).max_trials == 3
    assert store.get_job(job_id).gpu_hours == 2.5
    assert store.events(job_id)[-1].event.kind == "budget"
    for bad in ({"max_trials": 0}, {"max_trials": True}, {"gpu_hours": -1.0}, {"gpu_hours": float("inf")}):
        with pytest.raises(ValueError):
            store.set_budget(job_id, **bad)
    stopping = store.transition(job_id, S.STOPPING, reason="enough")
    assert stopping.status is S.STOPPING and stopping.stop_reason == "enough"
    store.transition(job_id, S.SUCCEEDED, reason="stopped on request", worker="w1")
    with pytest.raises(LifecycleError, match="can no longer change"):
        store.set_budget(job_id, max_trials=9)


def test_a_job_asked_to_stop_starts_no_new_trial(store: SqlStore) -> None:
    # Compare-and-set under the job's lock: a stop or cancel landing while the agents chose the next
    # trial launched it anyway.
    job_id = put_in(store, S.RUNNING)
    first = store.start_trial(job_id, 1, Strategy(), worker="w1")
    store.transition(job_id, S.STOPPING, reason="enough")
    with pytest.raises(NoNewTrial, match="is stopping; it starts no new trial"):
        store.start_trial(job_id, 2, Strategy(tensor_model_parallel_size=2), worker="w1")
    assert store.start_trial(job_id, 1, Strategy(), worker="w1") == first  # a re-run still reads its trial
    store.transition(job_id, S.CANCELLED)
    with pytest.raises(NoNewTrial, match="is cancelled"):
        store.start_trial(job_id, 2, Strategy(tensor_model_parallel_size=2), worker="w1")
    assert [t.index for t in store.trials(job_id)] == [1]


def test_trial_attempts_and_lost_trials(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING)
    trial = store.start_trial(job_id, 1, Strategy(), worker="w1")
    assert trial.attempts == 0
    assert store.begin_attempt(trial.id, worker="w1").attempts == 1
    assert store.begin_attempt(trial.id, worker="w1").attempts == 2
    lost = store.lose_trial(trial.id, "worker died twice", worker="w1")
    assert lost.status is TrialStatus.LOST and lost.failure.summary == "lost: worker died twice"
    assert store.lose_trial(trial.id, "again", worker="w1") == lost  # no-op on a lost trial
    with pytest.raises(ValueError, match="only a running trial"):
        store.begin_attempt(trial.id, worker="w1")
    with pytest.raises(ValueError, match="ok or failed"):
        store.finish_trial(trial.id, status=TrialStatus.LOST)
    assert store.workload_trials(make_spec().workload.key()) == []  # a lost trial teaches nothing


def test_idempotency_key_returns_the_same_job(store: SqlStore) -> None:
    a = store.create_job(make_spec("x"), idempotency_key="key-1")
    assert store.create_job(make_spec("x"), idempotency_key="key-1") == a
    assert store.create_job(make_spec("x"), idempotency_key="key-2") != a
    with pytest.raises(IdempotencyConflict, match="different spec"):
        store.create_job(make_spec("y"), idempotency_key="key-1")
    assert len(store.list_jobs()) == 2


def test_racing_submissions_with_one_key_make_one_job(db_url: str) -> None:
    stores = [SqlStore(db_url) for _ in range(2)]
    try:
        ids: list[int] = []
        errors = run_threads([lambda s=stores[i % 2]: ids.append(s.create_job(make_spec(), idempotency_key="k"))
                              for i in range(6)])
        assert errors == [] and len(set(ids)) == 1 and len(stores[0].list_jobs()) == 1
    finally:
        for s in stores:
            s.close()


def test_tokens_store_only_a_hash(store: SqlStore) -> None:
    record, token = store.create_token("ci", "write")
    assert token.startswith("optico_w_") and len(token) > 40 and record.can_write
    assert store.authenticate(token) == store.authenticate(token)
    assert store.authenticate(token).name == "ci"
    assert store.authenticate(token + "x") is None and store.authenticate("") is None
    _, reader = store.create_token("dash", "read")
    assert not store.authenticate(reader).can_write
    with store.engine.connect() as conn:
        stored = " ".join(str(v) for row in conn.execute(select(TokenRow)).all() for v in row)
    assert token not in stored and reader not in stored
    with pytest.raises(ValueError, match="exists"):
        store.create_token("ci", "read")
    with pytest.raises(ValueError, match="scope"):
        store.create_token("admin", "root")
    assert store.revoke_token("ci").revoked_at is not None
    assert store.authenticate(token) is None
    assert [t.name for t in store.tokens()] == ["ci", "dash"]
    # The error said "revoke it or pick another name"; revoking did not free the name (it stays on record).
    with pytest.raises(ValueError, match="'ci' was revoked .*; pick another name"):
        store.create_token("ci", "read")


def test_secrets_are_redacted_before_they_are_stored(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-live-very-secret-value-123456"
    monkeypatch.setenv("OPTICO_LLM_API_KEY", key)
    spec = make_spec()
    spec = spec.model_copy(update={"launcher": spec.launcher.model_copy(
        update={"env": {"WANDB_API_KEY": "wandb-secret-987654", "NCCL_DEBUG": "INFO"}})})
    job_id = store.create_job(spec)
    job = store.get_job(job_id)
    assert job.spec.launcher.env == {"WANDB_API_KEY": "***", "NCCL_DEBUG": "INFO"}
    store.claim_job("w", 60, job_id=job_id)
    trial = store.start_trial(job_id, 1, Strategy(), rationale=f"key is {key}", worker="w")
    done = store.finish_trial(trial.id, status=TrialStatus.FAILED, log_excerpt=f"env: OPTICO_LLM_API_KEY={key}\n"
                              f"WANDB_API_KEY=wandb-secret-987654", worker="w")
    store.add_message(job_id, 1, "failure", "diagnosis", {"answer": f"the key {key} leaked"}, key, worker="w")
    with store.engine.connect() as conn:
        dump = "\n".join(str(row) for table in ("optico_jobs", "optico_trials", "optico_messages", "optico_events")
                         for row in conn.execute(text(f"SELECT * FROM {table}")).all())
    assert key not in dump and "wandb-secret-987654" not in dump
    assert "***" in done.log_excerpt and "***" in store.get_trial(trial.id).rationale


def test_a_text_stored_before_it_became_a_secret_is_masked_once_it_is(store: SqlStore,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Short texts go through a cache of masked credential shapes; a secret known later must still be
    masked in them, and a shape masked from the cache is masked every time."""
    job_id = store.create_job(make_spec())
    store.claim_job("w", 60, job_id=job_id)
    word, shaped = "nightly-7f3a", "Bearer abcdef0123456789"
    for iteration in (1, 2):
        store.add_message(job_id, iteration, "analysis", "output", {"tag": word, word: shaped}, worker="w")
    monkeypatch.setenv("OPTICO_WEBHOOK_TOKEN", word)
    store.add_message(job_id, 3, "analysis", "output", {"tag": word, word: shaped}, worker="w")
    contents = [m.content for m in store.messages(job_id)]
    assert contents[:2] == [{"tag": word, word: "Bearer ***"}] * 2
    assert contents[2] == {"tag": "***", "***": "Bearer ***"}


def test_service_stats_count_in_sql(store: SqlStore) -> None:
    job_id = put_in(store, S.RUNNING)
    put_in(store, S.QUEUED)
    trial = store.start_trial(job_id, 1, Strategy(), worker="w1")
    store.finish_trial(trial.id, status=TrialStatus.OK, metrics=METRICS, wall_seconds=42.0, worker="w1")
    store.add_message(job_id, 1, "analysis", "llm_call", {"prompt_tokens": 100, "completion_tokens": 20,
                                                          "cost_usd": 0.5}, worker="w1")
    store.add_message(job_id, 1, "analysis", "llm_call", {"prompt_tokens": 110, "completion_tokens": 25,
                                                          "cost_usd": 0.75}, worker="w1")  # replaces, not adds
    stats = store.service_stats()
    assert stats["jobs"] == {"running": 1, "queued": 1}
    assert stats["trials"] == {"ok": 1}
    assert stats["trial_seconds"]["count"] == 1 and stats["trial_seconds"]["sum"] == 42.0
    assert stats["trial_seconds"]["buckets"][60.0] == 1 and stats["trial_seconds"]["buckets"][10.0] == 0
    assert stats["llm"] == {"prompt_tokens": 110, "completion_tokens": 25, "cost_usd": 0.75}


def test_db_now_is_the_database_clock(store: SqlStore) -> None:
    now = store.db_now()
    assert now.tzinfo is not None and abs(now - datetime.now(timezone.utc)) < timedelta(minutes=5)


def test_job_stats_count_a_page_of_jobs_in_sql(store: SqlStore) -> None:
    a, b = put_in(store, S.RUNNING), store.create_job(make_spec("empty"))
    ok = store.finish_trial(store.start_trial(a, 1, Strategy(), worker="w1").id, status=TrialStatus.OK,
                            metrics=METRICS, gpu_seconds=3600.0, worker="w1")
    store.finish_trial(store.start_trial(a, 2, Strategy(micro_batch_size=2), worker="w1").id,
                       status=TrialStatus.FAILED, gpu_seconds=1800.0, worker="w1")
    store.start_trial(a, 3, Strategy(micro_batch_size=4), worker="w1")
    store.set_best_trial(a, ok.id, worker="w1")
    stats = store.job_stats([a, b, 999])
    assert set(stats) == {a, b}
    assert (stats[a].trials, stats[a].ok, stats[a].failed, stats[a].running, stats[a].lost) == (3, 1, 1, 1, 0)
    assert stats[a].gpu_seconds == 5400.0 and stats[a].best == ok
    assert stats[b].trials == 0 and stats[b].best is None
    assert store.job_stats([]) == {}


def test_search_jobs_sorts_and_pages_in_sql(store: SqlStore) -> None:
    ids = []
    for i, mfu in enumerate([0.5, None, 0.7, 0.6]):
        job_id = put_in(store, S.RUNNING, worker=f"w{i}")
        if mfu is not None:
            trial = store.finish_trial(store.start_trial(job_id, 1, Strategy(), worker=f"w{i}").id,
                                       status=TrialStatus.OK, worker=f"w{i}",
                                       metrics=Metrics(step_time_s=1, tflops_per_gpu=1, mfu=mfu, tokens_per_s_per_gpu=1))
            store.set_best_trial(job_id, trial.id, worker=f"w{i}")
        ids.append(job_id)
    jobs, total = store.search_jobs(sort="best_mfu", descending=True)
    assert total == 4 and [j.best_mfu for j in jobs] == [0.7, 0.6, 0.5, None]  # no best: last either way
    jobs, _ = store.search_jobs(sort="best_mfu", descending=False)
    assert [j.best_mfu for j in jobs] == [0.5, 0.6, 0.7, None]
    page, total = store.search_jobs(sort="id", descending=False, offset=1, limit=2)
    assert [j.id for j in page] == ids[1:3] and total == 4
    store.transition(ids[0], S.CANCELLED)
    assert store.search_jobs(status=S.CANCELLED)[1] == 1
    with pytest.raises(ValueError, match="sort"):
        store.search_jobs(sort="spec; DROP TABLE optico_jobs")


def test_a_job_whose_loop_ended_failed_is_not_resumed_and_a_broken_run_is(store: SqlStore) -> None:
    """Stopped before any trial succeeded, the loop ends the job failed (`complete_job`, its job_done
    logged). Resumed, its graph started at its end and ran nothing, and "finished" overwrote the stop
    reason: refused instead, by the API, `jobs resume` and `tune --resume` alike."""
    from optico.loop import complete_job
    from optico.pool.lifecycle import NothingToResume

    ended = put_in(store, S.RUNNING)
    complete_job(store, ended, "w1", "stopped on request")
    store.release_lease(ended, "w1")
    assert store.get_job(ended).status is S.FAILED
    events = len(store.events(ended))
    with pytest.raises(NothingToResume, match=r"failed at the end of its loop \(stopped on request\)"):
        store.transition(ended, S.QUEUED, reason="resumed on request")
    with pytest.raises(NothingToResume):
        store.claim_job("tune", 60, job_id=ended)
    after = store.get_job(ended)
    assert after.status is S.FAILED and after.stop_reason == "stopped on request" and len(store.events(ended)) == events
    broken = put_in(store, S.RUNNING)
    store.transition(broken, S.FAILED, reason="ConnectionError: the Ray cluster went away", worker="w1")
    store.release_lease(broken, "w1")
    assert store.transition(broken, S.QUEUED, reason="resumed on request").status is S.QUEUED


def backdate(store: SqlStore, job_id: int, trial_id: int, *, launched_s_ago: float, heartbeat_s_ago: float) -> None:
    """The running launch of `trial_id` began `launched_s_ago`; its worker last renewed `heartbeat_s_ago`."""
    now = store.db_now()
    with store.engine.begin() as conn:
        conn.execute(update(TrialRow).where(TrialRow.id == trial_id).values(
            attempt_started_at=store._stamp(now - timedelta(seconds=launched_s_ago))))
        conn.execute(update(JobRow).where(JobRow.id == job_id).values(
            heartbeat_at=store._stamp(now - timedelta(seconds=heartbeat_s_ago))))


def test_launches_that_end_without_a_result_still_count_their_gpu_time(store: SqlStore) -> None:
    """A trial's gpu_seconds was its last launch's: a launch whose worker died, stopped or was cancelled
    spent GPU time that neither the GPU-hour budget nor the report counted."""
    job_id = put_in(store, S.RUNNING, worker="w1")
    trial = store.start_trial(job_id, 1, Strategy(), worker="w1")
    store.begin_attempt(trial.id, gpus=8, worker="w1")
    backdate(store, job_id, trial.id, launched_s_ago=100, heartbeat_s_ago=40)  # w1 died 60 s into it
    expire_lease(store, job_id)
    store.claim_job("w2", 60, job_id=job_id)
    assert store.get_trial(trial.id).lost_gpu_seconds == pytest.approx(60 * 8, abs=1)  # to its last heartbeat
    store.begin_attempt(trial.id, gpus=8, worker="w2")
    backdate(store, job_id, trial.id, launched_s_ago=30, heartbeat_s_ago=0)
    store.transition(job_id, S.INTERRUPTED, worker="w2")  # w2 stops cleanly 30 s in
    assert store.get_trial(trial.id).lost_gpu_seconds == pytest.approx(90 * 8, abs=2)
    store.claim_job("w3", 60, job_id=job_id)
    store.begin_attempt(trial.id, gpus=8, worker="w3")
    done = store.finish_trial(trial.id, status=TrialStatus.OK, metrics=METRICS, gpu_seconds=1000.0, worker="w3")
    assert done.gpu_seconds == pytest.approx(1000 + 90 * 8, abs=2) and done.lost_gpu_seconds < done.gpu_seconds
    assert store.job_stats([job_id])[job_id].gpu_seconds == pytest.approx(done.gpu_seconds)

    cancelled = put_in(store, S.RUNNING, worker="w1")  # its worker kills the run on cancel
    killed = store.start_trial(cancelled, 1, Strategy(), worker="w1")
    store.begin_attempt(killed.id, gpus=4, worker="w1")
    backdate(store, cancelled, killed.id, launched_s_ago=10, heartbeat_s_ago=0)
    store.transition(cancelled, S.CANCELLED)
    assert store.lose_trial(killed.id, "cancelled", worker="w1").gpu_seconds == pytest.approx(10 * 4, abs=1)

    abandoned = put_in(store, S.RUNNING, worker="w1")  # cancelled, and its worker was gone
    orphan = store.start_trial(abandoned, 1, Strategy(), worker="w1")
    store.begin_attempt(orphan.id, gpus=2, worker="w1")
    backdate(store, abandoned, orphan.id, launched_s_ago=50, heartbeat_s_ago=20)
    store.transition(abandoned, S.CANCELLED)
    expire_lease(store, abandoned)
    assert store.settle_abandoned_cancels(abandoned) == 1
    assert store.get_trial(orphan.id).lost_gpu_seconds == pytest.approx(30 * 2, abs=1)


def test_a_queued_job_whose_row_cannot_be_read_is_failed_and_the_next_one_claimed(store: SqlStore) -> None:
    """A spec written into the row by hand (`[1, 2, NaN]`) raised out of claim_job on every poll: every
    worker thread that met it died, and the jobs queued behind it were never run."""
    broken, fine = put_in(store, S.QUEUED), put_in(store, S.QUEUED)
    with store.engine.begin() as conn:
        conn.execute(update(JobRow).where(JobRow.id == broken).values(spec=[1, 2, "not a spec"]))
    assert store.claim_job("w1", 60).id == fine
    with store.engine.begin() as conn:
        status, reason, owner = conn.execute(select(JobRow.status, JobRow.stop_reason, JobRow.lease_owner)
                                             .where(JobRow.id == broken)).one()
    assert status == "failed" and reason.startswith("its stored row cannot be read") and owner is None
    assert store.claim_job("w2", 60) is None  # failed: not offered again


def test_an_event_row_that_is_no_event_is_read_as_unreadable_in_its_place(store: SqlStore) -> None:
    """A payload written by hand (a lease event whose `action` is a number) raised out of `events()`: the
    job's event stream sent its preamble and broke, and clients reconnected into the same error."""
    from optico.pool.models import EventRow

    job_id = put_in(store, S.RUNNING, worker="w1")
    first = store.events(job_id)[0]
    with store.engine.begin() as conn:
        conn.execute(update(EventRow).where(EventRow.job_id == job_id, EventRow.seq == first.seq)
                     .values(payload={"action": 5, "worker": ["sk-ABCDEFGHIJKLMNOPQRSTUV123456"]}))
    events = store.events(job_id)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # nothing lost, nothing out of order
    odd = events[0].event
    assert odd.kind == "unreadable" and odd.stored_kind == first.kind and odd.reason
    assert "sk-ABCDEFGHIJKLMNOPQRSTUV123456" not in odd.model_dump_json()
    with pytest.raises(ValueError, match="never stored"):
        store.add_event(job_id, odd, worker="w1")


def test_a_job_row_that_cannot_be_read_is_left_out_of_the_lists_not_fatal_to_them(store: SqlStore, caplog) -> None:
    """One job row written by hand (a status no job has) took down `optico jobs list`, the API's list and the
    dashboard's: every listing converts every row."""
    broken, fine = put_in(store, S.QUEUED), put_in(store, S.QUEUED)
    with store.engine.begin() as conn:
        conn.execute(update(JobRow).where(JobRow.id == broken).values(status="pwned<script>"))
    assert [j.id for j in store.list_jobs(limit=10) if j.id in (broken, fine)] == [fine]
    found, total = store.search_jobs(limit=10)
    assert fine in [j.id for j in found] and broken not in [j.id for j in found]
    assert f"job {broken} cannot be read" in caplog.text

"""The Store contract, run against every backend (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from pool_testkit import make_spec
from pydantic import ValidationError
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError

from optico.events import AgentOutput, TrialFinished, TrialLog, TrialStarted
from optico.pool import AgentMessage, JobRecord, JobStatus, SqlStore, Store, StoredEvent, StoreError
from optico.pool.models import EventRow, MessageRow, TrialRow, WorkloadRow
from optico.strategy import Strategy
from optico.trial import Failure, FailureCategory, Metrics, Trial, TrialStatus

TP2 = Strategy(tensor_model_parallel_size=2)
TP4 = Strategy(tensor_model_parallel_size=4)
PP2 = Strategy(pipeline_model_parallel_size=2)


def metrics(mfu: float = 0.4) -> Metrics:
    return Metrics(step_time_s=1.5, tflops_per_gpu=mfu * 989, mfu=mfu, tokens_per_s_per_gpu=4000.0,
                   mem_max_gib=60.0, mem_limit_gib=80.0)


OOM = Failure(category=FailureCategory.OOM, summary="MICRO_BATCH_SIZE 8 caused CUDA OOM (Confidence: 90)",
              params=["micro_batch_size"], confidence=90)


def test_is_a_store(store: SqlStore) -> None:
    assert isinstance(store, Store)


# -- jobs ------------------------------------------------------------------------------------

def test_create_and_get_job_round_trips_the_spec(store: SqlStore) -> None:
    spec = make_spec("llama")
    job_id = store.create_job(spec)
    job = store.get_job(job_id)
    assert isinstance(job, JobRecord)
    assert job.id == job_id and job.name == "llama"
    assert job.status is JobStatus.QUEUED
    assert job.spec == spec
    assert job.workload_key == spec.workload.key()
    assert job.created_at.tzinfo is not None and job.updated_at.tzinfo is not None
    assert abs((datetime.now(timezone.utc) - job.created_at).total_seconds()) < 120
    assert job.heartbeat_at is None and job.stop_reason is None and job.best_trial_id is None
    assert job.lease_owner is None and job.max_trials == spec.budget.max_trials and job.origin == "queue"


def test_workload_row_is_stored_once_per_key(store: SqlStore) -> None:
    store.create_job(make_spec("a"))
    store.create_job(make_spec("b"))
    store.create_job(make_spec("c", seq_length=8192))
    with store.engine.connect() as conn:
        keys = conn.execute(select(WorkloadRow.key)).scalars().all()
    assert sorted(keys) == sorted({make_spec().workload.key(), make_spec(seq_length=8192).workload.key()})


def test_list_jobs_newest_first_with_limit(store: SqlStore) -> None:
    ids = [store.create_job(make_spec(f"j{i}")) for i in range(4)]
    assert [j.id for j in store.list_jobs()] == ids[::-1]
    assert [j.id for j in store.list_jobs(limit=2)] == ids[:1:-1]


def test_best_trial_of_another_job_is_refused_and_nothing_is_written(store: SqlStore) -> None:
    a, b = store.create_job(make_spec("a")), store.create_job(make_spec("b"))
    other = store.start_trial(b, 1, TP2)
    with pytest.raises(ValueError, match="of job"):
        store.set_best_trial(a, other.id)
    assert store.get_job(a).best_trial_id is None


def test_list_jobs_filters_and_pages(store: SqlStore) -> None:
    ids = [store.create_job(make_spec(f"name-{i}")) for i in range(5)]
    elsewhere = store.create_job(make_spec("other", seq_length=8192))
    store.transition(ids[0], JobStatus.CANCELLED)
    assert [j.id for j in store.list_jobs(status=JobStatus.CANCELLED)] == [ids[0]]
    assert [j.id for j in store.list_jobs(workload_key=make_spec(seq_length=8192).workload.key())] == [elsewhere]
    assert [j.id for j in store.list_jobs(name="name-")] == ids[::-1]
    assert [j.id for j in store.list_jobs(name="%")] == []  # LIKE wildcards are matched literally
    page = store.list_jobs(limit=2, name="name-")
    assert [j.id for j in page] == [ids[4], ids[3]]
    assert [j.id for j in store.list_jobs(limit=2, name="name-", before_id=page[-1].id)] == [ids[2], ids[1]]


# -- trials ----------------------------------------------------------------------------------

def test_start_trial_returns_a_running_trial_with_the_signature(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    trial = store.start_trial(job_id, 1, TP2, rationale="baseline")
    assert isinstance(trial, Trial)
    assert trial.status is TrialStatus.RUNNING and trial.index == 1 and trial.job_id == job_id
    assert trial.strategy == TP2 and trial.signature == TP2.signature()
    assert trial.rationale == "baseline" and trial.metrics is None and trial.failure is None
    assert store.get_trial(trial.id) == trial


def test_start_trial_is_idempotent_on_job_and_index(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    first = store.start_trial(job_id, 1, TP2, rationale="first")
    again = store.start_trial(job_id, 1, TP4, rationale="second")
    assert again == first  # unchanged: same id, strategy and rationale
    done = store.finish_trial(first.id, status=TrialStatus.OK, metrics=metrics())
    assert store.start_trial(job_id, 1, TP2) == done  # whatever its status
    assert len(store.trials(job_id)) == 1
    other_job = store.create_job(make_spec("other"))
    assert store.start_trial(other_job, 1, TP2).id != first.id


def test_trials_are_ordered_by_index(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    for index in (3, 1, 2):
        store.start_trial(job_id, index, Strategy(micro_batch_size=2 ** (index - 1)))
    assert [t.index for t in store.trials(job_id)] == [1, 2, 3]
    assert store.trials(store.create_job(make_spec("empty"))) == []


def test_finish_trial_records_the_outcome(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    trial = store.start_trial(job_id, 1, TP2)
    done = store.finish_trial(trial.id, status=TrialStatus.OK, metrics=metrics(0.45), gpu_seconds=123.5,
                              fingerprint={"megatron_core": "0.16.1", "gpus": 8}, log_path="/logs/1.txt",
                              log_excerpt="iteration 10")
    assert done.status is TrialStatus.OK and done.metrics == metrics(0.45) and done.mfu == 0.45
    assert done.gpu_seconds == 123.5 and done.fingerprint == {"megatron_core": "0.16.1", "gpus": 8}
    assert done.log_path == "/logs/1.txt" and done.log_excerpt == "iteration 10"
    assert store.get_trial(trial.id) == done


def _finished_at(store: SqlStore, trial_id: int) -> datetime | None:
    with store.engine.connect() as conn:
        value = conn.execute(select(TrialRow.finished_at).where(TrialRow.id == trial_id)).scalar_one()
    return value.replace(tzinfo=None) if value is not None else None


def test_finish_trial_twice_is_a_no_op_and_different_values_overwrite(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    trial = store.start_trial(job_id, 1, TP2)
    assert _finished_at(store, trial.id) is None
    kwargs = dict(status=TrialStatus.FAILED, failure=OOM, gpu_seconds=10.0, log_excerpt="CUDA out of memory")
    first = store.finish_trial(trial.id, **kwargs)  # type: ignore[arg-type]
    assert _finished_at(store, trial.id) is not None
    sentinel = datetime(2020, 1, 1)
    with store.engine.begin() as conn:
        conn.execute(update(TrialRow).where(TrialRow.id == trial.id).values(finished_at=sentinel))
    assert store.finish_trial(trial.id, **kwargs) == first  # type: ignore[arg-type]
    assert _finished_at(store, trial.id) == sentinel  # untouched: the repeat wrote nothing
    retried = store.finish_trial(trial.id, status=TrialStatus.OK, metrics=metrics(), gpu_seconds=20.0)
    assert retried.status is TrialStatus.OK and retried.failure is None and retried.gpu_seconds == 20.0
    assert retried.log_excerpt == "" and retried.metrics == metrics()
    assert _finished_at(store, trial.id) != sentinel


def test_finish_trial_refuses_running(store: SqlStore) -> None:
    trial = store.start_trial(store.create_job(make_spec()), 1, TP2)
    with pytest.raises(ValueError, match="running"):
        store.finish_trial(trial.id, status=TrialStatus.RUNNING)
    assert store.get_trial(trial.id).status is TrialStatus.RUNNING


def test_set_trial_failure_attaches_the_diagnosis(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    trial = store.start_trial(job_id, 1, TP2)
    store.finish_trial(trial.id, status=TrialStatus.FAILED, log_excerpt="OOM")
    diagnosed = store.set_trial_failure(trial.id, OOM)
    assert diagnosed.failure == OOM and diagnosed.status is TrialStatus.FAILED
    assert diagnosed.log_excerpt == "OOM"
    assert store.get_trial(trial.id).failure == OOM
    ok = store.start_trial(job_id, 2, TP4)
    store.finish_trial(ok.id, status=TrialStatus.OK, metrics=metrics())
    with pytest.raises(ValueError, match="succeeded"):
        store.set_trial_failure(ok.id, OOM)
    assert store.get_trial(ok.id).failure is None


def test_workload_trials_are_finished_trials_of_other_jobs_on_the_same_workload(store: SqlStore) -> None:
    a, b = store.create_job(make_spec("a")), store.create_job(make_spec("b"))
    elsewhere = store.create_job(make_spec("c", seq_length=8192))
    a_ok = store.finish_trial(store.start_trial(a, 1, TP2).id, status=TrialStatus.OK, metrics=metrics())
    a_failed = store.finish_trial(store.start_trial(a, 2, TP4).id, status=TrialStatus.FAILED, failure=OOM)
    store.start_trial(a, 3, PP2)  # still running: not knowledge yet
    b_ok = store.finish_trial(store.start_trial(b, 1, PP2).id, status=TrialStatus.OK, metrics=metrics(0.5))
    store.finish_trial(store.start_trial(elsewhere, 1, TP2).id, status=TrialStatus.OK, metrics=metrics())
    key = make_spec().workload.key()
    assert store.workload_trials(key, exclude_job=b) == [a_ok, a_failed]
    assert store.workload_trials(key, exclude_job=a) == [b_ok]
    assert store.workload_trials(key) == [a_ok, a_failed, b_ok]
    assert store.workload_trials("no-such-key") == []


def test_best_trial_is_the_highest_mfu_success(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    assert store.best_trial(job_id) is None
    store.finish_trial(store.start_trial(job_id, 1, TP2).id, status=TrialStatus.OK, metrics=metrics(0.3))
    best = store.finish_trial(store.start_trial(job_id, 2, TP4).id, status=TrialStatus.OK, metrics=metrics(0.5))
    store.finish_trial(store.start_trial(job_id, 3, PP2).id, status=TrialStatus.FAILED, failure=OOM)
    assert store.best_trial(job_id) == best


# -- messages and events -----------------------------------------------------------------------

def test_add_message_upserts_on_job_iteration_agent_kind(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    first = store.add_message(job_id, 1, "analysis", "diagnosis", {"state": "MEMORY_BOUND"}, "first")
    replaced = store.add_message(job_id, 1, "analysis", "diagnosis", {"state": "HEALTHY"}, "second")
    assert replaced == first
    other_kind = store.add_message(job_id, 1, "analysis", "suggestions", {"items": []})
    assert other_kind != first
    msgs = store.messages(job_id)
    assert [m.id for m in msgs] == [first, other_kind]
    assert msgs[0].content == {"state": "HEALTHY"} and msgs[0].text == "second"
    assert isinstance(msgs[0], AgentMessage) and msgs[0].created_at.tzinfo is not None


def test_a_message_and_its_announcement_are_stored_together_or_not_at_all(store: SqlStore) -> None:
    """The loop stores an agent's message with the event announcing it in one transaction: a reader of
    the event log never sees an announcement whose message is missing, nor the reverse."""
    job_id = store.create_job(make_spec())
    before = len(store.events(job_id))
    said = AgentOutput(iteration=1, agent="analysis", message="output", text="TP 2 -> 4")
    message_id = store.add_message(job_id, 1, "analysis", "output", {"n": 1}, "TP 2 -> 4", event=said)
    [message], events = store.messages(job_id), store.events(job_id)
    assert message.id == message_id and message.content == {"n": 1}
    assert len(events) == before + 1 and events[-1].event == said
    # A write that fails after the message went in (here: the event, not JSON, is refused as it is
    # appended) leaves neither behind.
    with pytest.raises(ValueError, match="event must be JSON"):
        store.add_message(job_id, 2, "analysis", "output", {"n": 2},
                          event=TrialFinished(index=1, strategy="TP2", status="ok", mfu=float("nan")))
    assert [m.id for m in store.messages(job_id)] == [message_id] and len(store.events(job_id)) == before + 1
    with pytest.raises(ValueError, match="log events"):
        store.add_message(job_id, 3, "analysis", "output", {}, event=TrialLog(index=1, line="x"))
    assert len(store.messages(job_id)) == 1


def test_messages_are_ordered_by_iteration_then_id_and_filter_by_iteration(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    late = store.add_message(job_id, 2, "generation", "proposal", {"n": 2})
    early_a = store.add_message(job_id, 1, "generation", "proposal", {"n": 1})
    early_b = store.add_message(job_id, 1, "validation", "verdict", {"ok": True})
    assert [m.id for m in store.messages(job_id)] == [early_a, early_b, late]
    assert [m.id for m in store.messages(job_id, iteration=2)] == [late]
    other = store.create_job(make_spec("other"))
    assert store.messages(other) == []


def test_events_are_typed_and_numbered_per_job(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    other = store.create_job(make_spec("other"))
    seqs = [store.add_event(job_id, TrialStarted(index=i, strategy="TP1")) for i in range(1, 4)]
    store.add_event(other, AgentOutput(iteration=1, agent="analysis", message="output"))
    events = store.events(job_id)
    assert [e.seq for e in events] == [1, *seqs]  # seq 1: the 'queued' state event of create_job
    assert events[0].kind == "state" and events[0].event.status == "queued"
    assert seqs == [2, 3, 4] and [e.event.index for e in events[1:]] == [1, 2, 3]
    assert all(isinstance(e, StoredEvent) for e in events)
    assert [e.seq for e in store.events(job_id, after=seqs[0])] == seqs[1:]
    assert store.events(job_id, after=seqs[-1]) == []
    assert [e.seq for e in store.events(job_id, limit=2)] == [1, 2]
    assert [e.seq for e in store.events(other)] == [1, 2]


def test_log_events_are_never_stored(store: SqlStore) -> None:
    from optico.events import TrialLog

    job_id = store.create_job(make_spec())
    with pytest.raises(ValueError, match="never stored"):
        store.add_event(job_id, TrialLog(index=1, line="x"))


# -- what callers hold -------------------------------------------------------------------------

def test_returned_objects_are_frozen(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    trial = store.start_trial(job_id, 1, TP2)
    store.add_message(job_id, 1, "a", "k", {})
    for obj, field, value in [(store.get_job(job_id), "status", JobStatus.FAILED), (trial, "status", "ok"),
                              (store.messages(job_id)[0], "text", "x"), (store.events(job_id)[0], "seq", 9)]:
        with pytest.raises(ValidationError):
            setattr(obj, field, value)
    assert store.get_trial(trial.id).status is TrialStatus.RUNNING


@pytest.mark.parametrize("call", [
    lambda s: s.get_job(999),
    lambda s: s.transition(999, JobStatus.CANCELLED),
    lambda s: s.claim_job("w", 5, job_id=999),
    lambda s: s.renew_lease(999, "w", 5),
    lambda s: s.set_budget(999, max_trials=3),
    lambda s: s.start_trial(999, 1, TP2),
    lambda s: s.get_trial(999),
    lambda s: s.finish_trial(999, status=TrialStatus.OK, metrics=metrics()),
    lambda s: s.set_trial_failure(999, OOM),
    lambda s: s.trials(999),
    lambda s: s.add_message(999, 1, "a", "k", {}),
    lambda s: s.messages(999),
    lambda s: s.add_event(999, TrialStarted(index=1, strategy="x")),
    lambda s: s.events(999),
    lambda s: s.best_trial(999),
    lambda s: s.set_best_trial(s.create_job(make_spec()), 999),
    lambda s: s.revoke_token("nobody"),
])
def test_unknown_ids_raise_key_error(store: SqlStore, call: Callable[[SqlStore], object]) -> None:
    with pytest.raises(KeyError):
        call(store)


def test_values_that_cannot_be_stored_raise_value_error_and_write_nothing(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    with pytest.raises(ValueError, match="content"):
        store.add_message(job_id, 1, "a", "k", {"not json": object()})
    with pytest.raises(ValueError, match="content"):
        store.add_message(job_id, 1, "a", "k", {"x": float("nan")})
    trial = store.start_trial(job_id, 1, TP2)
    with pytest.raises(ValueError, match="fingerprint"):
        store.finish_trial(trial.id, status=TrialStatus.OK, metrics=metrics(), fingerprint={"t": float("inf")})
    assert store.messages(job_id) == []
    assert store.get_trial(trial.id).status is TrialStatus.RUNNING
    # What is stored comes back as JSON gives it: tuples become lists.
    store.add_message(job_id, 1, "a", "ok", {"shape": (1, 2)})
    assert store.messages(job_id)[0].content == {"shape": [1, 2]}


def test_database_errors_roll_back_and_raise_store_error(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE optico_events"))
    with pytest.raises(StoreError) as info:
        store.add_event(job_id, TrialStarted(index=1, strategy="x"))
    assert info.value.__cause__ is not None
    store.add_message(job_id, 1, "a", "k", {})  # the store is still usable


def test_a_closed_store_refuses_work(db_url: str) -> None:
    s = SqlStore(db_url)
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.list_jobs()


def test_context_manager_closes(db_url: str) -> None:
    with SqlStore(db_url) as s:
        job_id = s.create_job(make_spec())
    with SqlStore(db_url) as again:  # data outlives the store
        assert again.get_job(job_id).name == "job"


# -- constraints the database itself enforces ----------------------------------------------------------

def test_unique_trial_index_per_job_is_a_database_constraint(store: SqlStore) -> None:
    trial = store.start_trial(store.create_job(make_spec()), 1, TP2)
    row = dict(job_id=trial.job_id, index=1, signature="x", strategy={}, status="running", rationale="",
               gpu_seconds=0.0, fingerprint={}, log_excerpt="")
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(TrialRow).values(**row))


def test_unique_message_key_is_a_database_constraint(store: SqlStore) -> None:
    job_id = store.create_job(make_spec())
    store.add_message(job_id, 1, "analysis", "diagnosis", {})
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(MessageRow).values(job_id=job_id, iteration=1, agent="analysis", kind="diagnosis",
                                               content={}, text=""))


def test_foreign_keys_are_enforced(store: SqlStore) -> None:
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(EventRow).values(job_id=12345, seq=1, kind="orphan", payload={}))

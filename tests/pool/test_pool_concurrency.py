"""Several threads and several stores (as several processes would) on one database."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pool_testkit import make_spec

from optico.events import TrialStarted
from optico.pool import SqlStore
from optico.strategy import Strategy
from optico.trial import Metrics, TrialStatus

METRICS = Metrics(step_time_s=1.0, tflops_per_gpu=400.0, mfu=0.4, tokens_per_s_per_gpu=1000.0)


def run_threads(targets: list[Callable[[], None]]) -> list[BaseException]:
    """Starts all targets at once; returns what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                barrier.wait()
                target()
            except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                errors.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return errors


def work_loop(store: SqlStore, job_id: int, rounds: int) -> Callable[[], None]:
    """A job worker's write pattern: claim, then read-then-write transactions back to back, fenced by
    the lease, renewing it as the heartbeat thread would."""
    worker = f"w{job_id}"

    def run() -> None:
        store.claim_job(worker, 60, job_id=job_id)
        for i in range(1, rounds + 1):
            trial = store.start_trial(job_id, i, Strategy(micro_batch_size=1 + i % 4), worker=worker)
            store.add_message(job_id, i, "analysis", "diagnosis", {"i": i}, worker=worker)
            store.add_event(job_id, TrialStarted(index=i, strategy="x"), worker=worker)
            store.renew_lease(job_id, worker, 60)
            store.finish_trial(trial.id, status=TrialStatus.OK, metrics=METRICS, gpu_seconds=float(i), worker=worker)
            store.trials(job_id)
    return run


def test_concurrent_writers_do_not_fail(db_url: str) -> None:
    # Two stores = two engines = two connection pools, like two worker processes; two
    # threads on each. On SQLite this is where "database is locked" would show.
    first, second = SqlStore(db_url), SqlStore(db_url)
    try:
        jobs = [first.create_job(make_spec(f"job{i}")) for i in range(4)]
        rounds = 25
        errors = run_threads([work_loop(store, job_id, rounds)
                              for store, job_id in zip([first, first, second, second], jobs, strict=True)])
        assert errors == []
        for job_id in jobs:
            trials = first.trials(job_id)
            assert [t.index for t in trials] == list(range(1, rounds + 1))
            assert all(t.status is TrialStatus.OK for t in trials)
            assert len(first.messages(job_id)) == rounds
            started = [e for e in first.events(job_id) if e.kind == "trial_started"]
            assert len(started) == rounds
            seqs = [e.seq for e in first.events(job_id)]
            assert seqs == list(range(1, len(seqs) + 1))  # no gap, no repeat
    finally:
        first.close()
        second.close()


def test_racing_claims_of_one_trial_index_get_one_trial(db_url: str) -> None:
    stores = [SqlStore(db_url) for _ in range(2)]
    try:
        job_id = stores[0].create_job(make_spec())
        claimed: list[int] = []

        def claim(store: SqlStore, mbs: int) -> Callable[[], None]:
            return lambda: claimed.append(store.start_trial(job_id, 1, Strategy(micro_batch_size=mbs)).id)

        errors = run_threads([claim(stores[i % 2], 2 ** (i % 4)) for i in range(8)])
        assert errors == []
        assert len(claimed) == 8 and len(set(claimed)) == 1
        assert len(stores[0].trials(job_id)) == 1
    finally:
        for s in stores:
            s.close()


def test_sqlite_store_and_langgraph_write_the_same_file_at_once(tmp_path: Path) -> None:
    import sqlite3

    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from optico.pool import langgraph_url

    class State(TypedDict):
        n: int

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    store = SqlStore(url)
    conn = sqlite3.connect(langgraph_url(url), check_same_thread=False, timeout=30)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        graph = StateGraph(State)
        graph.add_node("inc", lambda s: {"n": s["n"] + 1})
        graph.add_edge(START, "inc")
        graph.add_edge("inc", END)
        app = graph.compile(checkpointer=saver)
        job_id = store.create_job(make_spec())

        def graph_loop() -> None:
            for i in range(40):
                app.invoke({"n": i}, {"configurable": {"thread_id": f"t{i}"}})

        errors = run_threads([graph_loop, work_loop(store, job_id, 40)])
        assert errors == []
        assert len(store.trials(job_id)) == 40
        assert saver.get_tuple({"configurable": {"thread_id": "t39"}}) is not None
    finally:
        conn.close()
        store.close()

"""Runs a job under its lease: builds the agents, the launcher and the guard, then drives the graph.

    claim the lease ──► heartbeat thread renews it for the whole run (long trials included)
                   └──► the graph runs as an asyncio task; a cancel request, a lost lease or a
                        shutdown cancels the task, which kills the running trial (launcher contract)

The outcome is written by the lease holder only: succeeded (the graph's `finish`), cancelled
(the request came from outside; the running trial is recorded lost), interrupted (Ctrl-C or a
worker shutdown: resumable), failed (the run itself broke; resumable). "Finished" is read from
the pool's status, never from the checkpoint, so a resume always completes the job.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from optico.agents.analysis import RulesAnalysis
from optico.agents.failure import NoFailureAnalysis, RulesFailureAnalysis
from optico.agents.fallback import WithFallback, pool_notifier
from optico.agents.generation import RulesGeneration
from optico.candidates import candidate_pool
from optico.checkpoint import open_checkpointer, thread_config
from optico.errors import first_line
from optico.events import JobFinished, TrialLost
from optico.guard import Guard
from optico.launchers.base import Launcher
from optico.launchers.factory import build_launcher
from optico.loop import EventSink, LoopContext, build_graph, complete_job
from optico.perfmodel.constants import load_constants
from optico.perfmodel.online import JobModel
from optico.pool.contract import Store, StoreError
from optico.pool.lifecycle import JobStatus, LeaseLost, LifecycleError
from optico.pool.records import JobRecord
from optico.redact import clip, redact
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import TrialStatus

log = logging.getLogger("optico.runner")


@dataclass(frozen=True)
class LeasePolicy:
    """How long a lease lasts and how often it is renewed (a dead worker's job is taken over after
    `lease_s`; renewing every `lease_s / 4` rides out a few missed beats)."""

    lease_s: float = 60.0
    renew_s: float | None = None

    @property
    def interval_s(self) -> float:
        return self.renew_s if self.renew_s is not None else self.lease_s / 4

    @classmethod
    def from_env(cls) -> LeasePolicy:
        """OPTICO_LEASE_S and OPTICO_LEASE_RENEW_S, held to the service settings' bounds; ValueError
        naming the variable and the reason."""
        lease = _seconds_from_env("OPTICO_LEASE_S", 60.0, above=LEASE_BOUNDS_S[0], at_most=LEASE_BOUNDS_S[1])
        renew = _seconds_from_env("OPTICO_LEASE_RENEW_S", None, above=0.0, at_most=LEASE_BOUNDS_S[1])
        if renew is not None and renew >= lease:
            raise ValueError(f"OPTICO_LEASE_RENEW_S: must be shorter than OPTICO_LEASE_S ({lease:g} s)")
        return cls(lease_s=lease, renew_s=renew)


# A lease is over 1 s (a heartbeat must fit in it) and at most a day (ServiceSettings.lease_s).
LEASE_BOUNDS_S = (1.0, 86_400.0)


def _seconds_from_env(name: str, default: float | None, *, above: float, at_most: float) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (above < value <= at_most):  # NaN fails every comparison
        raise ValueError(f"{name}: must be a number of seconds above {above:g} and at most {at_most:g}, "
                         f"got {raw[:40]!r}")
    return value


def new_worker_id(role: str = "worker") -> str:
    """host:pid:random — unique per process start, readable in "held by worker W"."""
    return f"{socket.gethostname()}:{os.getpid()}:{role}-{uuid.uuid4().hex[:6]}"


def search_pool(spec: JobSpec, launcher: Launcher) -> tuple[list[Strategy], list[Strategy] | None]:
    """(the strategies the agents score — the valid space, or for a large space its coarse lattice
    plus the moves around each reference, see optico.candidates — and the launcher's finite set or None)."""
    candidates = launcher.candidates(spec.workload)
    if candidates is None:
        return candidate_pool(spec.search_space, spec.workload), None
    inside = [s for s in candidates if spec.search_space.contains(s)]
    if len(inside) < len(candidates):  # a table's runs the space cannot express are never tried: say so
        log.warning(
            "%d of the %d configurations the launcher measured for this workload lie outside the search space "
            "and will not be tried (widen search_space to include them)", len(candidates) - len(inside),
            len(candidates))
    return inside, inside


def build_context(spec: JobSpec, store: Store, job_id: int, *, worker: str, launcher: Launcher | None = None,
                  on_event: EventSink | None = None) -> LoopContext:
    constants = load_constants(spec.calibration)
    launcher = launcher or build_launcher(spec.launcher, spec.seed, constants)
    model = JobModel(spec.workload, constants)
    pool, candidates = search_pool(spec, launcher)
    model.prime(pool)
    guard = Guard(spec.workload, spec.search_space, model, candidates)
    try:
        prior = store.workload_trials(spec.workload.key(), exclude_job=job_id)
    except StoreError:
        raise  # the database is down: the job is interrupted, not run blind
    except Exception as exc:  # noqa: BLE001 - a row another job left unreadable: this job runs without the warm start
        log.warning(
            "job %d: the pool's earlier trials of this workload cannot be read (%s); starting without them",
            job_id, redact(first_line(exc))[:300])
        prior = []
    rules_analysis = RulesAnalysis(model, guard, pool)
    rules_generation = RulesGeneration()
    rules_failure = RulesFailureAnalysis()
    analysis, generation, failure = rules_analysis, rules_generation, rules_failure
    chosen = spec.reasoner
    # Every reasoner that is not the rules is wrapped: a fallback to the rules is recorded, shown
    # and, with require_llm, an error (optico.agents.fallback).
    notify = pool_notifier(store, job_id, on_event, worker=worker)
    if chosen.uses_llm:
        # Imported here: a rules-only job never loads the openai package. Settings come from
        # OPTICO_LLM_*; a missing model or key raises ValueError naming the variable.
        from optico.agents.llm import build_llm_reasoners

        def record(agent: str, iteration: int, kind: str, content: dict, text: str = "") -> None:
            store.add_message(job_id, iteration, agent, kind, content, text, worker=worker)

        def vet(strategy: Strategy, history: list) -> str | None:
            verdict = guard.check(strategy, history, prior)
            return None if verdict.admitted else f"{verdict.rule}: {verdict.reason}"

        llm = build_llm_reasoners(spec, rules_analysis, record, vet=vet)
        wrap = {"require_llm": chosen.require_llm}
        if chosen.analysis != "rules":
            analysis = WithFallback("analysis", llm.analysis, rules_analysis, notify, **wrap)
        if chosen.generation != "rules":
            generation = WithFallback("generation", llm.generation, rules_generation, notify, **wrap)
        if chosen.failure != "rules":
            failure = WithFallback("failure", llm.failure, rules_failure, notify, **wrap)
    if chosen.ablated("failure-analysis"):
        failure = WithFallback("failure", NoFailureAnalysis(), rules_failure, notify)
    return LoopContext(store=store, spec=spec, worker=worker, launcher=launcher, model=model, guard=guard, pool=pool,
                       analysis=analysis, generation=generation, failure=failure,
                       rules_analysis=rules_analysis, rules_generation=rules_generation,
                       rules_failure=rules_failure, on_event=on_event, prior=prior, candidates=candidates)


# How often the heartbeat reads the job's status between renewals: a cancel kills the running trial
# within this, not within a renewal interval (15 s by default).
STATUS_POLL_S = 1.0


class Heartbeat(threading.Thread):
    """Renews the lease every `policy.interval_s` while the job runs, and watches for what ends it
    early: a cancel request (read every `STATUS_POLL_S`), a lost lease (another worker took over),
    or a database that stays unreachable past the lease (we can no longer be sure we hold it). Any
    of them cancels the task."""

    def __init__(self, store: Store, job_id: int, worker: str, policy: LeasePolicy,
                 loop: asyncio.AbstractEventLoop, task: asyncio.Task):
        super().__init__(name=f"optico-heartbeat-{job_id}", daemon=True)
        self.store, self.job_id, self.worker, self.policy = store, job_id, worker, policy
        self.loop, self.task = loop, task
        self.reason: str | None = None  # why the task was cancelled: 'cancelled', 'lease_lost', 'lease_expired'
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def _end(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.loop.call_soon_threadsafe(self.task.cancel)

    def run(self) -> None:
        last_ok = last_renewal = time.monotonic()
        while not self._stop_event.wait(min(STATUS_POLL_S, self.policy.interval_s)):
            try:
                if time.monotonic() - last_renewal >= self.policy.interval_s:
                    job = self.store.renew_lease(self.job_id, self.worker, self.policy.lease_s)
                    last_renewal = time.monotonic()
                else:
                    job = self.store.get_job(self.job_id)
                last_ok = time.monotonic()
            except LeaseLost:
                self._end("lease_lost")
                return
            except StoreError:
                if time.monotonic() - last_ok > self.policy.lease_s:
                    self._end("lease_expired")
                    return
                continue
            if job.status is JobStatus.CANCELLED:
                self._end("cancelled")
                return


async def _run_graph(store: Store, database_url: str, job_id: int, ctx: LoopContext) -> None:
    async with open_checkpointer(database_url) as saver:
        app = build_graph().compile(checkpointer=saver)
        config = thread_config(job_id)
        snapshot = await app.aget_state(config)
        # A thread with values is resumed with None, even when LangGraph reports no `next` (a step
        # whose output was saved without its checkpoint): it finishes the interrupted step.
        start = None if snapshot.values else {"job_id": job_id, "next_index": 1}
        await app.ainvoke(start, config, context=ctx, durability="sync")
    # The graph may end without `finish` having run in this process (it ran before a crash whose
    # status write was lost): the status decides, and completing is safe to repeat.
    complete_job(store, job_id, ctx.worker, "finished", on_event=ctx.on_event)


class JobInterrupted(Exception):
    """The run stopped before the job finished (shutdown, Ctrl-C): the job is resumable."""


async def run_claimed_job(store: Store, database_url: str, job_id: int, *, worker: str,
                          policy: LeasePolicy | None = None, launcher: Launcher | None = None,
                          on_event: EventSink | None = None, shutdown: asyncio.Event | None = None) -> JobRecord:
    """Runs job `job_id`, whose lease `worker` holds, to its end; returns the final record.

    `shutdown` set from outside interrupts the run (the running trial is killed and re-run by the
    next worker). Never raises for the outcome of the job itself: a broken run marks it failed."""
    policy = policy or LeasePolicy()
    job = store.get_job(job_id)
    try:
        # Building takes seconds for a large space: a stop or a broken build (an LLM setting this
        # worker lacks, a launcher it cannot start) ends the claimed job here too, never leaves it
        # running under a lease nobody renews.
        ctx = build_context(job.spec, store, job_id, worker=worker, launcher=launcher, on_event=on_event)
    except KeyboardInterrupt:
        _settle(store, job_id, worker, "interrupted", on_event)
        raise
    except Exception as exc:  # noqa: BLE001 - recorded on the job, as a broken run is
        _end_broken_run(store, job_id, worker, exc, on_event)
        return store.get_job(job_id)
    task = asyncio.ensure_future(_run_graph(store, database_url, job_id, ctx))
    heartbeat = Heartbeat(store, job_id, worker, policy, asyncio.get_running_loop(), task)
    heartbeat.start()
    watcher = asyncio.ensure_future(_cancel_on(shutdown, task, heartbeat)) if shutdown is not None else None
    try:
        await task
    except asyncio.CancelledError:
        if heartbeat.reason is None:
            # This coroutine itself was cancelled (Ctrl-C under asyncio.run): an interruption.
            heartbeat.reason = "interrupted"
            _settle(store, job_id, worker, heartbeat.reason, on_event)
            raise
        _settle(store, job_id, worker, heartbeat.reason, on_event)
    except KeyboardInterrupt:
        heartbeat.reason = heartbeat.reason or "interrupted"
        _settle(store, job_id, worker, "interrupted", on_event)
        raise
    except LeaseLost:
        pass  # another worker runs the job now; nothing of ours may be written
    except Exception as exc:  # the run broke (a bug, a Ray cluster gone): failed, resumable
        _end_broken_run(store, job_id, worker, exc, on_event)
    finally:
        ctx.model.abandon()  # an agent's thread still predicting for this run stops (Ctrl-C, cancel, lease lost)
        heartbeat.stop()
        if watcher is not None:
            watcher.cancel()
        await ctx.launcher.aclose()
    job = store.get_job(job_id)
    if job.status is JobStatus.CANCELLED and job.lease_owner == worker:
        # Cancelled after the heartbeat's last look, and the run ended first: settle it the same way.
        _settle(store, job_id, worker, "cancelled", on_event)
        job = store.get_job(job_id)
    return job


def database_unavailable(exc: BaseException) -> bool:
    """A lost or refused database connection (psycopg's, SQLAlchemy's or sqlite3's operational error),
    anywhere in the exception's chain (the store wraps the driver's). Not any database error: a
    constraint broken by a bug would fail again on every resume."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    kinds: list[type[BaseException]] = [OperationalError, sqlite3.OperationalError]
    try:
        import psycopg

        kinds.append(psycopg.OperationalError)
    except ImportError:  # SQLite only: no psycopg installed
        pass
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, tuple(kinds)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _cancel_on(shutdown: asyncio.Event, task: asyncio.Task, heartbeat: Heartbeat) -> None:
    await shutdown.wait()
    if heartbeat.reason is None:
        heartbeat.reason = "interrupted"
        task.cancel()


def _lose_running(store: Store, job_id: int, worker: str, reason: str, on_event: EventSink | None = None) -> None:
    """Records the job's running trial (if any) lost, with its `trial_lost` event: its run ended without
    a result we can trust."""
    for trial in store.trials(job_id):
        if trial.status is TrialStatus.RUNNING:
            store.lose_trial(trial.id, reason, worker=worker)
            event = TrialLost(index=trial.index, reason=reason)
            store.add_event(job_id, event, worker=worker)
            if on_event:
                on_event(event.kind, event.model_dump(mode="json"))


def _end_broken_run(store: Store, job_id: int, worker: str, exc: Exception, on_event: EventSink | None) -> None:
    """The run broke (a bug, a Ray cluster gone, a context this worker cannot build): the job is
    failed (resumable), or interrupted when the database went away."""
    reason = clip(f"{type(exc).__name__}: {exc}".splitlines()[0], 500)
    try:
        if database_unavailable(exc):
            # A database restart or failover is not the job's failure: interrupted, so a worker (this
            # one once it reconnects, or another) resumes it and re-runs the trial it was running.
            store.transition(job_id, JobStatus.INTERRUPTED, worker=worker,
                             reason=f"interrupted: the database connection was lost ({reason})")
        else:
            # The trial it was running has no result: recorded lost, not left running for ever.
            _lose_running(store, job_id, worker, f"the run broke: {reason}", on_event)
            store.transition(job_id, JobStatus.FAILED, reason=reason, worker=worker)
    except (LifecycleError, StoreError):
        pass  # the database is still down: the lease expires and the next holder takes the job over


def _settle(store: Store, job_id: int, worker: str, reason: str, on_event: EventSink | None) -> None:
    """After the task was cancelled for `reason`: record the running trial and the job's state."""
    if reason in ("lease_lost", "lease_expired"):
        return  # not ours any more: the next holder resumes (and re-runs the trial once)
    try:
        if reason == "cancelled":
            _lose_running(store, job_id, worker, "the job was cancelled while it ran", on_event)
            trials = store.trials(job_id)
            best = [t.mfu for t in trials if t.mfu is not None]
            event = JobFinished(status=JobStatus.CANCELLED.value, stop_reason="cancelled", trials=len(trials),
                                best_mfu=max(best) if best else None)
            store.add_event(job_id, event, worker=worker)
            store.release_lease(job_id, worker)
            if on_event:
                on_event(event.kind, event.model_dump(mode="json"))
        elif store.get_job(job_id).status is JobStatus.STOPPING:
            # A stop was asked for: the job ends now, its running trial recorded lost, rather than
            # being resumed by the next worker as if nobody had asked (a rolling restart lost the stop).
            _lose_running(store, job_id, worker, "its worker stopped while the job was stopping", on_event)
            complete_job(store, job_id, worker, "stopped on request (its worker stopped during the last trial)",
                         on_event=on_event)
        else:
            store.transition(job_id, JobStatus.INTERRUPTED, reason="interrupted: its worker stopped", worker=worker)
    except (LifecycleError, StoreError):
        pass  # the lease is gone or the database is down: the next holder sorts it out


def run_job(store: Store, database_url: str, job_id: int, *, worker: str | None = None,
            policy: LeasePolicy | None = None, launcher: Launcher | None = None,
            on_event: EventSink | None = None) -> JobRecord:
    """Claims job `job_id` for `worker` (a new id if None) and runs it to its end in this thread.

    Raises LeaseHeld when another live worker holds it, IllegalTransition when it has finished.
    Ctrl-C marks the job interrupted (resumable) and re-raises KeyboardInterrupt."""
    policy = policy or LeasePolicy.from_env()
    worker = worker or new_worker_id("tune")
    store.claim_job(worker, policy.lease_s, job_id=job_id)
    return asyncio.run(run_claimed_job(store, database_url, job_id, worker=worker, policy=policy,
                                       launcher=launcher, on_event=on_event))

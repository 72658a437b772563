"""The pool's contract: what every store keeps, whatever database is under it.

Thread safety: one Store may be shared by any number of threads. Every method is one
transaction: it commits before returning, or rolls back and raises; nothing is written when
a method raises. Several processes (workers, API replicas, `optico tune`) may use one
database at once.

Ownership: a job is run by the one worker holding its lease. Methods that write a job's
progress take `worker=`; when given, the write happens only if that worker still holds the
lease (else `LeaseLost`), so a worker that paused past its lease and was taken over cannot
write over its successor. Readers (the API, the dashboard, a warm-starting job) read any time.

Idempotence: a worker resumed after a crash re-runs the graph node that was interrupted, so
- `start_trial` is keyed by (job, index): a second call returns the existing trial;
- `finish_trial` with the same values is a no-op;
- `add_message` replaces the message of the same (job, iteration, agent, kind).
Events are the exception: an append-only log whose `seq` grows by one per job in commit order.

Text: every string written (logs, diagnoses, agent messages, events, the spec) is redacted of
known secrets first (`optico.redact`); a spec's `launcher.env` values under secret-looking
names are stored as `***`.

Errors: an unknown job, trial or token raises KeyError; an argument that contradicts what is
stored raises ValueError; a refused lifecycle step raises a `LifecycleError` (IllegalTransition,
LeaseHeld, LeaseLost) whose message is one line; a database failure raises StoreError.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from types import TracebackType
from typing import Any

from optico.events import JobEvent, ScheduleEvent
from optico.pool.lifecycle import JobStatus, LifecycleError
from optico.pool.records import (
    AgentMessage,
    Incumbent,
    JobRecord,
    JobStats,
    ScheduleRecord,
    StoredEvent,
    StoredScheduleEvent,
    TickRecord,
    TickVerdict,
    TokenRecord,
)
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import Failure, Metrics, Trial, TrialStatus


SORT_KEYS = ("id", "name", "status", "best_mfu", "created_at", "started_at", "finished_at")


class StoreError(RuntimeError):
    """The database itself failed (lost connection, lock timeout, a broken constraint).

    The transaction was rolled back; the driver's exception is chained as __cause__."""


class IdempotencyConflict(ValueError):
    """An Idempotency-Key already names a job with a different spec."""


class TickBusy(LifecycleError):
    """Another live replica is ticking the schedule."""

    def __init__(self, name: str, worker: str, until: datetime):
        self.name, self.worker, self.until = name, worker, until
        super().__init__(f"schedule {name!r} is being ticked by {worker} until {until:%Y-%m-%d %H:%M:%S} UTC")


class TickLost(LifecycleError):
    """The tick is no longer the caller's: its lock expired and another replica took the schedule over."""

    def __init__(self, tick_id: int, worker: str):
        self.tick_id, self.worker = tick_id, worker
        super().__init__(f"tick {tick_id} is no longer held by {worker}: its lock expired")


class Store(ABC):
    """The global message pool: the one place a job's history lives (see the module docstring)."""

    # -- jobs ----------------------------------------------------------------------------
    def create_job(self, spec: JobSpec, *, origin: str = "queue", idempotency_key: str | None = None) -> int:
        """Stores a new job (QUEUED; its workload if unseen) and returns its id.

        With `idempotency_key`: a job already created with that key is returned instead (its id),
        if its spec is the same; IdempotencyConflict if it differs. `origin` is 'queue' (the
        workers pick it up) or 'cli' (run by the process that created it)."""
        return self.submit_job(spec, origin=origin, idempotency_key=idempotency_key)[0]

    @abstractmethod
    def submit_job(self, spec: JobSpec, *, origin: str = "queue", idempotency_key: str | None = None
                   ) -> tuple[int, bool]:
        """`create_job`, also saying whether this call created the job (False: the key's earlier job),
        decided in the same transaction, so one of many racing submissions is told it created it."""

    @abstractmethod
    def job_id_for_key(self, idempotency_key: str) -> int | None:
        """The job created with this Idempotency-Key, if any."""

    @abstractmethod
    def get_job(self, job_id: int) -> JobRecord:
        """The job; KeyError if unknown."""

    @abstractmethod
    def list_jobs(self, limit: int = 50, *, status: JobStatus | None = None, workload_key: str | None = None,
                  name: str | None = None, before_id: int | None = None) -> list[JobRecord]:
        """Up to `limit` jobs, newest first, filtered by status, workload key and name (a substring);
        `before_id` pages: only jobs with a smaller id."""

    @abstractmethod
    def search_jobs(self, *, status: JobStatus | None = None, workload_key: str | None = None,
                    name: str | None = None, sort: str = "id", descending: bool = True, offset: int = 0,
                    limit: int = 50) -> tuple[list[JobRecord], int]:
        """A page of jobs for a table a person sorts and pages (the dashboard): (jobs, total matching).
        `sort`: one of SORT_KEYS; ties and NULLs (a job without a best trial) go last, then by id.
        ValueError for an unknown sort key."""

    @abstractmethod
    def job_stats(self, job_ids: list[int]) -> dict[int, JobStats]:
        """Trial counts, GPU-seconds and the best trial of each job, in a constant number of queries
        (a list page of many jobs stays fast). Unknown ids are left out."""

    @abstractmethod
    def db_now(self) -> datetime:
        """The database clock (UTC): the one clock leases are judged by."""

    # -- the lifecycle ---------------------------------------------------------------------
    @abstractmethod
    def transition(self, job_id: int, to: JobStatus, *, reason: str | None = None, worker: str | None = None,
                   then: JobEvent | None = None, only_from: frozenset[JobStatus] | None = None) -> JobRecord:
        """Compare-and-set: moves the job to `to` if its current state allows it (see
        `lifecycle.ALLOWED`) and, with `only_from`, is one of those (a caller that chose `to` from the
        state it read), recording a `state` event in the same transaction, and `then` after it
        (e.g. `job_done`: a reader never sees the final state without it).

        `reason` becomes the stop reason of a final state. Outcomes of a run (succeeded, failed,
        interrupted) need `worker`, the lease holder; a final state releases the lease, except a cancel
        of a run whose worker is alive (it records its running trial lost and lets go). A cancel of a
        run nobody is running (interrupted, or its lease expired) is settled in the same transaction:
        its running trial lost, `job_done`. Interrupted by its worker, the running trial's launch counts
        as an interruption (`Trial.interruptions`), not as a death.
        IllegalTransition names the current state; LeaseLost if `worker` does not hold it."""

    @abstractmethod
    def claim_job(self, worker: str, lease_s: float, *, job_id: int | None = None) -> JobRecord | None:
        """Gives `worker` the lease of a job for `lease_s` seconds and returns the job, RUNNING.

        Without `job_id`: the oldest claimable queue job — QUEUED, INTERRUPTED, or RUNNING/STOPPING
        with an expired lease (its worker died: a takeover, counted) — or None. Concurrent
        claimers never get the same job (PostgreSQL: FOR UPDATE SKIP LOCKED; SQLite: one writer).
        It first settles CANCELLED jobs whose worker's lease expired before it let go: their running
        trials become lost, and the lease is cleared (a `job_done` and a `lease` "expired" event).
        With `job_id`: that job, whatever its origin (`optico tune --resume`): LeaseHeld if another
        worker's lease is live; IllegalTransition if it is SUCCEEDED or CANCELLED."""

    @abstractmethod
    def settle_abandoned_cancels(self, job_id: int | None = None) -> int:
        """Settles the CANCELLED jobs (or job `job_id`) whose worker's lease expired before it let go,
        as `claim_job` does first; returns how many. For readers that must not wait for a claimer (an
        event stream, `optico jobs show`): a pool without workers settles too."""

    @abstractmethod
    def renew_lease(self, job_id: int, worker: str, lease_s: float) -> JobRecord:
        """Extends `worker`'s lease to now + `lease_s` and returns the job (whose status tells the
        worker about a stop or cancel request). LeaseLost if it no longer holds the lease."""

    @abstractmethod
    def release_lease(self, job_id: int, worker: str) -> None:
        """Gives the lease up (no-op if `worker` does not hold it)."""

    @abstractmethod
    def set_budget(self, job_id: int, *, max_trials: int | None = None, gpu_hours: float | None = None) -> JobRecord:
        """Changes the live budget of a job that has not finished (a `budget` event); ValueError for
        a non-positive value; IllegalTransition if the job is finished."""

    @abstractmethod
    def set_best_trial(self, job_id: int, trial_id: int, *, worker: str | None = None) -> None:
        """Points the job at its best trial; ValueError if the trial belongs to another job."""

    # -- trials ----------------------------------------------------------------------------
    @abstractmethod
    def start_trial(self, job_id: int, index: int, strategy: Strategy, rationale: str = "", *,
                    worker: str | None = None) -> Trial:
        """Claims trial `index` (1-based) of the job, RUNNING, and returns it. Idempotent: an
        existing trial with this index is returned unchanged, whatever its status. A job asked to stop,
        cancelled or ended starts no new trial: NoNewTrial (checked under the job row's lock)."""

    @abstractmethod
    def begin_attempt(self, trial_id: int, *, gpus: int = 0, worker: str | None = None) -> Trial:
        """Counts one more attempt of a RUNNING trial (a re-run after its worker died), launched now on
        `gpus` GPUs: if it ends without a result, that GPU time is counted in lost_gpu_seconds."""

    @abstractmethod
    def finish_trial(self, trial_id: int, *, status: TrialStatus, metrics: Metrics | None = None,
                     failure: Failure | None = None, gpu_seconds: float = 0.0,
                     fingerprint: dict[str, Any] | None = None, log_path: str | None = None,
                     log_excerpt: str = "", wall_seconds: float | None = None, worker: str | None = None) -> Trial:
        """Records the outcome (OK or FAILED); the same values again change nothing, not even the
        finish time. ValueError if `status` is RUNNING or LOST."""

    @abstractmethod
    def lose_trial(self, trial_id: int, reason: str, *, worker: str | None = None) -> Trial:
        """Marks a RUNNING trial LOST (its result will never be known) with the reason. No-op on a
        trial already finished or lost."""

    @abstractmethod
    def set_trial_failure(self, trial_id: int, failure: Failure, *, worker: str | None = None) -> Trial:
        """Attaches the failure analysis; ValueError if the trial succeeded."""

    @abstractmethod
    def get_trial(self, trial_id: int) -> Trial:
        """The trial; KeyError if unknown."""

    @abstractmethod
    def trials(self, job_id: int, *, after_index: int = 0) -> list[Trial]:
        """The job's trials with index > `after_index`, in index order; KeyError for an unknown job."""

    @abstractmethod
    def workload_trials(self, workload_key: str, exclude_job: int | None = None) -> list[Trial]:
        """Finished (OK or FAILED) trials of every job on the workload, except `exclude_job`'s,
        ordered by job then index: what a new job warm-starts from."""

    # -- the message pool and the event log ---------------------------------------------------
    @abstractmethod
    def add_message(self, job_id: int, iteration: int, agent: str, kind: str, content: dict[str, Any],
                    text: str = "", *, worker: str | None = None, event: JobEvent | None = None) -> int:
        """Stores an agent's message and returns its id; the same (job, iteration, agent, kind)
        replaces the earlier one and keeps its id. `event` (its announcement) is appended to the event
        log in the same transaction: both are stored or neither."""

    @abstractmethod
    def messages(self, job_id: int, iteration: int | None = None, *, after_id: int = 0) -> list[AgentMessage]:
        """The job's messages (of one iteration if given; id > `after_id`), by iteration then id."""

    @abstractmethod
    def add_event(self, job_id: int, event: JobEvent, *, worker: str | None = None) -> int:
        """Appends an event to the job's log and returns its `seq` (1, 2, ... per job)."""

    @abstractmethod
    def events(self, job_id: int, after: int = 0, limit: int | None = None) -> list[StoredEvent]:
        """The job's events with seq > `after`, oldest first."""

    @abstractmethod
    def last_event_seq(self, job_id: int) -> int:
        """The seq of the job's newest event (0 if none): where a live view starts following."""

    # -- API tokens ---------------------------------------------------------------------------
    @abstractmethod
    def create_token(self, name: str, scope: str) -> tuple[TokenRecord, str]:
        """Mints a token (scope 'read' or 'write'); returns its record and the token itself, which
        is never stored (only its hash) and cannot be shown again. ValueError for a taken name."""

    @abstractmethod
    def authenticate(self, token: str) -> TokenRecord | None:
        """The live (not revoked) token record for this token, or None."""

    @abstractmethod
    def tokens(self) -> list[TokenRecord]:
        """Every token record, revoked ones included, oldest first."""

    @abstractmethod
    def revoke_token(self, name: str) -> TokenRecord:
        """Revokes the token of this name (KeyError if none); revoking twice is harmless."""

    # -- retuning schedules (optico.retune) -----------------------------------------------------
    # A schedule fires at most once per cron slot whatever the number of replicas: `claim_tick`
    # moves `next_fire_at` forward with a conditional update, and the slot is unique per schedule
    # in the ticks table. The replica that claimed a tick holds the schedule's lock until it records
    # the tick; a dead replica's lock expires and its running tick is then marked failed.

    @abstractmethod
    def create_schedule(self, name: str, spec: JobSpec, *, cron: str, next_fire_at: datetime, max_trials: int,
                        always_retune: bool = False, webhook_url: str | None = None) -> ScheduleRecord:
        """Stores a schedule (its spec as a job's: secrets masked). The caller checks the cron and
        computes its first slot. ValueError for a taken name."""

    @abstractmethod
    def get_schedule(self, name: str) -> ScheduleRecord:
        """The schedule; KeyError if unknown."""

    @abstractmethod
    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""

    @abstractmethod
    def delete_schedule(self, name: str) -> None:
        """Removes the schedule with its ticks and events (its jobs stay); KeyError if unknown."""

    @abstractmethod
    def fire_now(self, name: str) -> ScheduleRecord:
        """Makes the schedule due now: the next poll of any replica's scheduler fires it. KeyError if unknown."""

    @abstractmethod
    def due_schedules(self, limit: int = 20) -> list[ScheduleRecord]:
        """Schedules whose slot has come (`next_fire_at` <= now) and that no live lock holds, oldest slot first."""

    @abstractmethod
    def claim_tick(self, name: str, worker: str, lock_s: float, *, due_at: datetime | None = None,
                   next_fire_at: datetime | None = None) -> TickRecord | None:
        """Starts a tick (RUNNING) and gives `worker` the schedule's lock for `lock_s` seconds.

        Cron firing (`due_at` = the slot the caller saw, `next_fire_at` = the slot after it): only if
        the schedule's slot is still `due_at` and no live lock holds it, else None (another replica
        fired it or is ticking). Manual (`due_at` None): TickBusy if a live lock holds it.
        KeyError for an unknown schedule."""

    @abstractmethod
    def recover_abandoned_ticks(self) -> list[str]:
        """Ticks whose replica died (the schedule's lock expired, the tick still running) are settled as a
        claim would settle them (failed, or `retuning` with the retune job they had started), and the lock
        is released. A schedule whose tick failed so is made due now as a manual run, once: the slot it
        lost (and a run-now request it had taken) fires again, unless the tick before was abandoned too
        (a tick that kills its replica would loop). Returns the names of the schedules made due."""

    @abstractmethod
    def renew_tick_lock(self, tick_id: int, worker: str, lock_s: float) -> None:
        """Extends `worker`'s lock on the tick's schedule to now + `lock_s` (a long re-measurement keeps
        it); TickLost if the tick is no longer `worker`'s running tick."""

    @abstractmethod
    def record_tick(self, tick_id: int, worker: str, status: str, verdict: TickVerdict | None = None, *,
                    incumbent: Incumbent | None = None, event: ScheduleEvent | None = None) -> TickRecord:
        """Ends `worker`'s part of a running tick: its status ('done', 'retuning', 'failed', 'skipped'),
        the verdict, optionally a new incumbent and an event, and releases the lock, in one transaction.
        TickLost if the tick is no longer `worker`'s running tick."""

    @abstractmethod
    def complete_retune(self, tick_id: int, *, new_best_mfu: float | None, report: dict[str, Any],
                        incumbent: Incumbent | None, event: ScheduleEvent) -> TickRecord | None:
        """Closes a 'retuning' tick whose job ended: the new best, `report` merged into the tick's, the
        new incumbent (None: keep it) and the event. None when it was closed already (safe to repeat)."""

    @abstractmethod
    def get_tick(self, tick_id: int) -> TickRecord:
        """The tick; KeyError if unknown."""

    @abstractmethod
    def ticks(self, schedule_id: int | None = None, *, status: str | None = None, limit: int = 50) -> list[TickRecord]:
        """Ticks of one schedule (or of all), newest first, optionally of one status."""

    @abstractmethod
    def schedule_with_history(self, name: str, limit: int = 50) -> tuple[ScheduleRecord, list[TickRecord]]:
        """The schedule and its `limit` newest ticks, consistent: a tick read as ended has its incumbent
        in the schedule read with it. KeyError if unknown."""

    @abstractmethod
    def add_schedule_event(self, schedule_id: int, event: ScheduleEvent) -> int:
        """Appends an event to the schedule's log and returns its `seq` (1, 2, ... per schedule)."""

    @abstractmethod
    def schedule_events(self, schedule_id: int, after: int = 0, limit: int | None = None) -> list[StoredScheduleEvent]:
        """The schedule's events with seq > `after`, oldest first."""

    # -- service figures --------------------------------------------------------------------
    @abstractmethod
    def service_stats(self) -> dict[str, Any]:
        """Aggregates for /metrics: jobs by status, trials by status, finished-trial wall time
        (count, sum, histogram buckets), LLM tokens and cost, lease takeovers."""

    @abstractmethod
    def close(self) -> None:
        """Releases connections. Calling it twice is harmless."""

    # -- conveniences built on the primitives above ---------------------------------------------
    def best_trial(self, job_id: int) -> Trial | None:
        """The job's successful trial with the highest MFU (the earliest on a tie)."""
        ok = [t for t in self.trials(job_id) if t.status is TrialStatus.OK and t.metrics is not None]
        return max(ok, key=lambda t: (t.mfu or 0.0, -t.index)) if ok else None

    def stop_job(self, job_id: int, who: str) -> JobRecord:
        """A graceful stop: the running trial finishes and no new one starts; a job still queued is
        cancelled (nothing runs to finish). Compare-and-set: a job claimed since it was read is stopped,
        not cancelled (its running trial would be killed). `who` goes into the stop reason."""
        try:
            return self.transition(job_id, JobStatus.CANCELLED, reason=f"stopped before it started ({who})",
                                   only_from=frozenset({JobStatus.QUEUED}))
        except LifecycleError:
            return self.transition(job_id, JobStatus.STOPPING, reason=f"stopped on request ({who})")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

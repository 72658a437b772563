"""The job lifecycle: states, the transitions allowed between them, and the errors of a refused one.

    queued ──claim──► running ──► succeeded | failed | cancelled | interrupted
       │                 │
       │              stopping (finish the running trial, start no new one) ──► succeeded | failed | cancelled | interrupted
       └──► cancelled
    interrupted | failed ──resume──► queued        (a worker then claims it and resumes from its checkpoint)
    interrupted ──claim──► running                 (`optico tune --resume`, or a worker for a queued-origin job)

`cancel` kills the running trial; `stop` lets it finish. A running job whose worker died keeps
its state, and its expired lease lets another worker take it over (see `Store.claim_job`).
Every transition is compare-and-set in the store: the row changes only if it is still in one
of the allowed source states, so a cancel is never overwritten by the next iteration.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum


class JobStatus(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"  # finish the running trial, then succeed
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # no trial succeeded, or the run broke (a bug, a dead database); only a broken run resumes
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # its worker stopped (Ctrl-C, shutdown); resumable from the checkpoint

    @property
    def final(self) -> bool:
        """No worker will run it again without a resume."""
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.INTERRUPTED)

    @property
    def finished(self) -> bool:
        """Done for good: nothing resumes it."""
        return self in (JobStatus.SUCCEEDED, JobStatus.CANCELLED)

    @property
    def active(self) -> bool:
        """A worker runs it (or ran it and may have died: see the lease)."""
        return self in (JobStatus.RUNNING, JobStatus.STOPPING)


S = JobStatus
# to-state -> the states it may be entered from. The one table every transition consults.
ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    S.QUEUED: frozenset({S.INTERRUPTED, S.FAILED}),  # resume
    S.RUNNING: frozenset({S.QUEUED, S.INTERRUPTED, S.FAILED}),  # claim
    S.STOPPING: frozenset({S.RUNNING}),
    S.SUCCEEDED: frozenset({S.RUNNING, S.STOPPING}),
    S.FAILED: frozenset({S.RUNNING, S.STOPPING}),
    S.CANCELLED: frozenset({S.QUEUED, S.RUNNING, S.STOPPING, S.INTERRUPTED, S.FAILED}),
    S.INTERRUPTED: frozenset({S.RUNNING, S.STOPPING}),
}
# Transitions only the lease holder may make: the outcome of a run.
WORKER_ONLY: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.INTERRUPTED})


class LifecycleError(RuntimeError):
    """A lifecycle operation was refused; the message says why in one line."""


class IllegalTransition(LifecycleError):
    def __init__(self, job_id: int, current: JobStatus, wanted: JobStatus):
        self.job_id, self.current, self.wanted = job_id, current, wanted
        super().__init__(f"job {job_id} is {current.value}; it cannot become {wanted.value}")


class NothingToResume(LifecycleError):
    """A failed job whose loop ran to its end (stopped with no trial succeeded, nothing fits, every
    launch failed): resuming it would run nothing. Only a run that broke is resumed."""

    def __init__(self, job_id: int, reason: str | None):
        self.job_id = job_id
        super().__init__(f"job {job_id} failed at the end of its loop ({reason or 'no reason recorded'}): nothing is "
                         f"left to resume; submit it again (a larger budget, a wider search space)")


class LeaseHeld(LifecycleError):
    """Another live worker holds the job."""

    def __init__(self, job_id: int, worker: str, until: datetime):
        self.job_id, self.worker, self.until = job_id, worker, until
        super().__init__(f"job {job_id} is held by worker {worker} until {until:%Y-%m-%d %H:%M:%S} UTC")


class LeaseLost(LifecycleError):
    """The caller no longer holds the job's lease (it expired and another worker took over)."""

    def __init__(self, job_id: int, worker: str, holder: str | None):
        self.job_id, self.worker, self.holder = job_id, worker, holder
        now = f"worker {holder} holds it" if holder else "nobody holds it"
        super().__init__(f"worker {worker} lost the lease of job {job_id}; {now}")


class NoNewTrial(LifecycleError):
    """The job was asked to stop, cancelled or has ended: it starts no new trial (a stop that lands
    between two trials must not launch another run)."""

    def __init__(self, job_id: int, status: JobStatus):
        self.job_id, self.status = job_id, status
        super().__init__(f"job {job_id} is {status.value}; it starts no new trial")


def check_transition(job_id: int, current: JobStatus, wanted: JobStatus) -> None:
    """Raises IllegalTransition unless `current -> wanted` is in the table."""
    if current not in ALLOWED[wanted]:
        raise IllegalTransition(job_id, current, wanted)

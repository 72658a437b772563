"""Job workers: threads that claim queued jobs from the pool and run them under a lease.

Each worker is a thread with its own event loop, running one job at a time: claim (the oldest
queued or interrupted queue job, or one whose worker died), run it with the heartbeat renewing
the lease, repeat. `stop()` interrupts the running jobs (their running trial is killed and
re-run once by whichever worker resumes them) and waits for the threads.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from optico.pool.contract import Store, StoreError
from optico.pool.lifecycle import LifecycleError
from optico.runner import LeasePolicy, new_worker_id, run_claimed_job

log = logging.getLogger("optico.worker")


class Worker(threading.Thread):
    """One worker thread; see the module docstring."""

    def __init__(self, store: Store, database_url: str, *, policy: LeasePolicy, poll_s: float = 1.0,
                 worker_id: str | None = None):
        self.worker_id = worker_id or new_worker_id()
        super().__init__(name=f"optico-{self.worker_id}", daemon=True)
        self.store, self.database_url, self.policy, self.poll_s = store, database_url, policy, poll_s
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self.current_job: int | None = None

    def stop(self) -> None:
        """Asks the worker to interrupt its job and end; returns at once (join to wait)."""
        self._stopping.set()
        if self._loop is not None and self._shutdown is not None:
            self._loop.call_soon_threadsafe(self._shutdown.set)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._shutdown = asyncio.Event()
        if self._stopping.is_set():
            return
        while not self._stopping.is_set():
            try:
                job = self.store.claim_job(self.worker_id, self.policy.lease_s)
            except (StoreError, LifecycleError) as exc:
                log.warning("worker %s: claim failed: %s", self.worker_id, exc)
                job = None
            except Exception:  # noqa: BLE001 - anything else ended the thread, and the worker idled for good
                log.exception("worker %s: claim failed", self.worker_id)
                job = None
            if job is None:
                try:
                    await asyncio.wait_for(self._shutdown.wait(), timeout=self.poll_s)
                except asyncio.TimeoutError:
                    pass
                continue
            self.current_job = job.id
            log.info("worker %s: running job %d", self.worker_id, job.id)
            try:
                final = await run_claimed_job(self.store, self.database_url, job.id, worker=self.worker_id,
                                              policy=self.policy, shutdown=self._shutdown)
                log.info("worker %s: job %d is %s", self.worker_id, job.id, final.status.value)
            except Exception:  # noqa: BLE001 - a worker must survive one job's failure to start
                log.exception("worker %s: job %d could not run", self.worker_id, job.id)
            finally:
                self.current_job = None


class WorkerPool:
    """N workers over one store."""

    def __init__(self, store: Store, database_url: str, count: int, *, policy: LeasePolicy, poll_s: float = 1.0):
        self.workers = [Worker(store, database_url, policy=policy, poll_s=poll_s) for _ in range(count)]

    def start(self) -> None:
        for worker in self.workers:
            worker.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        for worker in self.workers:
            worker.stop()
        for worker in self.workers:
            worker.join(timeout=timeout_s)

"""The scheduler thread of `optico serve`: fires due retuning schedules (OPTICO_SCHEDULER).

Every replica may run one: each poll calls `optico.retune.fire.fire_due`, where a database lock lets
exactly one replica fire each cron slot. A tick's retune job is an ordinary queued job, run by the
workers (this replica's or another's); a later poll closes the tick once that job has ended.
"""

from __future__ import annotations

import logging
import threading

from optico.pool.contract import Store
from optico.retune.fire import fire_due
from optico.runner import new_worker_id

log = logging.getLogger("optico.scheduler")


class Scheduler(threading.Thread):
    """Polls every `poll_s` seconds; `lock_s` is the schedule lock a tick holds (renewed while it works)."""

    def __init__(self, store: Store, *, poll_s: float, lock_s: float, worker_id: str | None = None):
        self.worker_id = worker_id or new_worker_id("scheduler")
        super().__init__(name=f"optico-{self.worker_id}", daemon=True)
        self.store, self.poll_s, self.lock_s = store, poll_s, lock_s
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                for tick in fire_due(self.store, worker=self.worker_id, lock_s=self.lock_s):
                    log.info("schedule tick %d: %s (%s)", tick.id, tick.outcome or tick.status, tick.status)
            except Exception:  # noqa: BLE001 - a bad poll (database away) must not end the thread
                log.exception("scheduler %s: poll failed", self.worker_id)
            self._stopping.wait(self.poll_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops polling; a tick in progress finishes first (up to `timeout_s`, then it is abandoned
        and its lock expires for another replica)."""
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=timeout_s)

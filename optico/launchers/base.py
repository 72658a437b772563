"""The launcher seam: what runs a strategy and reports what happened.

A launcher executes; it never decides what to try (that is the agents' job) and
never writes to the pool (the loop records). One protocol for every kind: sim,
replay, local (torchrun), ray.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from optico.strategy import Strategy
from optico.trial import LaunchResult
from optico.workload import Workload

# Called with progress lines while a run is under way (log lines, heartbeats).
ProgressCallback = Callable[[str], None]


class Launcher(ABC):
    """Runs one strategy of one workload and returns its metrics or its error log.

    Contract:
    - `launch` is a coroutine; cancelling it must stop the run and release every
      process, actor and placement group it started before the CancelledError propagates.
    - A run that fails returns `LaunchResult(ok=False, log=...)` with the log tail that
      failure analysis needs; `launch` raises only for errors of the launcher itself
      (bad configuration), never for a failed training run.
    - `trial_key` is unique per (job, trial index) and stable across a resumed job: a
      launcher may use it to name run directories, or to make seeded noise repeatable.
    - `candidates()` returns the finite set of strategies this launcher can run (a replay
      table), or None when it can run anything valid.
    """

    kind: str = "abstract"

    @abstractmethod
    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        """Runs `strategy` on `workload`; returns what happened."""

    def candidates(self, workload: Workload) -> list[Strategy] | None:
        """Strategies this launcher can measure for `workload`; None = any valid one."""
        return None

    def describe(self) -> dict[str, Any]:
        """Settings worth recording with each trial."""
        return {"kind": self.kind}

    async def aclose(self) -> None:
        """Releases anything held between runs (a Ray connection)."""

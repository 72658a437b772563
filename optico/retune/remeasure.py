"""Re-measuring the incumbent after an upgrade: repeated runs, the warm-up dropped, a noise band.

One run says little: a cold cache, a busy neighbour or a slow first launch move it by percents. So
the incumbent runs `warmup + repeats` times through the schedule's own launcher; the first good run
is dropped (compilation caches, file system warm-up), the rest give the mean and, from their spread,
the band inside which a change is noise. A run that dies of something transient (a hang, a node
fault) is run again, within a bound; an incumbent that no longer runs at all (out of memory on the
new version) is reported as broken.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from optico.launchers.base import Launcher
from optico.strategy import Strategy
from optico.trial import FailureCategory
from optico.workload import Workload

REPEATS = 3  # timed runs kept; the issue asks for at least 3
WARMUP = 1  # runs dropped first
MAX_LAUNCHES = 2 * (REPEATS + WARMUP)  # transient failures are re-run, within this bound
NOISE_SIGMAS = 3.0  # the band: this many standard deviations of the kept runs...
MIN_NOISE_PCT = 1.0  # ...and never narrower than this (three runs underestimate the spread)
_TRANSIENT = (FailureCategory.HANG, FailureCategory.INFRASTRUCTURE, FailureCategory.COMM_TIMEOUT)


@dataclass(frozen=True)
class Remeasurement:
    """The incumbent's runs under the framework as it is now."""

    mfus: list[float]  # the kept runs
    warmup_mfus: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # the first line of each failed run
    launches: int = 0

    @property
    def broken(self) -> bool:
        """Too few good runs to say anything but "it no longer runs"."""
        return len(self.mfus) < 2

    @property
    def mean_mfu(self) -> float | None:
        return statistics.fmean(self.mfus) if self.mfus else None

    @property
    def noise_pct(self) -> float | None:
        """Half-width of the noise band, in percent of the mean (None when broken)."""
        if self.broken:
            return None
        spread = statistics.stdev(self.mfus) / statistics.fmean(self.mfus) * 100
        return max(MIN_NOISE_PCT, NOISE_SIGMAS * spread)

    def as_report(self) -> dict:
        return {"mfus": self.mfus, "warmup_mfus": self.warmup_mfus, "failures": self.failures,
                "launches": self.launches, "mean_mfu": self.mean_mfu, "noise_pct": self.noise_pct}


async def remeasure(launcher: Launcher, workload: Workload, strategy: Strategy, *, key: str,
                    repeats: int = REPEATS, warmup: int = WARMUP) -> Remeasurement:
    """Runs `strategy` until `repeats` good runs follow `warmup` dropped ones, or a non-transient
    failure says it no longer runs, or MAX_LAUNCHES are spent. `key` names the runs (their trial keys
    are `<key>-run<N>`: the simulator's noise, a launcher's run directories)."""
    kept: list[float] = []
    dropped: list[float] = []
    failures: list[str] = []
    launches = 0
    while len(kept) < repeats and launches < max(MAX_LAUNCHES, repeats + warmup):
        launches += 1
        result = await launcher.launch(workload, strategy, trial_key=f"{key}-run{launches}")
        if result.ok and result.metrics is not None:
            (dropped if len(dropped) < warmup else kept).append(result.metrics.mfu)
            continue
        failures.append(_first_line(result.log))
        if result.category_hint not in _TRANSIENT and not _looks_transient(result.log):
            break  # it fails for a reason of its own: more runs will not change that
    return Remeasurement(mfus=kept, warmup_mfus=dropped, failures=failures, launches=launches)


def _looks_transient(log: str) -> bool:
    """A failure that says nothing about the configuration (the launcher gave no category)."""
    text = log.lower()
    return any(mark in text for mark in ("watchdog", "timed out", "timeout", "hang", "fallen off the bus",
                                         "nccl error", "node fault"))


def _first_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    interesting = [line for line in lines if "Error" in line or "error" in line]
    return (interesting or lines or ["(no log)"])[-1][:300]

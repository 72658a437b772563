"""One validation run: its metrics or its failure, its cost and where it ran."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from optico.strategy import Strategy


class TrialStatus(str, Enum):
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    LOST = "lost"  # its worker died twice while running it, or the job was cancelled: the result is unknown


class FailureCategory(str, Enum):
    OOM = "oom"
    INVALID_CONFIG = "invalid_config"
    COMM_TIMEOUT = "comm_timeout"
    HANG = "hang"
    INFRASTRUCTURE = "infrastructure"
    NOT_MEASURED = "not_measured"
    UNKNOWN = "unknown"


class Metrics(BaseModel):
    """What a successful run measured. Memory in GiB; utilisation and MFU as fractions."""

    model_config = ConfigDict(frozen=True)

    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    tokens_per_s_per_gpu: float
    mem_avg_gib: float | None = None
    mem_max_gib: float | None = None
    mem_limit_gib: float | None = None
    gpu_util_avg: float | None = None
    gpu_util_max: float | None = None

    @property
    def mem_fraction(self) -> float | None:
        if self.mem_max_gib is None or not self.mem_limit_gib:
            return None
        return self.mem_max_gib / self.mem_limit_gib


class Failure(BaseModel):
    """A failed run as the failure-analysis agent diagnosed it."""

    model_config = ConfigDict(frozen=True)

    category: FailureCategory
    summary: str = Field(description="The paper's form: '<PARAMS> <VALUES> caused <ERROR> (Confidence: X)'.")
    params: list[str] = Field(default_factory=list, description="Strategy fields most likely responsible.")
    confidence: int = Field(ge=0, le=100)
    retry: bool = Field(False, description="Re-run unchanged: infrastructure faults only.")
    log_excerpt: str = ""

    def described(self) -> str:
        """The summary as shown, with its confidence once: the paper's forms end with it, a run lost
        to a dead worker or an undiagnosed one does not."""
        if "(confidence:" in self.summary.lower():
            return self.summary
        return f"{self.summary} (Confidence: {self.confidence})"


class LaunchResult(BaseModel):
    """What a launcher returns: metrics on success, else the error log."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    metrics: Metrics | None = None
    log: str = Field("", description="Log tail (the error on failure).")
    exit_code: int | None = None
    duration_s: float = 0.0
    gpu_seconds: float = 0.0
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    log_path: str | None = None
    category_hint: FailureCategory | None = Field(
        None, description="Set when the launcher knows the category for certain (a timeout it enforced, "
                          "a configuration a replay table never measured).")


class Trial(BaseModel):
    """A trial as the pool hands it out (frozen)."""

    model_config = ConfigDict(frozen=True)

    id: int
    job_id: int
    index: int = Field(description="1-based position in its job.")
    strategy: Strategy
    signature: str
    status: TrialStatus
    metrics: Metrics | None = None
    failure: Failure | None = None
    rationale: str = ""
    gpu_seconds: float = Field(0.0, description="GPU-seconds its launches spent: the one with the result, and "
                                                "lost_gpu_seconds.")
    lost_gpu_seconds: float = Field(0.0, description="GPU-seconds of its launches that ended without a result "
                                                     "(its worker died or stopped, the job was cancelled), up "
                                                     "to the worker's last heartbeat.")
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    log_path: str | None = None
    log_excerpt: str = ""
    attempts: int = Field(1, description="How many times it was launched (a re-run after its worker died "
                                         "counts; the pool keeps one result).")
    interruptions: int = Field(0, description="How many of those launches its own worker interrupted cleanly "
                                              "(a shutdown, a rolling restart, Ctrl-C) before re-running it.")
    wall_seconds: float | None = Field(None, description="Wall-clock seconds of the run that produced the result.")

    @property
    def mfu(self) -> float | None:
        return self.metrics.mfu if self.metrics else None

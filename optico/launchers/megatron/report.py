"""What the benchmark prints: the result and error lines, error categories, step-time
statistics and GPU utilisation sampling. Imports neither megatron nor CUDA-only modules."""

from __future__ import annotations

import json
import math
import statistics
import sys
import threading
import time
import traceback
from typing import Any

RESULT_PREFIX = "OPTICO_RESULT "
ERROR_PREFIX = "OPTICO_ERROR "
STEP_PREFIX = "OPTICO_STEP "

CATEGORIES = ("oom", "invalid_config", "comm", "unknown")


def emit(prefix: str, payload: dict[str, Any]) -> None:
    """One line, flushed: `PREFIX {json}`. Non-finite floats become null (strict JSON).

    The line and its newline go out in one write: ranks share torchrun's stdout, and print()'s
    separate newline let two ranks' error lines run together."""
    line = prefix + json.dumps(_finite(payload), separators=(",", ":"), sort_keys=False)
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


_PREFIXES = (("result", RESULT_PREFIX), ("error", ERROR_PREFIX), ("step", STEP_PREFIX))
_DECODER = json.JSONDecoder()


def parse_records(line: str) -> list[tuple[str, dict[str, Any]]]:
    """Every ('result'|'error'|'step', payload) record in one line of output, in order. Records
    of several ranks can share a line (their writes interleave); one cut short is dropped."""
    found = []
    for kind, prefix in _PREFIXES:
        start = line.find(prefix)
        while start >= 0:
            try:
                payload, _ = _DECODER.raw_decode(line, start + len(prefix))
                if isinstance(payload, dict):
                    found.append((start, kind, payload))
            except json.JSONDecodeError:
                pass
            start = line.find(prefix, start + len(prefix))
    return [(kind, payload) for _, kind, payload in sorted(found, key=lambda f: f[0])]


def parse_output(text: str) -> dict[str, Any]:
    """The first result line and every error line found in a run's combined output."""
    out: dict[str, Any] = {"result": None, "errors": [], "steps": []}
    for kind, payload in (record for line in text.splitlines() for record in parse_records(line)):
        if kind == "result" and out["result"] is None:
            out["result"] = payload
        elif kind == "error":
            out["errors"].append(payload)
        elif kind == "step":
            out["steps"].append(payload)
    return out


def primary_error(errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The root cause among the error lines of a run: when one rank fails, its peers often
    fail next in a collective (comm), so the first non-comm error wins, else the first."""
    for e in errors:
        if e.get("category") != "comm":
            return e
    return errors[0] if errors else None


# ---------------------------------------------------------------------------------------
# errors

_OOM_MARKERS = ("out of memory", "cuda error: out of memory", "cudaerrormemoryallocation",
                "failed to allocate", "cublas_status_alloc_failed")
_COMM_MARKERS = ("nccl", "gloo", "connection reset", "connection refused", "broken pipe",
                 "watchdog", "timed out", "socket timeout", "process group", "c10d")
_COMM_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "DistError")
# megatron-core also states some configuration checks as RuntimeError (the interleaved
# schedule's micro-batch grouping, for one).
_CONFIG_MARKERS = ("divisible", "must be", "should be", "should range", "not supported", "unsupported",
                   "is not compatible", "incompatible")


def categorize(exc: BaseException) -> str:
    """oom | invalid_config | comm | unknown, from the exception's type and text."""
    text = f"{type(exc).__name__}: {exc}".lower()
    names = {t.__name__ for t in type(exc).__mro__}
    if "OutOfMemoryError" in names or any(m in text for m in _OOM_MARKERS):
        return "oom"
    if names & set(_COMM_TYPES):
        return "comm"
    if isinstance(exc, (AssertionError, ValueError, NotImplementedError)) or "BenchConfigError" in names \
            or "ValidationError" in names or "InvalidStrategy" in names:
        return "invalid_config"
    if isinstance(exc, RuntimeError) and any(m in text for m in _COMM_MARKERS):
        return "comm"
    if isinstance(exc, RuntimeError) and any(m in text for m in _CONFIG_MARKERS):
        return "invalid_config"
    return "unknown"


def error_payload(exc: BaseException, *, rank: int, phase: str, params: list[str] | None = None,
                  tail_lines: int = 25) -> dict[str, Any]:
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(tb).rstrip().splitlines()[-tail_lines:]
    message = str(exc).strip() or type(exc).__name__
    return {
        "category": categorize(exc),
        "message": message[:4000],
        "exception_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "rank": rank,
        "phase": phase,
        "params": params or [],
        "traceback_tail": "\n".join(tail),
    }


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# statistics


def cv(values: list[float]) -> float | None:
    """Coefficient of variation (population std / mean); None for fewer than two values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else None


class Stopper:
    """Decides when timing may stop: after `min_steps` timed steps once the CV of the last
    `window` step times is under `cv_target`, or at `max_steps`, or past `max_time_s`."""

    def __init__(self, *, min_steps: int, max_steps: int, cv_target: float, window: int,
                 max_time_s: float | None = None):
        self.min_steps, self.max_steps, self.cv_target = min_steps, max_steps, cv_target
        self.window, self.max_time_s = window, max_time_s
        self.times: list[float] = []
        self.reason = ""

    def add(self, step_time: float) -> bool:
        """Records one timed step; True when timing should stop."""
        self.times.append(step_time)
        n = len(self.times)
        c = self.current_cv()
        if n >= max(self.min_steps, min(self.window, self.max_steps)) and c is not None and c <= self.cv_target:
            self.reason = "stable"
            return True
        if n >= self.max_steps:
            self.reason = "max_steps"
            return True
        if self.max_time_s is not None and sum(self.times) >= self.max_time_s and n >= 1:
            self.reason = "max_time"
            return True
        return False

    def window_times(self) -> list[float]:
        return self.times[-self.window:]

    def current_cv(self) -> float | None:
        return cv(self.window_times())


# ---------------------------------------------------------------------------------------
# GPU utilisation


class UtilSampler:
    """Samples this rank's GPU utilisation through NVML in a thread; inert without NVML."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._handle = None
        self._nvml = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self, device_index: int) -> bool:
        try:
            import pynvml  # provided by nvidia-ml-py
            import torch

            pynvml.nvmlInit()
            handle = None
            try:  # NVML numbers devices ignoring CUDA_VISIBLE_DEVICES: match by UUID
                uuid = str(torch.cuda.get_device_properties(device_index).uuid)
                uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:
                handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self._nvml, self._handle = pynvml, handle
            return True
        except Exception:
            return False

    def start(self) -> None:
        if self._handle is None:
            return
        self._thread = threading.Thread(target=self._run, name="optico-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu) / 100.0)
            except Exception:
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> tuple[float | None, float | None]:
        """(average, max) utilisation as fractions, or (None, None) without samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if not self.samples:
            return None, None
        return statistics.fmean(self.samples), max(self.samples)


def now() -> float:
    return time.perf_counter()

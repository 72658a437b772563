"""The first recognised error of a training log: its category, a short name and the line.

Shared by the launchers (which put the root-cause line first when a run fails) and the
failure-analysis agent (which diagnoses it), so both read a log the same way — and neither
imports the other.
"""

from __future__ import annotations

import re

from optico.redact import clip
from optico.trial import FailureCategory

_PATTERNS: list[tuple[FailureCategory, re.Pattern[str], str]] = [
    (FailureCategory.OOM, re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED", re.I),
     "CUDA OutOfMemoryError"),
    (FailureCategory.INFRASTRUCTURE, re.compile(
        r"NodeDiedError|ActorDiedError|RayActorError|node .* (died|was lost)|ECC error|Xid \d+|"
        r"Connection reset by peer|No space left on device|unhandled system error|GPU is lost|"
        r"cudaErrorDevicesUnavailable|placement group .* (removed|failed)", re.I), "infrastructure fault"),
    (FailureCategory.COMM_TIMEOUT, re.compile(
        r"Watchdog caught collective operation timeout|NCCL.*time(d)? ?out|DistBackendError.*timeout|"
        r"collective operation timeout", re.I), "NCCL collective timeout"),
    (FailureCategory.INVALID_CONFIG, re.compile(
        r"AssertionError|must be divisible|should be divisible|must be a multiple|is not divisible|"
        r"ValueError:.*(parallel|divisible|must)|not supported with|needs Transformer Engine", re.I),
     "invalid configuration"),
]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def first_error(log: str) -> tuple[FailureCategory | None, str, str]:
    """(category, short error name, the matching line) of the first recognised error."""
    for line in _ANSI.sub("", log).splitlines():
        for category, pattern, name in _PATTERNS:
            if pattern.search(line):
                return category, name, clip(line.strip(), 300)  # redacted, then cut
    return None, "", ""

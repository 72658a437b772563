"""Crash injection for durability tests: `OPTICO_FAULT_KILL_AT=<point>[:<n>]` SIGKILLs this process
the n-th time (default 1) it passes the named point.

The durability tests start a real `optico serve` with this variable, let it die at a precise
place of an iteration, restart it, and check that every job still ends with its exact trial count.
Without the variable `point` is one dictionary lookup. The points:

    analysis           inside the analysis agent's step, before it answers
    trial              while a trial runs (the launcher was started)
    after_trial        the trial's result is stored, its graph step not yet checkpointed
    before_checkpoint  an agent's message is stored, its graph step not yet checkpointed
    lease_renewal      inside the lease renewal's transaction, before it commits
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "OPTICO_FAULT_KILL_AT"
POINTS = frozenset({"analysis", "trial", "after_trial", "before_checkpoint", "lease_renewal"})

_counts: dict[str, int] = {}
_lock = threading.Lock()


def _target() -> tuple[str, int] | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    name, _, nth = raw.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}: unknown point {name!r}; known: {', '.join(sorted(POINTS))}")
    return name, int(nth or 1)


def point(name: str) -> None:
    """SIGKILLs this process if `name` is the configured point and this is its n-th pass."""
    target = _target()
    if target is None or target[0] != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        hit = _counts[name] == target[1]
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)

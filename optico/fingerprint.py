"""A trial's framework fingerprint: the software versions that decide what a measurement means.

A launcher's fingerprint says where and how a run happened (host, run directory, seed, ...); only
part of it is the *framework*: megatron-core, torch, CUDA, NCCL, Transformer Engine, the container
image, and for the simulator its `framework_version`. Two measurements are comparable only under
the same framework. After an upgrade, what the pool learned under the old one is a hint, not a
fact: a configuration that ran out of memory then may fit now (the guard), and the incumbent must
be re-measured (nightly retuning, `optico.retune`).

Both users read the framework through `framework_of`, so a launcher that adds a host name or a
run directory to its fingerprint never makes two runs look like different frameworks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from optico.trial import Trial

FRAMEWORK_KEYS: tuple[str, ...] = (
    "framework_version",  # the simulator's stand-in for a release of the whole stack
    "megatron_core", "torch", "cuda", "nccl", "transformer_engine", "image",
    "replay_data",  # a replay table's digest: another table is another "cluster"
)


def framework_of(fingerprint: Mapping[str, Any] | None) -> dict[str, str]:
    """The framework part of a launcher's fingerprint: the known keys with a value, as text.

    Empty when nothing is known (an old trial, a launcher that reports no versions): an unknown
    framework is never "another" framework."""
    if not fingerprint:
        return {}
    return {k: str(fingerprint[k]) for k in FRAMEWORK_KEYS if fingerprint.get(k) not in (None, "")}


def describe(framework: Mapping[str, str]) -> str:
    """One line for people: 'megatron_core 0.16.1, torch 2.13.0'."""
    return ", ".join(f"{k} {v}" for k, v in framework.items()) or "an unknown framework"


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, list[str | None]]:
    """What differs between two frameworks: {key: [before, after]} (None where a side lacks it)."""
    keys = [k for k in FRAMEWORK_KEYS if k in before or k in after]
    return {k: [before.get(k), after.get(k)] for k in keys if before.get(k) != after.get(k)}


def current_framework(history: Iterable[Trial]) -> dict[str, str]:
    """The framework this job runs under: that of its latest trial that reported one ({} if none)."""
    found: dict[str, str] = {}
    for trial in history:
        framework = framework_of(trial.fingerprint)
        if framework:
            found = framework
    return found


def split_by_framework(history: Iterable[Trial], prior: Iterable[Trial]) -> tuple[list[Trial], list[Trial]]:
    """(earlier jobs' trials measured under this job's framework or an unknown one, those measured
    under another). Before this job has measured anything its framework is unknown, and every
    earlier trial counts as before."""
    current = current_framework(history)
    same: list[Trial] = []
    other: list[Trial] = []
    for trial in prior:
        framework = framework_of(trial.fingerprint)
        (other if current and framework and framework != current else same).append(trial)
    return same, other

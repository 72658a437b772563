"""Coupled knobs repaired the way an engineer would, from the couplings the knob registry declares.

A change names only what it changes; the rest stays. Flags the new values make invalid are
reset (sequence parallel off when TP becomes 1, param-gather overlap off without the
distributed optimizer, VPP dropped when PP becomes 1), and a PP that stops dividing the layers
gets the uneven split Megatron needs, so a good idea is not lost to a flag. Used by the offline
generation agent and by the reading of LLM answers alike.
"""

from __future__ import annotations

from typing import Any

from optico.knobs import KNOBS
from optico.parallel import ParallelDims
from optico.search_space import SearchSpace
from optico.strategy import Strategy
from optico.workload import Workload


def repair(s: Strategy, space: SearchSpace, workload: Workload | None = None) -> Strategy:
    """Resets knobs whose couplings (`Knob.requires` in optico.knobs) the new values break — SP off at
    TP 1, param-gather overlap off without the distributed optimizer, VPP dropped at PP 1 — unless
    the space fixes them; with `workload`, a PP that does not divide the layers gets the uneven
    split Megatron needs (the embedding/loss counted, or uneven first/last stages) when the space
    lets those knobs move."""
    for _ in range(len(KNOBS)):  # each pass resets at least one knob, or stops
        fixes: dict[str, Any] = {}
        for k in KNOBS:
            if k.name in space.fixed or not k.requires or not k.active(s):
                continue
            # Couplings that read the workload are checked only when it is given.
            if any(not _holds(req, s, workload) for req in k.requires):
                fixes[k.name] = k.default
        if not fixes:
            break
        s = s.changed(**fixes)
    if workload is not None:
        s = _uneven_split(s, space, workload)
    return s


def _holds(req, s: Strategy, workload: Workload | None) -> bool:
    try:
        return req.holds(s, workload)
    except AttributeError:  # a coupling on the workload, and none given
        return True


def _uneven_split(s: Strategy, space: SearchSpace, w: Workload) -> Strategy:
    """The split Megatron needs for a PP that does not divide the layers (`ParallelDims.infer_split`),
    when the space lets those knobs move."""
    dims = ParallelDims.of(s, w.world_size)
    if not dims.split_errors(w.model.num_layers):
        return s
    split = dims.infer_split(w.model.num_layers, allowed=set(space.tunables))
    if not split or any(v not in space.tunables[k] for k, v in split.items()):
        return s
    try:
        fixed = s.changed(**split)
    except ValueError:
        return s
    return fixed if not ParallelDims.of(fixed, w.world_size).split_errors(w.model.num_layers) else s


def apply_changes(reference: Strategy, changes: dict[str, Any], space: SearchSpace,
                  workload: Workload | None = None) -> Strategy:
    """The reference with `changes` applied and coupled flags repaired."""
    return repair(reference.changed(**changes), space, workload)

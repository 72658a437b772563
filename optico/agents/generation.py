"""Strategy generation, offline: turn ranked suggestions into complete configurations.

A suggestion names only what changes; the rest of the configuration comes from the
reference. Coupled flags are repaired the way an engineer would, from the couplings the
knob registry declares (sequence parallel off when TP becomes 1, param-gather overlap off
without the distributed optimizer, VPP dropped when PP becomes 1, the uneven split Megatron
needs when PP stops dividing the layers) so a good idea is not lost to a flag.
"""

from __future__ import annotations

from typing import Any

from optico.agents.contracts import GenerationInput, GenerationOutput, Proposal
from optico.knobs import KNOBS
from optico.parallel import ParallelDims
from optico.search_space import SearchSpace
from optico.strategy import Strategy
from optico.workload import Workload


def repair(s: Strategy, space: SearchSpace, workload: Workload | None = None) -> Strategy:
    """Resets knobs whose couplings (`Knob.requires` in optico.knobs) the new values break — SP off at
    TP 1, param-gather overlap off without the distributed optimizer, VPP dropped at PP 1 — unless
    the space fixes them; with `workload`, a PP that does not divide the layers gets the uneven
    first/last split Megatron needs when the space lets those knobs move."""
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
    first, last = "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"
    dims = ParallelDims.of(s, w.world_size)
    if not dims.split_errors(w.model.num_layers) or first in space.fixed or last in space.fixed:
        return s
    a, b = dims.infer_uneven(w.model.num_layers)
    if a is None:
        return s
    try:
        return s.changed(**{first: a, last: b})
    except ValueError:
        return s


def apply_changes(reference: Strategy, changes: dict[str, Any], space: SearchSpace,
                  workload: Workload | None = None) -> Strategy:
    """The reference with `changes` applied and coupled flags repaired."""
    return repair(reference.changed(**changes), space, workload)


class RulesGeneration:
    """The offline strategy-generation reasoner: one proposal per suggestion, in rank order."""

    name = "rules"

    def generate(self, inp: GenerationInput) -> GenerationOutput:
        proposals: list[Proposal] = []
        seen: set[str] = set()
        for rank, sug in enumerate(inp.analysis.suggestions, start=1):
            try:
                strategy = apply_changes(inp.reference, {c.param: c.new for c in sug.changes}, inp.search_space,
                                         inp.workload)
            except ValueError:
                continue  # a value the Strategy model refuses; the guard would too
            sig = strategy.signature()
            if sig in seen:
                continue
            seen.add(sig)
            confidence = 80 if sug.kind == "standard" else 60
            proposals.append(Proposal(strategy=strategy, rationale=f"{sug.text} {sug.reason}.",
                                      expected_impact=sug.expected_effect, confidence=max(10, confidence - rank)))
            if len(proposals) >= inp.max_proposals:
                break
        return GenerationOutput(proposals=proposals, reasoner=self.name)

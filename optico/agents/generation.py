"""Strategy generation, offline: turn ranked suggestions into complete configurations.

A suggestion names only what changes; the rest of the configuration comes from the
reference. Coupled flags are repaired the way an engineer would (sequence
parallel off when TP becomes 1, param-gather overlap off without the distributed
optimizer, VPP dropped when PP becomes 1) so a good idea is not lost to a flag.
"""

from __future__ import annotations

from typing import Any

from optico.agents.contracts import GenerationInput, GenerationOutput, Proposal
from optico.search_space import SearchSpace
from optico.strategy import Strategy


def repair(s: Strategy, space: SearchSpace) -> Strategy:
    """Switches off flags that the new parallel sizes make invalid, when the space allows."""
    fixes: dict[str, Any] = {}
    if s.tp == 1 and s.sequence_parallel:
        fixes["sequence_parallel"] = False
    if not (fixes.get("sequence_parallel", s.sequence_parallel)) and s.tp_comm_overlap:
        fixes["tp_comm_overlap"] = False
    if s.overlap_param_gather and not (s.use_distributed_optimizer and s.overlap_grad_reduce):
        fixes["overlap_param_gather"] = False
    if s.pp == 1 and s.virtual_pipeline_model_parallel_size:
        fixes["virtual_pipeline_model_parallel_size"] = None
    if s.pp == 1 and (s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers):
        fixes["decoder_first_pipeline_num_layers"] = None
        fixes["decoder_last_pipeline_num_layers"] = None
    fixes = {k: v for k, v in fixes.items() if k not in space.fixed}
    return s.changed(**fixes) if fixes else s


def apply_changes(reference: Strategy, changes: dict[str, Any], space: SearchSpace) -> Strategy:
    """The reference with `changes` applied and coupled flags repaired."""
    return repair(reference.changed(**changes), space)


class RulesGeneration:
    """The offline strategy-generation reasoner: one proposal per suggestion, in rank order."""

    name = "rules"

    def generate(self, inp: GenerationInput) -> GenerationOutput:
        proposals: list[Proposal] = []
        seen: set[str] = set()
        for rank, sug in enumerate(inp.analysis.suggestions, start=1):
            try:
                strategy = apply_changes(inp.reference, {c.param: c.new for c in sug.changes}, inp.search_space)
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

"""Strategy generation, offline: turn ranked suggestions into complete configurations.

A suggestion names only what changes; the rest of the configuration comes from the
reference. Coupled flags are repaired the way an engineer would, from the couplings the
knob registry declares (sequence parallel off when TP becomes 1, param-gather overlap off
without the distributed optimizer, VPP dropped when PP becomes 1, the uneven split Megatron
needs when PP stops dividing the layers) so a good idea is not lost to a flag.
"""

from __future__ import annotations

from optico.agent_contracts import GenerationInput, GenerationOutput, Proposal
from optico.repair import apply_changes, repair  # noqa: F401  (re-exported: callers import them here)


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

"""Typed inputs and outputs of the four agents, and the reasoner protocols.

Every reasoner — the offline rules and an LLM — implements the same protocol and
returns the same types, so the loop never knows which one answered. A reasoner
proposes; validity is always re-checked by code (optico.guard).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from optico.perfmodel.bottleneck import Bottleneck
from optico.search_space import SearchSpace
from optico.strategy import PAPER_NAMES, Strategy, display_value
from optico.trial import Failure, FailureCategory, Trial
from optico.workload import Workload


class HealthState(str, Enum):
    """The paper's health diagnosis, checked first."""

    SEVERELY_UNDERUTILIZED = "SEVERELY_UNDERUTILIZED"  # GPU util < 50 % and memory < 70 %: reduce parallelism
    HIGH_PP_OVERHEAD = "HIGH_PP_OVERHEAD"  # PP > 1 and MFU < 0.5: reduce PP
    MEMORY_BOUND = "MEMORY_BOUND"  # memory > 95 %: free memory first
    PERFORMANCE_TUNE = "PERFORMANCE_TUNE"  # healthy: tune the bottleneck


# What each health state asks for (the paper's directive, stated with the state).
DIRECTIVES: dict[HealthState, str] = {
    HealthState.SEVERELY_UNDERUTILIZED: "reduce parallelism (smaller TP x PP) or raise the micro-batch",
    HealthState.HIGH_PP_OVERHEAD: "reduce PP, or interleave (VPP)",
    HealthState.MEMORY_BOUND: "free memory first (recompute, more TP or PP, a smaller micro-batch)",
    HealthState.PERFORMANCE_TUNE: "tune the bottleneck",
}


class Change(BaseModel):
    """One parameter moved from one value to another."""

    model_config = ConfigDict(frozen=True)

    param: str = Field(description="A Strategy field name.")
    old: Any
    new: Any

    def text(self) -> str:
        name = PAPER_NAMES.get(self.param, self.param)
        return f"{name} from {display_value(self.param, self.old)} to {display_value(self.param, self.new)}"


def changes_text(changes: list[Change]) -> str:
    """The paper's form: 'Change TP from 2 to 1.' / 'Change TP from 2 to 1 and PP from 1 to 2.'"""
    parts = [c.text() for c in changes]
    if len(parts) <= 1:
        return f"Change {''.join(parts)}."
    return "Change " + ", ".join(parts[:-1]) + " and " + parts[-1] + "."


class Suggestion(BaseModel):
    """A ranked move from the reference configuration."""

    model_config = ConfigDict(frozen=True)

    changes: list[Change]
    reason: str
    expected_effect: str
    predicted_mfu: float | None = None
    predicted_mem_gib: float | None = None
    kind: str = Field("standard", description="standard (bottleneck tuning) or exploratory (fallback).")

    @property
    def text(self) -> str:
        return changes_text(self.changes)


class AnalysisInput(BaseModel):
    """What the bottleneck-analysis agent sees."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    workload: Workload
    search_space: SearchSpace
    history: list[Trial] = Field(description="This job's trials, oldest first.")
    prior: list[Trial] = Field(default_factory=list, description="Earlier jobs' trials on the same workload.")
    reference: Strategy = Field(description="The configuration to improve on (best so far, else the last).")
    candidates: list[Strategy] | None = Field(None, description="The launcher's finite set, if any.")
    iteration: int
    max_suggestions: int = 12


class AnalysisOutput(BaseModel):
    """Health first, then the bottleneck with evidence, then ranked suggestions."""

    model_config = ConfigDict(frozen=True)

    health: HealthState
    health_reason: str
    bottleneck: Bottleneck
    evidence: list[str]
    suggestions: list[Suggestion]
    reasoning: str = Field("", description="Chain of thought, stored not shown.")
    reasoner: str = "rules"
    directive: str = Field("", description="What the health state asks for ('' = the state's usual directive).")


class Proposal(BaseModel):
    """A complete configuration to validate, with why."""

    model_config = ConfigDict(frozen=True)

    strategy: Strategy
    rationale: str = Field(description="What changed and why, one line.")
    expected_impact: str = ""
    confidence: int = Field(50, ge=0, le=100)


class GenerationInput(BaseModel):
    model_config = ConfigDict(frozen=True)

    workload: Workload
    search_space: SearchSpace
    reference: Strategy
    analysis: AnalysisOutput
    history: list[Trial] = Field(default_factory=list, description="This job's trials, oldest first.")
    iteration: int = 0
    max_proposals: int = 12


class GenerationOutput(BaseModel):
    model_config = ConfigDict(frozen=True)

    proposals: list[Proposal]
    reasoner: str = "rules"


class FailureInput(BaseModel):
    """A failed run for the failure-analysis agent."""

    model_config = ConfigDict(frozen=True)

    workload: Workload
    strategy: Strategy
    reference: Strategy | None = None
    log: str
    exit_code: int | None = None
    category_hint: FailureCategory | None = None
    attempts: int = Field(1, description="How many times this exact configuration has run.")
    predicted_mem_fraction: float | None = None
    iteration: int = 0


class AnalysisReasoner(Protocol):
    name: str

    def analyze(self, inp: AnalysisInput) -> AnalysisOutput: ...


class GenerationReasoner(Protocol):
    name: str

    def generate(self, inp: GenerationInput) -> GenerationOutput: ...


class FailureReasoner(Protocol):
    name: str

    def diagnose(self, inp: FailureInput) -> Failure: ...

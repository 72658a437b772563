"""The one place where an LLM reasoner's failure becomes the offline rules' answer — never silently.

`WithFallback` wraps one agent's reasoner (an LLM reasoner, or the failure-analysis ablation)
together with that agent's rules reasoner and implements the same protocol, so the loop calls
it like any reasoner:

    decided = primary answers           -> Decision(reasoner=primary.name, fallback=None)
    primary raises (LLMFallback, or any -> Decision(reasoner="rules", fallback=Fallback(cause, reason));
    error of an LLM reasoner)              with `require_llm` it raises FallbackRefused instead

Every decision goes to a `Notify` callback; `pool_notifier` stores it as the agent's
`decision` message of that iteration, and a fallback also as a `fallback` message, a
`ReasonerFallback` event (the REST stream and the dashboard see it) and a warning on the
`optico` logger; the CLI prints fallback events as they happen. `decided_by` reads the
decisions back per iteration for the `--json` result, the report and the API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from optico.agent_contracts import (
    AnalysisInput,
    AnalysisOutput,
    FailureInput,
    GenerationInput,
    GenerationOutput,
)
from optico.events import ReasonerFallback
from optico.redact import clip
from optico.textsafe import terminal_text
from optico.trial import Failure

# Its own logger: `optico tune` prints fallbacks itself, wrapped, and silences this one (a service logs it).
FALLBACK_LOGGER = "optico.fallback"
log = logging.getLogger(FALLBACK_LOGGER)
R = TypeVar("R")
T = TypeVar("T")
REASON_CHARS = 500


class Fallback(BaseModel):
    """Why the rules answered instead of the reasoner that was asked."""

    model_config = ConfigDict(frozen=True)

    cause: str  # endpoint | breaker | invalid-answer | error | guard-refused-all
    reason: str  # redacted, one line


class Decision(BaseModel):
    """Which reasoner decided one agent's step of one iteration: the per-iteration record."""

    model_config = ConfigDict(frozen=True)

    agent: str  # analysis | generation | failure
    iteration: int
    asked: str  # the reasoner the spec chose: model-guided | llm-led | ablated | rules
    reasoner: str  # the one whose answer was used
    fallback: Fallback | None = None

    def line(self) -> str:
        """One console/log line."""
        if self.fallback is None:
            return f"iteration {self.iteration} {self.agent}: decided by {self.reasoner}"
        return (f"iteration {self.iteration} {self.agent}: {self.asked} fell back to the rules "
                f"({self.fallback.cause}): {self.fallback.reason}")


class FallbackRefused(RuntimeError):
    """A fallback in a job that requires the LLM (`require_llm`, `optico tune --require-llm`)."""

    def __init__(self, decision: Decision):
        super().__init__(f"{decision.line()} — refused: the job requires the LLM (--require-llm)")
        self.decision = decision


Notify = Callable[[Decision], None]


def _cause(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # LLMFallback says why
    return cause if isinstance(cause, str) else f"error ({type(exc).__name__})"


class WithFallback(Generic[R]):
    """One agent's reasoner with the offline rules behind it (see the module docstring)."""

    def __init__(self, agent: str, primary: R, rules: R, notify: Notify, *, require_llm: bool = False):
        self.agent, self.primary, self.rules = agent, primary, rules
        self.notify, self.require_llm = notify, require_llm

    @property
    def name(self) -> str:
        return getattr(self.primary, "name", "llm")

    def _decide(self, iteration: int, ask: Callable[[R], T]) -> T:
        try:
            out = ask(self.primary)
        except Exception as exc:  # an LLM reasoner that could not answer, or broke: the rules answer
            # Redacted, then cut; a server's or a model's text in it shows its escapes, never obeys them
            # (the reason goes to the pool, the log and terminals).
            reason = terminal_text(clip(" ".join(str(exc).split()), REASON_CHARS), one_line=True, max_chars=None)
            decision = Decision(agent=self.agent, iteration=iteration, asked=self.name, reasoner="rules",
                                fallback=Fallback(cause=_cause(exc), reason=reason))
            self.notify(decision)
            if self.require_llm:
                raise FallbackRefused(decision) from None
            return ask(self.rules)
        self.notify(Decision(agent=self.agent, iteration=iteration, asked=self.name, reasoner=self.name))
        return out

    def analyze(self, inp: AnalysisInput) -> AnalysisOutput:
        return self._decide(inp.iteration, lambda r: r.analyze(inp))  # type: ignore[attr-defined]

    def generate(self, inp: GenerationInput) -> GenerationOutput:
        return self._decide(inp.iteration, lambda r: r.generate(inp))  # type: ignore[attr-defined]

    def diagnose(self, inp: FailureInput) -> Failure:
        return self._decide(inp.iteration, lambda r: r.diagnose(inp))  # type: ignore[attr-defined]


def pool_notifier(store: Any, job_id: int, on_event: Callable[[str, dict[str, Any]], None] | None = None, *,
                  worker: str | None = None) -> Notify:
    """Stores each decision in the pool (as the lease holder `worker`); a fallback also as a message, a
    `fallback` event and a log warning."""

    def notify(d: Decision) -> None:
        store.add_message(job_id, d.iteration, d.agent, "decision", d.model_dump(mode="json"), d.line(),
                          worker=worker)
        if d.fallback is None:
            return
        event = ReasonerFallback(iteration=d.iteration, agent=d.agent,
                                 reason=f"{d.asked} -> rules ({d.fallback.cause}): {d.fallback.reason}")
        payload = event.model_dump(mode="json")
        store.add_message(job_id, d.iteration, d.agent, "fallback",
                          {"error": d.fallback.reason, "cause": d.fallback.cause, "asked": d.asked}, d.line(),
                          worker=worker, event=event)
        if on_event:
            on_event("fallback", payload)
        log.warning("job %s: %s", job_id, d.line())

    return notify


# -- reading the decisions back ----------------------------------------------------------------

def decided_by(messages: list[Any], spec_reasoner: Any, trials: list[Any]) -> dict[int, dict[str, Any]]:
    """{trial index: {agent: {"reasoner", "asked", "fallback": None | {"cause", "reason"}}}} for every
    trial: who chose its configuration (analysis, generation; "seed" / "retry" when no agent did)
    and, for a failed trial, who diagnosed it. Agents without a stored decision used the rules."""
    stored: dict[tuple[int, str], dict[str, Any]] = {}
    refused_all: set[int] = set()
    for m in messages:
        if m.kind == "decision":
            stored[(m.iteration, m.agent)] = {k: m.content.get(k) for k in ("reasoner", "asked", "fallback")}
        elif m.agent == "guard" and m.kind == "verdict" and m.content.get("source") == "rules fallback":
            refused_all.add(m.iteration)

    def entry(iteration: int, agent: str) -> dict[str, Any]:
        asked = getattr(spec_reasoner, agent, "rules")
        return stored.get((iteration, agent), {"reasoner": "rules", "asked": asked, "fallback": None})

    out: dict[int, dict[str, Any]] = {}
    for t in trials:
        i = t.index
        if i == 1:
            row: dict[str, Any] = {"configuration": "seed"}
        elif (t.rationale or "").startswith("RETRY"):
            row = {"configuration": "retry"}
        else:
            row = {"analysis": entry(i, "analysis"), "generation": entry(i, "generation")}
            if i in refused_all and row["generation"]["fallback"] is None:
                # the guard refused every proposal the reasoner made: the rules chose the configuration
                row["generation"] = {**row["generation"], "reasoner": "rules", "fallback": {
                    "cause": "guard-refused-all", "reason": "the guard refused every proposal; the rules chose"}}
        if t.status.value == "failed":
            row["failure"] = entry(i, "failure")
        out[i] = row
    return out


def llm_usage(messages: list[Any]) -> dict[str, Any]:
    """Calls, fallbacks, tokens and cost of a job's LLM reasoners, from its messages."""
    calls = [m.content for m in messages if m.kind in ("llm_call", "llm_reask")]
    fallbacks = [m for m in messages if m.kind == "fallback"]
    costs = [c.get("cost_usd") for c in calls if c.get("cost_usd") is not None]
    return {"calls": len(calls), "reasks": sum(1 for m in messages if m.kind == "llm_reask"),
            "fallbacks": len(fallbacks),
            "prompt_tokens": sum(c.get("prompt_tokens") or 0 for c in calls),
            "completion_tokens": sum(c.get("completion_tokens") or 0 for c in calls),
            "cost_usd": round(sum(costs), 6) if costs else None,
            "structured_output": sorted({c["mode"] for c in calls if c.get("mode")})}

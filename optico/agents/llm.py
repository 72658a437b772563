"""LLM reasoners for three of the four agents, over any OpenAI-compatible endpoint.

Each implements the same protocol as its offline rules reasoner (`optico.agents.contracts`),
so the loop never knows which one answered. One call per agent and iteration:

    render the template (optico/agents/prompts/<agent>.md) with the compact history
    -> ChatClient.complete (retries, backoff, structured output, breaker)
    -> parse (JSON, else the paper's text form) and validate into the contract
    -> on an invalid answer: one re-ask quoting the error
    -> on a second invalid answer or an endpoint failure: raise `LLMFallback`;
       the loop then asks the offline reasoner and records a "fallback" message.

Every request and response is recorded through the `Recorder` (see `optico.llm.audit`),
redacted, whether it succeeded or not. The validation agent has no reasoner: the guard and
the launcher are code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from optico.agents.analysis import RulesAnalysis
from optico.agents.contracts import (
    AnalysisInput,
    AnalysisOutput,
    Change,
    FailureInput,
    GenerationInput,
    GenerationOutput,
    Proposal,
    changes_text,
)
from optico.agents.failure import first_error
from optico.agents.generation import apply_changes
from optico.llm.answers import (
    AnswerError,
    analysis_answer,
    analysis_schema,
    failure_answer,
    failure_schema,
    generation_answer,
    generation_schema,
)
from optico.llm.audit import Recorder, null_recorder
from optico.llm.client import ChatClient, Completion, EndpointError
from optico.llm.history import HistoryView, history_view
from optico.llm.parsing import extract_json, split_reasoning
from optico.llm.prompts import config_json, config_line, render, search_space_block, workload_block
from optico.llm.settings import LLMSettings, load_settings
from optico.llm.untrusted import cell, excerpt, fence
from optico.search_space import SearchSpace
from optico.spec import JobSpec
from optico.strategy import PAPER_NAMES, Strategy, display_value
from optico.trial import Failure, FailureCategory, Trial, TrialStatus

T = TypeVar("T")

REASK = ("Your previous answer could not be used: {error}.\n"
         "Answer again in the required format, using only the parameters and values of the search space. "
         "This is the last attempt.")


class LLMFallback(RuntimeError):
    """The model gave no usable answer; the caller falls back to the offline reasoner."""


def _join(*parts: str) -> str:
    return "\n\n".join(p.strip() for p in parts if p and p.strip())


class _LLMAgent:
    """Asking, re-asking once, and recording; the agents differ in prompt and validation."""

    agent = "abstract"
    name = "openai"

    def __init__(self, client: ChatClient, record: Recorder = null_recorder):
        self.client, self.settings, self.record = client, client.settings, record

    def _output_format(self, json_shape: str, text_shape: str) -> str:
        if self.client.mode == "text":
            return text_shape
        return json_shape

    def _ask(self, iteration: int, messages: list[dict[str, str]], schema: dict[str, Any],
             parse: Callable[[dict[str, Any] | None, str], T], context: dict[str, Any]) -> tuple[T, str]:
        """(the validated answer, the model's reasoning); LLMFallback when there is none."""
        for kind in ("llm_call", "llm_reask"):
            last = kind == "llm_reask"
            try:
                completion = self.client.complete(messages, schema=schema, name=f"optico_{self.agent}")
            except EndpointError as exc:
                self._store(iteration, kind, messages, None, "", "", str(exc), True, context, exc)
                raise LLMFallback(f"{self.agent}: endpoint failed: {exc}") from None
            thought, answer = split_reasoning(completion.text)
            data = extract_json(answer)
            think = data.get("think") if isinstance(data, dict) and isinstance(data.get("think"), str) else ""
            reasoning = _join(completion.reasoning, thought, think)
            if think:  # stored under "reasoning" (shown only on request), not twice
                answer = json.dumps({k: v for k, v in data.items() if k != "think"})
            try:
                result = parse(data, answer)
            except ValueError as exc:  # AnswerError, or a value a contract model refused
                detail = str(exc) if isinstance(exc, AnswerError) else " ".join(str(exc).split())[:400]
                error = f"invalid answer: {detail}"
                self._store(iteration, kind, messages, completion, answer, reasoning, error, last, context)
                if last:
                    raise LLMFallback(f"{self.agent}: {error} (after a re-ask)") from None
                messages = [*messages, {"role": "assistant", "content": answer},
                            {"role": "user", "content": REASK.format(error=detail)}]
                continue
            self._store(iteration, kind, messages, completion, answer, reasoning, None, False, context)
            return result, reasoning
        raise AssertionError("unreachable")

    def _store(self, iteration: int, kind: str, messages: list[dict[str, str]], c: Completion | None,
               answer: str, reasoning: str, error: str | None, fallback: bool, context: dict[str, Any],
               exc: EndpointError | None = None) -> None:
        content: dict[str, Any] = {
            "model": c.model if c else self.client.model, "endpoint": self.client.endpoint,
            "mode": c.mode if c else self.client.mode, "messages": messages, "completion": answer,
            "reasoning": reasoning, "prompt_tokens": c.prompt_tokens if c else None,
            "completion_tokens": c.completion_tokens if c else None,
            "tokens_reported": c.tokens_reported if c else None,
            "latency_s": c.latency_s if c else round(exc.latency_s, 3) if exc else None,
            "attempts": c.attempts if c else exc.attempts if exc else 0,
            "retries": c.retries if c else exc.retries if exc else [],
            "cost_usd": c.cost_usd if c else None, "finish_reason": c.finish_reason if c else None,
            "notes": c.notes if c else [], "error": error, "fallback": fallback, **context}
        if c:
            text = (f"{c.model} ({c.mode}): {c.prompt_tokens}+{c.completion_tokens} tokens, {c.latency_s:.2f} s, "
                    f"{c.attempts} attempt(s)")
        else:
            text = f"{self.client.model}: no answer"
        if error:
            text += f"; {error}"
        if fallback:
            text += "; falling back to the offline reasoner"
        self.record(self.agent, iteration, kind, self.client.redactor.scrub(content),
                    self.client.redactor.text(text))

    def _history(self, trials: list[Trial], space: SearchSpace, reference: Strategy,
                 prior: list[Trial] | None = None) -> HistoryView:
        s = self.settings
        return history_view(trials, space=space, reference=reference, best_k=s.history_best_k,
                            last_n=s.history_last_n, token_budget=s.history_token_budget, prior=prior)


def _latest(trials: list[Trial], fields: list[str]) -> str:
    if not trials:
        return "No run yet."
    t = trials[-1]
    head = f"#{t.index}: {config_line(t.strategy, fields)}"
    if t.status == TrialStatus.OK and t.metrics:
        m = t.metrics
        parts = [f"MFU {m.mfu:.1%}", f"{m.tflops_per_gpu:.0f} TFLOP/s/GPU", f"step {m.step_time_s:.2f} s"]
        if m.mem_max_gib and m.mem_limit_gib:
            share = m.mem_max_gib / m.mem_limit_gib
            parts.append(f"memory {m.mem_max_gib:.1f}/{m.mem_limit_gib:.1f} GiB ({share:.0%})")
        if m.gpu_util_avg is not None:
            parts.append(f"GPU util {m.gpu_util_avg:.0%}")
        return f"{head}\nok: " + ", ".join(parts)
    diagnosis = cell(t.failure.summary if t.failure else "not diagnosed")
    return f"{head}\nfailed ({t.failure.category.value if t.failure else 'unknown'}): {diagnosis}"


# -- bottleneck analysis -----------------------------------------------------------------------

_ANALYSIS_JSON = (
    'Answer with one JSON object, nothing else:\n'
    '{"think": "<your step-by-step reasoning>", "health": "<SEVERELY_UNDERUTILIZED | HIGH_PP_OVERHEAD | '
    'MEMORY_BOUND | PERFORMANCE_TUNE>", "health_reason": "<the numbers that decide it>", '
    '"bottleneck": "<compute | memory-capacity | communication | pipeline-bubble>", '
    '"suggestions": [{"changes": [{"param": "<PARAM>", "from": <current value>, "to": <new value>}], '
    '"reason": "<why, with numbers>", "expected_effect": "<effect on MFU and memory>", '
    '"kind": "<standard | exploratory>"}]}\n'
    'Suggestions best first; parameters by the names of the search space. The reasoning you would write '
    'inside <think> goes in "think".')
_ANALYSIS_TEXT = (
    'Answer in exactly this form, nothing else:\n'
    '<think>your step-by-step reasoning</think>\n'
    'HEALTH: <SEVERELY_UNDERUTILIZED | HIGH_PP_OVERHEAD | MEMORY_BOUND | PERFORMANCE_TUNE>\n'
    'HEALTH_REASON: <the numbers that decide it>\n'
    'BOTTLENECK: <compute | memory-capacity | communication | pipeline-bubble>\n'
    'SUGGESTIONS:\n'
    '1. Change <PARAM> from <A> to <B>. Reason: <why, with numbers>. Expected: <effect on MFU and memory>. '
    'Kind: <standard | exploratory>\n'
    '2. Change <PARAM> from <A> to <B> and <PARAM> from <C> to <D>. Reason: ... Expected: ... Kind: ...')


class LLMAnalysis(_LLMAgent):
    """Bottleneck analysis by a model, with the rules reasoner's performance-model evidence."""

    agent = "analysis"

    def __init__(self, client: ChatClient, rules: RulesAnalysis, record: Recorder = null_recorder):
        super().__init__(client, record)
        self.rules = rules

    def messages(self, inp: AnalysisInput, base: AnalysisOutput) -> tuple[list[dict[str, str]], HistoryView]:
        space, ref = inp.search_space, inp.reference
        view = self._history(inp.history, space, ref, inp.prior)
        candidates = "\n".join(f"{i}. {s.text} {s.expected_effect} ({s.kind})"
                               for i, s in enumerate(base.suggestions[: self.settings.model_candidates], start=1))
        evidence = "\n".join([f"- bottleneck class (model): {base.bottleneck.value}",
                              *(f"- {e}" for e in base.evidence[:8])])
        values = {
            "workload": workload_block(inp.workload, space), "search_space": search_space_block(space),
            "history": fence(view.text, "pool-history"), "current": config_json(ref, space),
            "latest": fence(_latest(inp.history, list(space.tunables)), "pool-latest"), "evidence": evidence,
            "candidates": candidates or "none: every candidate is tried, known to fail or predicted OOM",
            "max_suggestions": self._limit(inp), "output_format": self._output_format(_ANALYSIS_JSON, _ANALYSIS_TEXT),
        }
        return render("analysis", values), view

    def _limit(self, inp: AnalysisInput) -> int:
        return min(self.settings.max_suggestions, inp.max_suggestions)

    def analyze(self, inp: AnalysisInput) -> AnalysisOutput:
        # The model's evidence and admissible moves come from the rules reasoner; the LLM ranks.
        base = self.rules.analyze(inp.model_copy(update={"max_suggestions": max(1, self.settings.model_candidates)}))
        messages, view = self.messages(inp, base)
        space, ref, model = inp.search_space, inp.reference, self.rules.model

        def parse(data: dict[str, Any] | None, text: str):
            return analysis_answer(data, text, space=space, reference=ref, limit=self._limit(inp))

        answer, reasoning = self._ask(inp.iteration, messages, analysis_schema(self._limit(inp)), parse,
                                      {"history": view.stats()})
        suggestions = []
        for s in answer.suggestions:
            target = apply_changes(ref, {c.param: c.new for c in s.changes}, space)
            suggestions.append(s.model_copy(update={"predicted_mfu": model.mfu(target),
                                                    "predicted_mem_gib": model.mem_gib(target)}))
        return AnalysisOutput(health=answer.health, health_reason=answer.health_reason,
                              bottleneck=answer.bottleneck or base.bottleneck, evidence=base.evidence,
                              suggestions=suggestions, reasoning=reasoning, reasoner=self.name)


# -- strategy generation -----------------------------------------------------------------------

_GENERATION_TEXT = (
    'Answer in exactly this form, nothing else:\n'
    '<think>your reasoning</think>\n'
    'PROPOSAL 1\n'
    '<PARAM>: <value>   (one line for every tunable parameter of the search space)\n'
    'JUSTIFICATION: <what changed and why>\n'
    'EXPECTED_IMPACT: <effect on MFU and memory>\n'
    '(Confidence: <0-100>)\n'
    'PROPOSAL 2\n'
    '...')


def _generation_json(space: SearchSpace, reference: Strategy) -> str:
    example = ", ".join(f'"{f}": {_json_value(getattr(reference, f))}' for f in space.tunables)
    return ('Answer with one JSON object, nothing else:\n'
            '{"think": "<your reasoning>", "proposals": [{"config": {' + example + '}, '
            '"justification": "<what changed and why>", "expected_impact": "<effect on MFU and memory>", '
            '"confidence": <0-100>}]}\n'
            'Each config lists every tunable parameter (the example shows the current values); best proposal '
            'first. The reasoning you would write inside <think> goes in "think".')


def _json_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def _analysis_text(a: AnalysisOutput) -> str:
    lines = [f"Health: {a.health.value} — {cell(a.health_reason, 40)}", f"Bottleneck: {a.bottleneck.value}"]
    lines += [f"Evidence: {cell(e, 30)}" for e in a.evidence[:4]]
    lines.append("Ranked suggestions:")
    lines += [f"{i}. {s.text} Reason: {cell(s.reason, 40)} Expected: {cell(s.expected_effect, 25)} ({s.kind})"
              for i, s in enumerate(a.suggestions[:8], start=1)]
    return "\n".join(lines)


class LLMGeneration(_LLMAgent):
    """Complete configurations from the analysis, by a model; up to k ranked proposals."""

    agent = "generation"

    def messages(self, inp: GenerationInput) -> tuple[list[dict[str, str]], HistoryView]:
        space, ref = inp.search_space, inp.reference
        view = self._history(inp.history, space, ref)
        values = {
            "workload": workload_block(inp.workload, space), "search_space": search_space_block(space),
            "history": fence(view.text, "pool-history"), "current": config_json(ref, space),
            "analysis": fence(_analysis_text(inp.analysis), "analysis"), "max_proposals": self._limit(inp),
            "output_format": self._output_format(_generation_json(space, ref), _GENERATION_TEXT),
        }
        return render("generation", values), view

    def _limit(self, inp: GenerationInput) -> int:
        return min(self.settings.max_proposals, inp.max_proposals)

    def generate(self, inp: GenerationInput) -> GenerationOutput:
        messages, view = self.messages(inp)
        space, ref = inp.search_space, inp.reference

        def parse(data: dict[str, Any] | None, text: str):
            return generation_answer(data, text, space=space, reference=ref, limit=self._limit(inp))

        answers, _ = self._ask(inp.iteration, messages, generation_schema(space, self._limit(inp)), parse,
                               {"history": view.stats()})
        proposals = []
        for a in answers:
            changes = [Change(param=f, old=old, new=new) for f, (old, new) in ref.diff(a.strategy).items()]
            moved = changes_text(changes) if changes else "No change."
            proposals.append(Proposal(strategy=a.strategy, rationale=f"{moved} {cell(a.justification, 40)}".strip(),
                                      expected_impact=a.expected_impact, confidence=a.confidence))
        return GenerationOutput(proposals=proposals, reasoner=self.name)


# -- failure analysis --------------------------------------------------------------------------

_FAILURE_JSON = (
    'Answer with one JSON object, nothing else:\n'
    '{"think": "<your reasoning>", "summary": "<the one line, in the form above>", '
    '"category": "<oom | invalid_config | comm_timeout | hang | infrastructure | not_measured | unknown>", '
    '"params": ["<PARAM>", ...], "confidence": <0-100>, '
    '"retry": <true only for "No parameter issue. RETRY">}\n'
    'The reasoning you would write inside <think> goes in "think".')
_FAILURE_TEXT = "Answer with <think>your reasoning</think> followed by the one line, nothing else."


class LLMFailureAnalysis(_LLMAgent):
    """Failure diagnosis by a model, in the paper's fixed form."""

    agent = "failure"

    def __init__(self, client: ChatClient, space: SearchSpace, record: Recorder = null_recorder):
        super().__init__(client, record)
        self.space = space

    def _detected(self, inp: FailureInput) -> tuple[FailureCategory | None, str]:
        """The category the log or the launcher shows for certain, and the first error line."""
        category, _, line = first_error(inp.log)
        hint = inp.category_hint
        if hint in (FailureCategory.HANG, FailureCategory.NOT_MEASURED) or (hint and category is None):
            category = hint
        return category, line

    def messages(self, inp: FailureInput) -> list[dict[str, str]]:
        fields = list(self.space.tunables)
        if inp.reference is not None:
            diff = inp.reference.diff(inp.strategy)
            changes = ", ".join(f"{PAPER_NAMES.get(f, f)} {display_value(f, a)} -> {display_value(f, b)}"
                                for f, (a, b) in diff.items()) or "none: the same configuration"
        else:
            changes = "none: this was the first run"
        facts = [f"- this exact configuration has now run {inp.attempts} time(s)"]
        if inp.exit_code is not None:
            facts.append(f"- exit code {inp.exit_code}")
        if inp.category_hint is not None:
            facts.append(f"- the launcher classified it as: {inp.category_hint.value}")
        if inp.predicted_mem_fraction is not None:
            facts.append(f"- the performance model predicts {inp.predicted_mem_fraction:.0%} of GPU memory")
        values = {
            "workload": workload_block(inp.workload, self.space),
            "failed": config_line(inp.strategy, fields), "changes": changes, "facts": "\n".join(facts),
            "log": fence(excerpt(inp.log, self.settings.log_max_chars) or "(empty log)", "log"),
            "output_format": self._output_format(_FAILURE_JSON, _FAILURE_TEXT),
        }
        return render("failure", values)

    def diagnose(self, inp: FailureInput) -> Failure:
        detected, line = self._detected(inp)
        log_excerpt = line or inp.log.strip()[-300:]

        def parse(data: dict[str, Any] | None, text: str) -> Failure:
            return failure_answer(data, text, space=self.space, detected=detected, excerpt=log_excerpt)

        failure, _ = self._ask(inp.iteration, self.messages(inp), failure_schema(), parse, {})
        return failure


# -- wiring ------------------------------------------------------------------------------------

@dataclass
class LLMReasoners:
    client: ChatClient
    analysis: LLMAnalysis
    generation: LLMGeneration
    failure: LLMFailureAnalysis


def build_llm_reasoners(spec: JobSpec, rules_analysis: RulesAnalysis, record: Recorder = null_recorder,
                        settings: LLMSettings | None = None) -> LLMReasoners:
    """The three LLM reasoners of a job, sharing one client (and so one breaker and one
    structured-output negotiation). Settings come from the environment unless given;
    ValueError names the variable that is missing or wrong."""
    client = ChatClient(settings or load_settings())
    return LLMReasoners(client=client, analysis=LLMAnalysis(client, rules_analysis, record),
                        generation=LLMGeneration(client, record),
                        failure=LLMFailureAnalysis(client, spec.search_space, record))

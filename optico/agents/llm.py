"""LLM reasoners for three of the four agents, over any OpenAI-compatible endpoint.

Each implements the same protocol as its offline rules reasoner (`optico.agent_contracts`),
so the loop never knows which one answered. Two modes (`AskOptions.mode`): model-guided (the
LLM ranks the performance model's candidates) and llm-led (the paper: the LLM reasons over the
history table and writes the configurations; only the guard stands between it and a launch).
One call per agent and iteration:

    render the template (optico/agents/prompts/<agent>.md) with the history view
    -> ChatClient.complete (streaming, retries, backoff, structured output, breaker)
    -> redact, parse (JSON, else the paper's text form) and validate into the contract
       (generation: proposals the guard refuses are invalid too)
    -> on an invalid answer: one re-ask quoting the error
    -> on a second invalid answer or an endpoint failure: raise `LLMFallback`; the wrapper
       in `optico.agents.fallback` asks the offline reasoner and records why.

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
from optico.agent_contracts import (
    DIRECTIVES,
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
from optico.llm.answers import AnswerError, FailureVerdict, analysis_answer, failure_answer, generation_answer
from optico.llm.audit import Recorder, null_recorder
from optico.llm.client import ChatClient, Completion, EndpointError
from optico.llm.formats import (
    AskOptions,
    analysis_format,
    analysis_schema,
    failure_format,
    failure_forms,
    failure_schema,
    generation_format,
    generation_schema,
)
from optico.llm.history import HistoryView, history_view
from optico.llm.parsing import extract_json, split_reasoning, too_long, without_confidence
from optico.llm.prompts import config_json, config_line, render, search_space_block, semantics_block, workload_block
from optico.llm.settings import LLMSettings, load_settings
from optico.llm.untrusted import cell, excerpt, fence
from optico.perfmodel.bottleneck import Bottleneck
from optico.redact import clip
from optico.search_space import SearchSpace
from optico.spec import JobSpec
from optico.strategy import PAPER_NAMES, Strategy, display_value
from optico.textsafe import terminal_text
from optico.trial import Failure, FailureCategory, Trial, TrialStatus

T = TypeVar("T")
KEPT_OF_A_LONG_ANSWER = 4000  # characters of an answer too long to read that the pool keeps

REASK = ("Your previous answer could not be used: {error}.\n"
         "Answer again in the required format, using only the parameters and values of the search space. "
         "This is the last attempt.")


class LLMFallback(RuntimeError):
    """The model gave no usable answer; the caller falls back to the offline reasoner.

    `cause` is one of: endpoint (no answer after the retries), breaker (the endpoint is being
    skipped after failing calls in a row), invalid-answer (invalid twice, the re-ask included)."""

    def __init__(self, message: str, cause: str):
        super().__init__(message)
        self.cause = cause


# How the chain of thought is asked for, or not (the CoT ablation).
_PROCEDURE = {
    ("analysis", True, "text"): "Reason step by step inside <think> ... </think> before you answer, following "
                                "this procedure:",
    ("analysis", True, "json"): 'Reason step by step in the "think" field before the rest of the answer, '
                                'following this procedure:',
    ("analysis", False, None): "Follow this procedure, and write only the answer, no reasoning:",
    ("failure", True, "text"): "Reason inside <think> ... </think>, then diagnose:",
    ("failure", True, "json"): 'Reason in the "think" field, then diagnose:',
    ("failure", False, None): "Diagnose, and write only the answer, no reasoning:",
    ("generation", True, "text"): "Reason inside <think> ... </think> before the proposals.",
    ("generation", True, "json"): 'Reason in the "think" field before the proposals.',
    ("generation", False, None): "Write only the proposals, no reasoning.",
}


def _join(*parts: str) -> str:
    return "\n\n".join(p.strip() for p in parts if p and p.strip())


class _LLMAgent:
    """Asking, re-asking once, and recording; the agents differ in prompt and validation."""

    agent = "abstract"

    def __init__(self, client: ChatClient, record: Recorder = null_recorder, opts: AskOptions = AskOptions()):
        self.client, self.settings, self.record, self.opts = client, client.settings, record, opts

    @property
    def name(self) -> str:
        """The reasoner's name as recorded: model-guided or llm-led."""
        return self.opts.mode

    @property
    def json_mode(self) -> bool:
        return self.client.mode != "text"

    def procedure(self) -> str:
        if not self.opts.cot:
            return _PROCEDURE[(self.agent, False, None)]
        return _PROCEDURE[(self.agent, True, "json" if self.json_mode else "text")]

    def _ask(self, iteration: int, messages: list[dict[str, str]], schema: dict[str, Any],
             parse: Callable[[dict[str, Any] | None, str], T], context: dict[str, Any]) -> tuple[T, str]:
        """(the validated answer, the model's reasoning); LLMFallback when there is none."""
        redactor = self.client.redactor
        for kind in ("llm_call", "llm_reask"):
            last = kind == "llm_reask"
            try:
                completion = self.client.complete(messages, schema=schema, name=f"optico_{self.agent}",
                                                  max_tokens=self.settings.agent_max_tokens(self.agent))
            except EndpointError as exc:
                self._store(iteration, kind, messages, None, "", "", str(exc), True, context, exc)
                cause = "breaker" if exc.attempts == 0 else "endpoint"
                raise LLMFallback(f"{self.agent}: endpoint failed: {exc}", cause) from None
            # Redacted before anything is parsed, cut or stored: an answer that echoes a key
            # must not carry it into a diagnosis, a rationale or the pool.
            thought, answer = split_reasoning(redactor.text(completion.text))
            refused = too_long(answer)
            if refused:  # not parsed, and kept only in part
                answer = answer[:KEPT_OF_A_LONG_ANSWER]
            data = None if refused else redactor.scrub(extract_json(answer))
            think = data.get("think") if isinstance(data, dict) and isinstance(data.get("think"), str) else ""
            reasoning = _join(redactor.text(completion.reasoning), thought, think)
            if think:  # stored under "reasoning" (shown only on request), not twice
                answer = json.dumps({k: v for k, v in data.items() if k != "think"})
            try:
                if refused:
                    raise AnswerError(refused)
                result = parse(data if isinstance(data, dict) else None, answer)
            except ValueError as exc:  # AnswerError, or a value a contract model refused
                detail = str(exc) if isinstance(exc, AnswerError) else " ".join(str(exc).split())
                # Quotes the model's values, and goes to the pool, the log and terminals: escapes shown, not obeyed.
                detail = terminal_text(redactor.text(detail), one_line=True, max_chars=None)[:400]
                if completion.finish_reason == "length":
                    detail += f" (the answer was cut at {self.settings.agent_max_tokens(self.agent)} tokens)"
                error = f"invalid answer: {detail}"
                self._store(iteration, kind, messages, completion, answer, reasoning, error, last, context)
                if last:
                    raise LLMFallback(f"{self.agent}: {error} (after a re-ask)", "invalid-answer") from None
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
            "reasoner": self.name, "mode": c.mode if c else self.client.mode, "messages": messages,
            "completion": answer, "reasoning": reasoning, "prompt_tokens": c.prompt_tokens if c else None,
            "completion_tokens": c.completion_tokens if c else None,
            "tokens_reported": c.tokens_reported if c else None, "usage_source": c.usage_source if c else None,
            "streamed": c.streamed if c else None,
            "latency_s": c.latency_s if c else round(exc.latency_s, 3) if exc else None,
            "attempts": c.attempts if c else exc.attempts if exc else 0,
            "retries": c.retries if c else exc.retries if exc else [],
            "cost_usd": c.cost_usd if c else None, "finish_reason": c.finish_reason if c else None,
            "max_tokens": self.settings.agent_max_tokens(self.agent),
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
        s, o = self.settings, self.opts
        budget = s.history_token_budget_led if o.led else s.history_token_budget
        return history_view(self._shown(trials), space=space, reference=reference, best_k=s.history_best_k,
                            last_n=s.history_last_n, token_budget=budget, prior=self._shown(prior or []),
                            full=o.led, last_only=not o.history)

    def _shown(self, trials: list[Trial]) -> list[Trial]:
        """The trials as a prompt shows them: under the confidence ablation, every diagnosis without its
        "(Confidence: N)" (the rules, which write the diagnosis when the model's answer is refused,
        give one whatever the ablation)."""
        if self.opts.confidence:
            return trials
        return [t.model_copy(update={"failure": t.failure.model_copy(
                    update={"summary": without_confidence(t.failure.summary)})}) if t.failure else t
                for t in trials]


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

class LLMAnalysis(_LLMAgent):
    """Bottleneck analysis by a model. model-guided: it ranks the performance model's candidate
    moves, shown with the model's evidence. llm-led (the paper): it reasons over the history table
    and the parameter semantics alone, and its suggestions are not re-ranked by any code."""

    agent = "analysis"

    def __init__(self, client: ChatClient, rules: RulesAnalysis, record: Recorder = null_recorder,
                 opts: AskOptions = AskOptions()):
        super().__init__(client, record, opts)
        self.rules = rules

    def messages(self, inp: AnalysisInput, base: AnalysisOutput | None) -> tuple[list[dict[str, str]], HistoryView]:
        space, ref = inp.search_space, inp.reference
        view = self._history(inp.history, space, ref, inp.prior)
        history = self._shown(inp.history if self.opts.history else inp.history[-1:])
        values = {
            "workload": workload_block(inp.workload, space), "search_space": search_space_block(space),
            "history": fence(view.text, "pool-history"), "current": config_json(ref, space),
            "latest": fence(_latest(history, list(space.tunables)), "pool-latest"),
            "max_suggestions": self._limit(inp), "output_format": analysis_format(self.opts, self.json_mode),
            "procedure": self.procedure(),
        }
        if base is None:  # llm-led
            values["semantics"] = semantics_block(space)
            return render("analysis-led", values), view
        values["candidates"] = "\n".join(f"{i}. {s.text} {s.expected_effect} ({s.kind})" for i, s in
                                         enumerate(base.suggestions[: self.settings.model_candidates], start=1)) \
            or "none: every candidate is tried, known to fail or predicted OOM"
        values["evidence"] = "\n".join([f"- bottleneck class (model): {base.bottleneck.value}",
                                        *(f"- {e}" for e in base.evidence[:8])])
        return render("analysis", values), view

    def _limit(self, inp: AnalysisInput) -> int:
        return min(self.settings.max_suggestions, inp.max_suggestions)

    def analyze(self, inp: AnalysisInput) -> AnalysisOutput:
        base = None
        if not self.opts.led:
            # model-guided: the model's evidence and admissible moves come from the rules reasoner; the LLM ranks.
            base = self.rules.analyze(inp.model_copy(update={"max_suggestions": max(1, self.settings.model_candidates)}))
        messages, view = self.messages(inp, base)
        space, ref, model = inp.search_space, inp.reference, self.rules.model

        def parse(data: dict[str, Any] | None, text: str):
            return analysis_answer(data, text, space=space, reference=ref, limit=self._limit(inp))

        answer, reasoning = self._ask(inp.iteration, messages, analysis_schema(space, self._limit(inp), self.opts),
                                      parse, {"history": view.stats()})
        suggestions = answer.suggestions
        if base is not None:  # model-guided: annotate with the model's predictions
            suggestions = []
            for s in answer.suggestions:
                target = apply_changes(ref, {c.param: c.new for c in s.changes}, space)
                suggestions.append(s.model_copy(update={"predicted_mfu": model.mfu(target),
                                                        "predicted_mem_gib": model.mem_gib(target)}))
        bottleneck = answer.bottleneck or (base.bottleneck if base else Bottleneck.COMPUTE)
        return AnalysisOutput(health=answer.health, health_reason=answer.health_reason, bottleneck=bottleneck,
                              evidence=base.evidence if base else [], suggestions=suggestions,
                              reasoning=reasoning, reasoner=self.name,
                              directive=answer.directive or DIRECTIVES[answer.health])


# -- strategy generation -----------------------------------------------------------------------

def _analysis_text(a: AnalysisOutput) -> str:
    lines = [f"Health: {a.health.value} — {cell(a.health_reason, 40)}",
             f"Directive: {cell(a.directive or DIRECTIVES[a.health], 20)}", f"Bottleneck: {a.bottleneck.value}"]
    lines += [f"Evidence: {cell(e, 30)}" for e in a.evidence[:4]]
    lines.append("Ranked suggestions:")
    lines += [f"{i}. {s.text} Reason: {cell(s.reason, 40)} Expected: {cell(s.expected_effect, 25)} ({s.kind})"
              for i, s in enumerate(a.suggestions[:8], start=1)]
    return "\n".join(lines)


Vet = Callable[[Strategy, list[Trial]], "str | None"]
"""vet(strategy, history): why the guard refuses `strategy`, or None when it would run it."""


class LLMGeneration(_LLMAgent):
    """Complete configurations from the analysis, by a model; up to k ranked proposals. A proposal
    the guard refuses is an invalid answer: the re-ask quotes the guard's reason, so the model,
    not the rules, gets the second try."""

    agent = "generation"

    def __init__(self, client: ChatClient, record: Recorder = null_recorder, opts: AskOptions = AskOptions(),
                 vet: Vet | None = None):
        super().__init__(client, record, opts)
        self.vet = vet

    def messages(self, inp: GenerationInput) -> tuple[list[dict[str, str]], HistoryView]:
        space, ref = inp.search_space, inp.reference
        view = self._history(inp.history, space, ref)
        values = {
            "workload": workload_block(inp.workload, space), "search_space": search_space_block(space),
            "semantics": semantics_block(space), "history": fence(view.text, "pool-history"),
            "current": config_json(ref, space), "analysis": fence(_analysis_text(inp.analysis), "analysis"),
            "max_proposals": self._limit(inp), "procedure": self.procedure(),
            "confidence_ask": (", the expected impact on MFU and memory, and your confidence (0-100) that it runs "
                               "and improves MFU") if self.opts.confidence else
                              " and the expected impact on MFU and memory",
            "output_format": generation_format(self.opts, self.json_mode, space, ref),
        }
        return render("generation", values), view

    def _limit(self, inp: GenerationInput) -> int:
        return min(self.settings.max_proposals, inp.max_proposals)

    def generate(self, inp: GenerationInput) -> GenerationOutput:
        messages, view = self.messages(inp)
        space, ref = inp.search_space, inp.reference

        def parse(data: dict[str, Any] | None, text: str):
            answers = generation_answer(data, text, space=space, reference=ref, limit=self._limit(inp))
            if self.vet is None:
                return answers
            kept, refused = [], []
            for a in answers:
                why = self.vet(a.strategy, inp.history)
                (refused.append(f"{a.strategy.short()}: {why}") if why else kept.append(a))
            if not kept:
                raise AnswerError("the validator refused every proposal: " + "; ".join(refused[:4]))
            return kept

        answers, _ = self._ask(inp.iteration, messages, generation_schema(space, self._limit(inp), self.opts), parse,
                               {"history": view.stats()})
        proposals = []
        for a in answers:
            changes = [Change(param=f, old=old, new=new) for f, (old, new) in ref.diff(a.strategy).items()]
            moved = changes_text(changes) if changes else "No change."
            proposals.append(Proposal(strategy=a.strategy, rationale=f"{moved} {cell(a.justification, 40)}".strip(),
                                      expected_impact=a.expected_impact,
                                      confidence=a.confidence if self.opts.confidence else 50))
        return GenerationOutput(proposals=proposals, reasoner=self.name)


# -- failure analysis --------------------------------------------------------------------------

class LLMFailureAnalysis(_LLMAgent):
    """Failure diagnosis by a model, in the paper's fixed forms. Whether a RETRY is granted is
    decided by `optico.llm.answers.earned_retry`, never by the model alone."""

    agent = "failure"

    def __init__(self, client: ChatClient, space: SearchSpace, record: Recorder = null_recorder,
                 opts: AskOptions = AskOptions()):
        super().__init__(client, record, opts)
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
            "output_format": failure_format(self.opts, self.json_mode), "procedure": self.procedure(),
            "forms": failure_forms(self.opts),
            "confidence_step": "State your confidence, 0-100." if self.opts.confidence else
                               "Say what the log shows, nothing more.",
        }
        return render("failure", values)

    def diagnose(self, inp: FailureInput) -> Failure:
        detected, line = self._detected(inp)
        log_excerpt = line or clip(inp.log.strip(), 300, tail=True)

        def parse(data: dict[str, Any] | None, text: str) -> FailureVerdict:
            return failure_answer(data, text, space=self.space, detected=detected, excerpt=log_excerpt, log=inp.log,
                                  attempts=inp.attempts, confidence_asked=self.opts.confidence)

        verdict, _ = self._ask(inp.iteration, self.messages(inp), failure_schema(self.space, self.opts), parse, {})
        if verdict.retry_refused:
            self.record(self.agent, inp.iteration, "retry_refused", {"reason": verdict.retry_refused},
                        f"RETRY not granted: {verdict.retry_refused}")
        return verdict.failure


# -- wiring ------------------------------------------------------------------------------------

@dataclass
class LLMReasoners:
    client: ChatClient
    analysis: LLMAnalysis
    generation: LLMGeneration
    failure: LLMFailureAnalysis


def options(spec: JobSpec, agent: str) -> AskOptions:
    """The agent's mode and the spec's ablations as the reasoner asks them."""
    r = spec.reasoner
    mode = getattr(r, agent)
    return AskOptions(mode=mode if mode != "rules" else "model-guided", cot=not r.ablated("cot"),
                      confidence=not r.ablated("confidence"), history=not r.ablated("history"))


def build_llm_reasoners(spec: JobSpec, rules_analysis: RulesAnalysis, record: Recorder = null_recorder,
                        settings: LLMSettings | None = None, vet: Vet | None = None) -> LLMReasoners:
    """The three LLM reasoners of a job, sharing one client (and so one breaker and one
    structured-output negotiation). Settings come from the environment unless given;
    ValueError names the variable that is missing or wrong."""
    client = ChatClient(settings or load_settings())
    return LLMReasoners(client=client,
                        analysis=LLMAnalysis(client, rules_analysis, record, options(spec, "analysis")),
                        generation=LLMGeneration(client, record, options(spec, "generation"), vet),
                        failure=LLMFailureAnalysis(client, spec.search_space, record, options(spec, "failure")))

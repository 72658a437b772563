"""What an answer must look like: the JSON schemas sent as response_format and the output
instructions of the prompts, for each mode and ablation.

The schemas bound the answer's shape (every list has a maxItems, every choice is an enum of
what the search space allows, so that even a small model's constrained answer is a valid
move more often than not); the length of free text is bounded by each agent's max_tokens,
not by maxLength: llama.cpp turns maxLength into nested repetitions, and llama-cpp-python
0.3.36's server died parsing the grammar of a schema with a 1,200-character field.
Validation (`optico.llm.answers`) still checks everything: a server may ignore the schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optico.agent_contracts import HealthState
from optico.perfmodel.bottleneck import Bottleneck
from optico.search_space import SearchSpace
from optico.strategy import PAPER_NAMES, Strategy
from optico.trial import FailureCategory



@dataclass(frozen=True)
class AskOptions:
    """How an LLM reasoner asks: its mode and the paper's ablations."""

    mode: str = "model-guided"  # model-guided | llm-led
    cot: bool = True  # ask for a chain of thought ("think") before the answer
    confidence: bool = True  # ask for confidence scores
    history: bool = True  # show the pool's history (False: the last trial only)

    @property
    def led(self) -> bool:
        return self.mode == "llm-led"


def _text() -> dict[str, Any]:
    return {"type": "string"}


def _obj(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": list(properties),
            "properties": properties}


def _with_think(properties: dict[str, Any], opts: AskOptions) -> dict[str, Any]:
    # "think" first: a grammar-constrained model writes its reasoning before its answer.
    return _obj({"think": _text(), **properties} if opts.cot else properties)


def analysis_schema(space: SearchSpace, max_suggestions: int, opts: AskOptions) -> dict[str, Any]:
    """Health, directive, bottleneck and ranked suggestions; each change is one of the search
    space's (parameter, value) pairs, so a constrained answer names only allowed moves."""
    changes = [_obj({"param": {"const": PAPER_NAMES.get(f, f)}, "to": {"enum": list(domain)}})
               for f, domain in space.tunables.items()]
    suggestion = _obj({"changes": {"type": "array", "minItems": 1, "maxItems": 2, "items": {"anyOf": changes}},
                       "reason": _text(), "expected_effect": _text(),
                       "kind": {"enum": ["standard", "exploratory"]}})
    return _with_think({"health": {"enum": [h.value for h in HealthState]}, "directive": _text(),
                        "health_reason": _text(), "bottleneck": {"enum": [b.value for b in Bottleneck]},
                        "suggestions": {"type": "array", "items": suggestion, "minItems": 1,
                                        "maxItems": max_suggestions}}, opts)


def generation_schema(space: SearchSpace, max_proposals: int, opts: AskOptions) -> dict[str, Any]:
    """Complete configurations: every tunable with one of its allowed values."""
    config = _obj({f: {"enum": list(domain)} for f, domain in space.tunables.items()})
    fields: dict[str, Any] = {"config": config, "justification": _text(), "expected_impact": _text()}
    if opts.confidence:
        fields["confidence"] = {"type": "integer", "minimum": 0, "maximum": 100}
    return _with_think({"proposals": {"type": "array", "items": _obj(fields), "minItems": 1,
                                      "maxItems": max_proposals}}, opts)


def failure_schema(space: SearchSpace, opts: AskOptions) -> dict[str, Any]:
    """The paper's one line, its parts, and the log line that proves it (quoted verbatim)."""
    fields: dict[str, Any] = {
        "summary": _text(), "category": {"enum": [c.value for c in FailureCategory]},
        "params": {"type": "array", "maxItems": 2, "items": {"enum": [PAPER_NAMES.get(f, f) for f in space.tunables]}},
        "evidence": _text()}
    if opts.confidence:
        fields["confidence"] = {"type": "integer", "minimum": 0, "maximum": 100}
    fields["retry"] = {"type": "boolean"}
    return _with_think(fields, opts)


# -- output instructions in the prompts ---------------------------------------------------------

def _think_json(opts: AskOptions, what: str = "your step-by-step reasoning") -> str:
    return f'"think": "<{what}, under 250 words>", ' if opts.cot else ""


def _think_text(opts: AskOptions, what: str = "your step-by-step reasoning") -> str:
    return f"<think>{what}, under 250 words</think>\n" if opts.cot else ""


def analysis_format(opts: AskOptions, json_mode: bool) -> str:
    if json_mode:
        return ('Answer with one JSON object, nothing else:\n{' + _think_json(opts) +
                '"health": "<SEVERELY_UNDERUTILIZED | HIGH_PP_OVERHEAD | MEMORY_BOUND | PERFORMANCE_TUNE>", '
                '"directive": "<what the health state asks for, e.g. reduce parallelism>", '
                '"health_reason": "<the numbers that decide it>", '
                '"bottleneck": "<compute | memory-capacity | communication | pipeline-bubble>", '
                '"suggestions": [{"changes": [{"param": "<PARAM>", "to": <new value>}], '
                '"reason": "<why, with numbers>", "expected_effect": "<effect on MFU and memory>", '
                '"kind": "<standard | exploratory>"}]}\n'
                'Suggestions best first; each is the paper\'s "Change <PARAM> from <A> to <B>." written as '
                'changes; parameters by the names of the search space.'
                + (' The reasoning you would write inside <think> goes in "think".' if opts.cot else ''))
    return ('Answer in exactly this form, nothing else:\n' + _think_text(opts) +
            'HEALTH: <SEVERELY_UNDERUTILIZED | HIGH_PP_OVERHEAD | MEMORY_BOUND | PERFORMANCE_TUNE>\n'
            'DIRECTIVE: <what the health state asks for, e.g. reduce parallelism>\n'
            'HEALTH_REASON: <the numbers that decide it>\n'
            'BOTTLENECK: <compute | memory-capacity | communication | pipeline-bubble>\n'
            'SUGGESTIONS:\n'
            '1. Change <PARAM> from <A> to <B>. Reason: <why, with numbers>. Expected: <effect on MFU and '
            'memory>. Kind: <standard | exploratory>\n'
            '2. Change <PARAM> from <A> to <B> and <PARAM> from <C> to <D>. Reason: ... Expected: ... Kind: ...')


def generation_format(opts: AskOptions, json_mode: bool, space: SearchSpace, reference: Strategy) -> str:
    confidence = ', "confidence": <0-100>' if opts.confidence else ""
    if json_mode:
        example = ", ".join(f'"{f}": {_json_value(getattr(reference, f))}' for f in space.tunables)
        return ('Answer with one JSON object, nothing else:\n{' + _think_json(opts, "your reasoning") +
                '"proposals": [{"config": {' + example + '}, "justification": "<what changed and why>", '
                '"expected_impact": "<effect on MFU and memory>"' + confidence + '}]}\n'
                'Each config lists every tunable parameter (the example shows the current values); best proposal '
                'first.' + (' The reasoning you would write inside <think> goes in "think".' if opts.cot else ''))
    return ('Answer in exactly this form, nothing else:\n' + _think_text(opts, "your reasoning") +
            'PROPOSAL 1\n'
            '<PARAM>: <value>   (one line for every tunable parameter of the search space)\n'
            'JUSTIFICATION: <what changed and why>\n'
            'EXPECTED_IMPACT: <effect on MFU and memory>\n'
            + ('(Confidence: <0-100>)\n' if opts.confidence else '') +
            'PROPOSAL 2\n...')


def failure_format(opts: AskOptions, json_mode: bool) -> str:
    if json_mode:
        return ('Answer with one JSON object, nothing else:\n{' + _think_json(opts, "your reasoning") +
                '"summary": "<the one line, in the form above>", '
                '"category": "<oom | invalid_config | comm_timeout | hang | infrastructure | not_measured | '
                'unknown>", "params": ["<PARAM>", ...], '
                '"evidence": "<the log line that shows the error, copied exactly>", '
                + ('"confidence": <0-100>, ' if opts.confidence else '') +
                '"retry": <true only for "No parameter issue. RETRY">}'
                + ('\nThe reasoning you would write inside <think> goes in "think".' if opts.cot else ''))
    return ((_think_text(opts, "your reasoning") if opts.cot else "") +
            "Answer with the one line, then a line EVIDENCE: <the log line that shows the error, copied "
            "exactly>, nothing else.")


def failure_forms(opts: AskOptions) -> str:
    """The paper's fixed forms, with or without the confidence."""
    c = " (Confidence: X)" if opts.confidence else ""
    lines = [f'- Parameter-related: "<PARAMS> <VALUES> caused <ERROR>{c}", for example '
             f'"MICRO_BATCH_SIZE 4 caused CUDA OutOfMemoryError{" (Confidence: 92)" if opts.confidence else ""}".',
             f'- No parameter responsible: "<ERROR>. No parameter issue. RETRY{c}".']
    if opts.confidence:
        lines.append('- Below confidence 50: "Potential underlying issue: <ERROR> (Confidence: X)".')
    else:
        lines.append('- When unsure: "Potential underlying issue: <ERROR>".')
    return "\n".join(lines)


def _json_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)

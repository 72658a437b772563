"""Failure analysis, offline: read the first error of the log, name its category, the
parameters most likely responsible and a confidence, in the paper's fixed form:

    "<PARAMS> <VALUES> caused <ERROR> (Confidence: X)"
    "<ERROR>. No parameter issue. RETRY (Confidence: X)"        (infrastructure only)
    "Potential underlying issue: <ERROR> (Confidence: X)"       (low confidence)
"""

from __future__ import annotations

import re

from optico.agent_contracts import FailureInput
from optico.knobs import BY_NAME, KNOBS, recompute_level
from optico.redact import clip
from optico.strategy import PAPER_NAMES, Strategy, display_value
from optico.logscan import first_error
from optico.trial import Failure, FailureCategory
from optico.workload import Workload

# Words in Megatron's assertion messages -> the parameter they are about.
_KEYWORDS = [
    (re.compile(r"virtual|interleaved|p2p", re.I), "virtual_pipeline_model_parallel_size"),
    (re.compile(r"tensor[- _]model[- _]parallel|num_attention_heads|query.groups|\bTP\b", re.I),
     "tensor_model_parallel_size"),
    (re.compile(r"pipeline[- _]model[- _]parallel|num.layers|\bPP\b", re.I), "pipeline_model_parallel_size"),
    (re.compile(r"context[- _]parallel|seq.length|\bCP\b", re.I), "context_parallel_size"),
    (re.compile(r"expert|num.experts|\bEP\b", re.I), "expert_model_parallel_size"),
    (re.compile(r"micro.batch|global.batch", re.I), "micro_batch_size"),
    (re.compile(r"sequence.parallel", re.I), "sequence_parallel"),
    (re.compile(r"param.gather|distributed.optimizer", re.I), "overlap_param_gather"),
    (re.compile(r"recompute", re.I), "recompute_granularity"),
]

# A knob's field or flag quoted in the message ("tp_comm_overlap needs ...", "--overlap-param-gather").
_NAMED = [(re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(n) for n in (k.name, *k.flags)) + r")(?![\w-])"), k.name)
          for k in KNOBS]


def _blamed(text: str) -> list[str]:
    """The parameters an invalid-configuration message is about: knobs it names, then its keywords."""
    named = [field for pattern, field in _NAMED if pattern.search(text)]
    return list(dict.fromkeys(named + [field for pattern, field in _KEYWORDS if pattern.search(text)]))[:2]


def _oom_params(s: Strategy, ref: Strategy | None, w: Workload) -> list[str]:
    """The knobs that put this configuration over the limit, changed ones first."""
    changed = set(ref.diff(s)) if ref else set()
    ranked: list[str] = []
    if s.mbs > 1 and (not ref or s.mbs > ref.mbs or "micro_batch_size" not in changed):
        ranked.append("micro_batch_size")
    if ref and recompute_level(s) < recompute_level(ref):
        ranked.append("recompute_granularity")
    for field in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        if ref and getattr(s, field) < getattr(ref, field):
            ranked.append(field)
    if ref and ref.use_distributed_optimizer and not s.use_distributed_optimizer:
        ranked.append("use_distributed_optimizer")
    if ref and ref.sequence_parallel and not s.sequence_parallel:
        ranked.append("sequence_parallel")
    fusion = BY_NAME["cross_entropy_loss_fusion"].memory_order
    if ref and fusion(s, w) < fusion(ref, w):  # megatron-core's native fused loss holds a float32 copy more
        ranked.append("cross_entropy_loss_fusion")
    if not ranked:
        ranked = ["micro_batch_size"] if s.mbs > 1 else (
            ["recompute_granularity"] if s.recompute == "none" else ["tensor_model_parallel_size"])
    # Changed parameters explain a new failure best.
    return sorted(dict.fromkeys(ranked), key=lambda f: f not in changed)[:2]


def _params_text(s: Strategy, params: list[str]) -> str:
    return ", ".join(f"{PAPER_NAMES.get(p, p)} {display_value(p, getattr(s, p))}" for p in params)


def _clip_chars(text: str, limit: int = 80) -> str:
    """`text` cut to about `limit` characters at a space (a word cut in half reads as another word)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    return (head.rsplit(" ", 1)[0] if " " in head else head) + " ..."


def _clip_words(text: str, limit: int = 30) -> str:
    words = text.split()
    return text if len(words) <= limit else " ".join(words[:limit]) + " ..."


class RulesFailureAnalysis:
    """The offline failure-analysis reasoner."""

    name = "rules"

    def diagnose(self, inp: FailureInput) -> Failure:
        category, name, line = first_error(inp.log)
        hint = inp.category_hint
        if hint in (FailureCategory.HANG, FailureCategory.NOT_MEASURED) or (hint and category is None):
            category = hint
            name = {FailureCategory.HANG: "no progress (hang)",
                    FailureCategory.NOT_MEASURED: "configuration not measured"}.get(hint, hint.value)
        s, excerpt = inp.strategy, line or clip(inp.log.strip(), 300, tail=True)
        if category == FailureCategory.OOM:
            params = _oom_params(s, inp.reference, inp.workload)
            confidence = 92 if (inp.predicted_mem_fraction or 0) >= 0.85 or inp.reference else 75
            summary = f"{_params_text(s, params)} caused {name} (Confidence: {confidence})"
            return Failure(category=category, summary=_clip_words(summary), params=params,
                           confidence=confidence, retry=False, log_excerpt=excerpt)
        if category == FailureCategory.INVALID_CONFIG:
            params = _blamed(line or inp.log) or list((inp.reference.diff(s) if inp.reference else {}).keys())[:2]
            summary = (f"{_params_text(s, params) or 'The configuration'} caused {name}: {_clip_chars(line)} "
                       f"(Confidence: 90)")
            return Failure(category=category, summary=_clip_words(summary), params=params, confidence=90,
                           retry=False, log_excerpt=excerpt)
        if category in (FailureCategory.INFRASTRUCTURE, FailureCategory.HANG, FailureCategory.COMM_TIMEOUT):
            if inp.attempts <= 1:
                # A first timeout or fault on a valid configuration: the paper's RETRY, once.
                confidence = 70 if category == FailureCategory.INFRASTRUCTURE else 55
                summary = f"{name}. No parameter issue. RETRY (Confidence: {confidence})"
                return Failure(category=category, summary=summary, params=[], confidence=confidence,
                               retry=True, log_excerpt=excerpt)
            # Repeated on the same configuration: a deadlock or starvation the layout causes.
            params = [p for p in ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size",
                                  "context_parallel_size", "expert_model_parallel_size")
                      if getattr(s, p) not in (None, 1)][:2]
            summary = (f"{_params_text(s, params)} caused repeated {name} (Confidence: 60)" if params else
                       f"Potential underlying issue: repeated {name} (Confidence: 40)")
            return Failure(category=category, summary=_clip_words(summary), params=params,
                           confidence=60 if params else 40, retry=False, log_excerpt=excerpt)
        if category == FailureCategory.NOT_MEASURED:
            return Failure(category=category, summary="Configuration not measured by the replay table. "
                                                      "No parameter issue (Confidence: 100)",
                           params=[], confidence=100, retry=False, log_excerpt=excerpt)
        summary = f"Potential underlying issue: {_clip_words(line or 'unrecognised failure', 20)} (Confidence: 30)"
        return Failure(category=FailureCategory.UNKNOWN, summary=summary, params=[], confidence=30, retry=False,
                       log_excerpt=excerpt)


class NoFailureAnalysis:
    """The ablation without failure analysis: a failed run is recorded with what the launcher
    said, undiagnosed — no parameters blamed, no RETRY."""

    name = "ablated"

    def diagnose(self, inp: FailureInput) -> Failure:
        category = inp.category_hint or FailureCategory.UNKNOWN
        return Failure(category=category, summary="Run failed; not diagnosed (ablation without failure analysis)",
                       params=[], confidence=0, retry=False, log_excerpt=clip(inp.log.strip(), 300, tail=True))

"""A model's answer, validated into the agents' typed contracts — or an `AnswerError`
whose message is quoted back to the model in the one re-ask.

What is checked here is what the answer *means*: parameter names (Strategy fields or the
paper's names), values inside the job's search space, a complete configuration the
Strategy model accepts, a confidence in 0..100, a RETRY only where the log shows no
parameter-related error. Whether a configuration may run (divisibility, duplicates,
known failures, predicted OOM) stays the guard's decision.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from optico.agent_contracts import Change, HealthState, Suggestion
from optico.repair import apply_changes, repair
from optico.llm.parsing import (
    change_items,
    coerce_value,
    kv_blocks,
    parse_changes,
    parse_confidence,
    parse_kv,
    without_trailing_confidence,
)
from optico.llm.untrusted import clean, first_error_index, looks_like_instruction, withhold_instructions
from optico.perfmodel.bottleneck import Bottleneck
from optico.search_space import SearchSpace
from optico.strategy import PAPER_NAMES, Strategy, canonical_field, display_value
from optico.trial import Failure, FailureCategory

SUMMARY_WORDS = 30  # the paper's limit on a failure diagnosis
_META = {"justification", "rationale", "reason", "expected_impact", "expected", "impact", "confidence", "_text",
         "rank", "config", "configuration"}


class AnswerError(ValueError):
    """The answer cannot be used; the message says why, for the model to correct."""


def paper(field: str) -> str:
    return PAPER_NAMES.get(field, field)


# -- values ------------------------------------------------------------------------------------

def _field(name: Any, space: SearchSpace, errors: list[str], where: str) -> str | None:
    try:
        field = canonical_field(str(name).strip().replace(" ", "_"))
    except KeyError:
        errors.append(f"{where}: unknown parameter {name!r}; tunable here: "
                      f"{', '.join(paper(f) for f in space.tunables)}")
        return None
    return field


_ABSENT = object()


def _tunable_value(field: str, raw: Any, space: SearchSpace, errors: list[str], where: str) -> tuple[bool, Any]:
    """(ok, value): `raw` coerced for `field` and checked against its domain."""
    if field not in space.tunables:
        fixed = space.fixed.get(field, Strategy.model_fields[field].default)
        errors.append(f"{where}: {paper(field)} is fixed at {display_value(field, fixed)} in this job")
        return False, None
    value = coerce_value(field, raw)
    domain = [coerce_value(field, v) for v in space.tunables[field]]
    # By type as well as value: in Python True == 1 and 2.0 == 2, and a spec refuses both (a JSON
    # schema the server may not enforce says the same).
    found = next((v for v in domain if type(v) is type(value) and v == value), _ABSENT)
    if found is _ABSENT:
        shown = display_value(field, value) if isinstance(value, (str, int, float, bool, type(None))) \
            else f"{type(value).__name__} {str(value)[:40]}"
        errors.append(f"{where}: {paper(field)}={shown} is outside the search space "
                      f"(allowed: {', '.join(display_value(field, v) for v in domain)})")
        return False, None
    return True, found


def _listed(raw: Any, name: str, errors: list[str]) -> list[Any]:
    """A field the answer must give as a list: absent is empty; anything else (a number, an object) is
    an error for the re-ask, not a TypeError that would skip it."""
    if raw is None or isinstance(raw, list):
        return raw or []
    errors.append(f"{name} must be a list, got {type(raw).__name__} {str(raw)[:60]!r}")
    return []


def _fail(errors: list[str]) -> None:
    if errors:
        more = f" (and {len(errors) - 6} more)" if len(errors) > 6 else ""
        raise AnswerError("; ".join(errors[:6]) + more)


# -- analysis ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AnalysisAnswer:
    health: HealthState
    health_reason: str
    bottleneck: Bottleneck | None
    suggestions: list[Suggestion]
    directive: str = ""


def _enum(cls: type, raw: Any) -> Any | None:
    if raw is None:
        return None
    key = str(raw).strip().strip("*`'\"").rstrip(".")
    for member in cls:
        if key.lower() in (member.value.lower(), member.name.lower()) or \
                key.lower().replace(" ", "_").replace("-", "_") == member.name.lower():
            return member
    return None


def analysis_answer(data: dict[str, Any] | None, text: str, *, space: SearchSpace, reference: Strategy,
                    limit: int) -> AnalysisAnswer:
    """Health, bottleneck and ranked suggestions from a JSON object or the paper's text form."""
    errors: list[str] = []
    raw_items: list[dict[str, Any]] = []
    if data is not None:
        health_raw, reason, bottleneck_raw = data.get("health"), data.get("health_reason", ""), data.get("bottleneck")
        directive = data.get("directive", "")
        for item in _listed(data.get("suggestions"), "suggestions", errors):
            if not isinstance(item, dict):
                errors.append(f"suggestion {item!r} is not an object")
                continue
            changes = item.get("changes")
            if isinstance(item.get("change"), str) and not changes:
                changes = [{"param": n, "from": a, "to": b} for n, a, b in parse_changes(item["change"])]
            raw_items.append({"changes": changes or [], "reason": item.get("reason", ""),
                              "expected_effect": item.get("expected_effect", item.get("expected", "")),
                              "kind": item.get("kind", "standard")})
    else:
        kv = parse_kv(text)
        health_raw, reason, bottleneck_raw = kv.get("health"), kv.get("health_reason", ""), kv.get("bottleneck")
        directive = kv.get("directive", "")
        for item in change_items(text):
            raw_items.append({"changes": [{"param": n, "from": a, "to": b} for n, a, b in item.changes],
                              "reason": item.fields.get("reason") or item.fields.get("why", ""),
                              "expected_effect": item.fields.get("expected") or item.fields.get("expected_effect")
                              or item.fields.get("expected_impact") or item.fields.get("impact", ""),
                              "kind": item.fields.get("kind", "standard")})
    health = _enum(HealthState, health_raw)
    if health is None:
        errors.append(f"health {health_raw!r} is not one of {', '.join(h.value for h in HealthState)}")
    bottleneck = _enum(Bottleneck, bottleneck_raw)
    if not raw_items:
        errors.append('no suggestion found; give ranked "Change X from A to B." suggestions')
    suggestions: list[Suggestion] = []
    seen: set[str] = set()
    for rank, item in enumerate(raw_items[:limit], start=1):
        where = f"suggestion {rank}"
        changes: dict[str, Any] = {}
        for ch in item["changes"]:
            if not isinstance(ch, dict) or "param" not in ch or "to" not in ch:
                errors.append(f"{where}: a change needs param and to, got {ch!r}")
                continue
            field = _field(ch["param"], space, errors, where)
            if field is None:
                continue
            ok, value = _tunable_value(field, ch["to"], space, errors, where)
            if ok and value != getattr(reference.normalized(), field):
                changes[field] = value
        if not changes:
            if not any(e.startswith(where) for e in errors):
                errors.append(f"{where}: changes nothing against the current configuration")
            continue
        try:
            target = apply_changes(reference, changes, space)
        except ValueError as exc:
            errors.append(f"{where}: not a valid configuration ({str(exc).splitlines()[0]})")
            continue
        if target.signature() in seen:
            continue
        seen.add(target.signature())
        kind = "exploratory" if str(item["kind"]).strip().lower().startswith("explor") else "standard"
        suggestions.append(Suggestion(
            changes=[Change(param=f, old=getattr(reference, f), new=v) for f, v in changes.items()],
            reason=str(item["reason"])[:400], expected_effect=str(item["expected_effect"])[:200], kind=kind))
    _fail(errors)
    return AnalysisAnswer(health=health, health_reason=clean(str(reason))[:300], bottleneck=bottleneck,
                          suggestions=suggestions, directive=clean(str(directive))[:160])


# -- generation --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProposalAnswer:
    strategy: Strategy
    justification: str
    expected_impact: str
    confidence: int


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")


def _confidence(raw: Any, errors: list[str], where: str, default: int = 50) -> int:
    """A confidence of 0..100 from what a model writes: 85, "85", "85%", "85/100", 90.7; a fraction
    strictly between 0 and 1 (0.85) is read as a share. The whole first number counts: "1e2" was read
    as 1 and "90.7" as 90."""
    if raw is None or raw == "":
        return default
    m = None if isinstance(raw, bool) else _NUMBER.search(str(raw)[:100])
    value = float(m.group()) if m else float("nan")
    if 0 < value < 1 and "." in m.group():
        value *= 100
    if not 0 <= value <= 100:  # NaN fails this too
        errors.append(f"{where}: confidence {str(raw)[:40]!r} is not a number in 0..100")
        return default
    return round(value)


def generation_answer(data: dict[str, Any] | None, text: str, *, space: SearchSpace, reference: Strategy,
                      limit: int) -> list[ProposalAnswer]:
    """Ranked complete configurations from {"proposals": [{"config": ...}]} or PROPOSAL blocks of
    "KEY: value" lines. Parameters left out keep the current configuration's value."""
    errors: list[str] = []
    raw: list[tuple[dict[str, Any], str, str, Any]] = []
    if data is not None:
        items = data.get("proposals")
        if items is None and isinstance(data.get("config"), dict):
            items = [data]
        for item in _listed(items, "proposals", errors):
            if not isinstance(item, dict) or not isinstance(item.get("config", item.get("configuration")), dict):
                errors.append(f"a proposal needs a config object, got {str(item)[:80]!r}")
                continue
            raw.append((item.get("config", item.get("configuration")),
                        str(item.get("justification", item.get("rationale", ""))),
                        str(item.get("expected_impact", "")), item.get("confidence")))
    else:
        for block in kv_blocks(text):
            config = {k: v for k, v in block.items() if k not in _META}
            conf = block.get("confidence") or parse_confidence(block["_text"])
            raw.append((config, block.get("justification", block.get("rationale", block.get("reason", ""))),
                        block.get("expected_impact", block.get("expected", block.get("impact", ""))), conf))
    if not raw:
        errors.append("no proposal found; give the complete parameter block of each proposal")
    out: list[ProposalAnswer] = []
    seen: set[str] = set()
    for rank, (config, why, impact, conf) in enumerate(raw[:limit], start=1):
        where = f"proposal {rank}"
        n_before = len(errors)
        values: dict[str, Any] = {}
        for name, value in config.items():
            field = _field(name, space, errors, where)
            if field is None:
                continue
            if field in space.tunables:
                ok, v = _tunable_value(field, value, space, errors, where)
                if ok:
                    values[field] = v
            else:
                expected = getattr(reference, field)
                if coerce_value(field, value) != expected:
                    errors.append(f"{where}: {paper(field)} is fixed at {display_value(field, expected)} "
                                  f"in this job")
        confidence = _confidence(conf, errors, where)
        if len(errors) > n_before:
            continue
        try:
            strategy = repair(reference.changed(**values), space)
        except ValueError as exc:
            errors.append(f"{where}: not a valid configuration ({str(exc).splitlines()[0]})")
            continue
        outside = space.outside(strategy)
        if outside:
            errors.append(f"{where}: {outside[0]}")
            continue
        if strategy.signature() in seen:
            continue
        seen.add(strategy.signature())
        out.append(ProposalAnswer(strategy=strategy, justification=clean(why).strip()[:400],
                                  expected_impact=clean(impact).strip()[:200], confidence=confidence))
    _fail(errors)
    return out


# -- failure -----------------------------------------------------------------------------------

_PARAM_ERRORS = (FailureCategory.OOM, FailureCategory.INVALID_CONFIG)


def clip_words(text: str, limit: int = SUMMARY_WORDS) -> str:
    words = text.split()
    return text if len(words) <= limit else " ".join(words[:limit]) + " ..."


# Failure categories the rules class as infrastructure: a RETRY of them is earned by the log itself.
INFRASTRUCTURE = (FailureCategory.INFRASTRUCTURE, FailureCategory.HANG, FailureCategory.COMM_TIMEOUT)
RETRY_CONFIDENCE = 85  # otherwise a RETRY needs at least this confidence and its evidence quoted from the log


@dataclass(frozen=True)
class FailureVerdict:
    """A validated diagnosis, and why a RETRY the model asked for was not granted (if it was not)."""

    failure: Failure
    retry_refused: str | None = None


def _evidence_refused(evidence: str, log: str) -> str | None:
    """Why `evidence` does not prove an infrastructure fault (None: it does)."""
    quote = " ".join(evidence.split())
    if len(quote) < 12:
        return "no evidence quoted from the log"
    shown, _ = withhold_instructions(clean(log))  # what the model was shown
    if quote not in " ".join(shown.split()):
        return "the evidence is not quoted verbatim from the log"
    if looks_like_instruction(quote) or re.search(r"\bRETRY\b", quote):
        return "the evidence is a line addressed to a model"
    if first_error_index([quote]) is None:
        return "the evidence is not an error line"
    return None


def earned_retry(*, detected: FailureCategory | None, confidence: int | None, evidence: str, log: str,
                 attempts: int) -> str | None:
    """None when a RETRY is earned, else why not: a configuration runs at most twice; the rules'
    reading of the log must class the failure as infrastructure, or the model must be confident
    (>= RETRY_CONFIDENCE) and quote the proving error line verbatim from the log. Nothing the model
    was told by the log can earn it: such lines are withheld from the prompt and refused as evidence."""
    if attempts >= 2:
        return f"this configuration has run {attempts} times: a configuration is retried at most once"
    if detected in INFRASTRUCTURE:
        return None
    if detected == FailureCategory.NOT_MEASURED:
        return "the replay table has no measurement of this configuration: running it again changes nothing"
    if confidence is None:
        return "no confidence given, and the rules do not class this failure as infrastructure"
    if confidence < RETRY_CONFIDENCE:
        return (f"confidence {confidence} < {RETRY_CONFIDENCE}, and the rules do not class this failure as "
                f"infrastructure")
    return _evidence_refused(evidence, log)


def failure_answer(data: dict[str, Any] | None, text: str, *, space: SearchSpace, detected: FailureCategory | None,
                   excerpt: str, log: str = "", attempts: int = 1, confidence_asked: bool = True) -> FailureVerdict:
    """The diagnosis from {"summary", "category", "params", "evidence", "confidence", "retry"} or the
    paper's one line "<PARAMS> <VALUES> caused <ERROR> (Confidence: X)" / "<ERROR>. No parameter issue.
    RETRY (Confidence: X)" (+ "EVIDENCE: <log line>"). `detected` is the category the log shows for
    certain (the rules' reading of its first error, or the launcher's): it wins over the model's, and a
    RETRY of a parameter-related error is refused (re-asked). Whether a RETRY is granted is
    `earned_retry`'s decision, not the model's."""
    errors: list[str] = []
    if data is not None:
        summary = str(data.get("summary") or "").strip()
        claimed = _enum(FailureCategory, data.get("category"))
        names = data.get("params") or []
        if isinstance(names, str):
            names = [names]
        names = _listed(names, "params", errors)
        raw_conf = data.get("confidence", parse_confidence(summary))
        evidence = str(data.get("evidence") or "")
        retry = bool(data.get("retry")) or _says_retry(summary)
    else:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        kv = parse_kv(text)
        summary = next((ln for ln in lines if re.search(r"\bcaused\b|RETRY|underlying issue", ln, re.I)),
                       lines[0] if lines else "")
        summary = re.sub(r"^(?:\**\s*(?:diagnosis|answer|summary)\s*:\**\s*)", "", summary, flags=re.I)
        claimed = _enum(FailureCategory, kv.get("category"))
        head = re.split(r"\bcaused\b", summary, maxsplit=1, flags=re.I)
        names = [m.group(1) for part in re.split(r",|\band\b", head[0]) if len(head) > 1
                 for m in [re.match(r"\s*([A-Za-z_][\w\-]*)", part)] if m]
        raw_conf = parse_confidence(summary if parse_confidence(summary) is not None else text)
        evidence = kv.get("evidence", "")
        retry = _says_retry(summary)
    category = detected or claimed or FailureCategory.UNKNOWN
    confidence: int | None = None
    if confidence_asked:
        confidence = _confidence(raw_conf, errors, "diagnosis", default=-1)
        if confidence < 0:
            errors.append('no confidence in 0..100; end the line with "(Confidence: N)"')
    if not summary:
        errors.append("empty diagnosis; answer with one line in the required form")
    params: list[str] = []
    for name in names:
        field = _field(name, space, errors, "diagnosis")
        if field and field not in params:
            params.append(field)
    if retry and detected in _PARAM_ERRORS:
        errors.append(f"the log shows a {detected.value} error, which the configuration causes: it is not "
                      f"'No parameter issue. RETRY'; name the parameters responsible")
    _fail(errors)
    # The paper's form ends with the confidence; the word limit applies to what precedes it.
    body = without_trailing_confidence(summary)
    refused = earned_retry(detected=detected, confidence=confidence, evidence=evidence, log=log,
                           attempts=attempts) if retry else None
    if retry and refused:
        body = re.sub(r"\.?\s*No parameter issue\.?\s*RETRY\.?", "", body, flags=re.I).strip(" .")
        body = f"Potential underlying issue: {body or category.value}"
    granted = retry and refused is None
    tail = f" (Confidence: {confidence})" if confidence is not None else ""
    summary = f"{clip_words(clean(body), SUMMARY_WORDS - 3)}{tail}"  # 27 + "..." + 2
    failure = Failure(category=category, summary=summary, params=[] if retry else params[:3],
                      confidence=confidence if confidence is not None else 0, retry=granted, log_excerpt=excerpt)
    return FailureVerdict(failure=failure, retry_refused=refused)


def _says_retry(summary: str) -> bool:
    return bool(re.search(r"No parameter issue", summary, re.I) and re.search(r"\bRETRY\b", summary))

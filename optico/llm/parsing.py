"""Reading a model's answer: JSON where it gave JSON, else the paper's text formats.

Tolerant by design — a reasoning block before the answer, a JSON object inside a code
fence, "Change TP from 2 to 1 and MICRO_BATCH_SIZE from 1 to 2.", "KEY: value" lines,
"(Confidence: 85)" — because open models answer in many shapes. Nothing here decides
whether an answer is *valid*; `optico.llm.answers` does, against the job's search space.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from optico.safe_yaml import MAX_DEPTH
from optico.strategy import Strategy

_JSON_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.S | re.I)
# Patterns run on untrusted text: none starts a match where an earlier start would have matched the same
# text (a name starts a word; "Confidence" is a word), so a long run of spaces or letters is read once,
# not once per start (a leading \s* made "(Confidence: N)" cubic: 2,000 spaces took minutes).
_PAIR = re.compile(r"\b([A-Za-z_][\w\-]*)\s+from\s+([^\s,;]+?)\s+to\s+([^\s,;]+?)(?=\s*(?:,|;|\band\b|\.(?:\s|$)|\)|$))",
                   re.I)
_CHANGE = re.compile(r"\bChange\s+(.*?)(?:\.(?=\s|$)|$)", re.I | re.S)
_CONFIDENCE = re.compile(r"\bConfidence\s*+[:=]?\s*+(\d{1,3})\s*+%?(?:\s*+\))?", re.I)
_TRAILING_CONFIDENCE = re.compile(_CONFIDENCE.pattern + r"\s*+\Z", re.I)
_KV = re.compile(r"^\s*(?:[-*]\s*)?\**([A-Za-z][A-Za-z0-9_ \-]{0,40}?)\**\s*[:=]\s*+(.*)")
_ITEM = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+")
# What the parsers read of an answer at most, its reasoning taken out. An agent's answer is a few
# kilobytes; the transport stops one at 16 characters per token asked for (`client.CHARS_PER_TOKEN`),
# which is megabytes when max_tokens is raised for a reasoning model.
MAX_ANSWER_CHARS = 32 * 1024
_NONE = {"none", "null", "no", "off", "-", "", "n/a", "disabled"}
_TRUE = {"true", "yes", "on", "1", "enabled"}
_FALSE = {"false", "no", "off", "0", "disabled"}


def too_long(answer: str) -> str | None:
    """Why an answer (its reasoning taken out) is too long to parse, else None."""
    if len(answer) <= MAX_ANSWER_CHARS:
        return None
    return (f"the answer has {len(answer):,} characters besides its reasoning; at most {MAX_ANSWER_CHARS:,} "
            f"are read: answer in the required form only")


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer): the <think> blocks and what remains.

    Handles a missing opening tag (some chat templates open it in the prompt) and an
    unclosed one (a reasoning model cut off by max_tokens: all reasoning, no answer)."""
    thoughts, kept, low, pos = [], [], text.lower(), 0
    while (start := low.find("<think>", pos)) >= 0 and (end := low.find("</think>", start)) >= 0:
        kept.append(text[pos:start])
        thoughts.append(text[start + len("<think>"):end].strip())
        pos = end + len("</think>")
    rest = "".join(kept) + text[pos:]
    if "</think>" in rest.lower():
        head, _, rest = re.split(r"(</think>)", rest, maxsplit=1, flags=re.I)
        thoughts.insert(0, head.strip())
    elif "<think>" in rest.lower():
        rest, _, tail = re.split(r"(<think>)", rest, maxsplit=1, flags=re.I)
        thoughts.append(tail.strip())
    return "\n\n".join(t for t in thoughts if t), rest.strip()


def shallow(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests no more than `limit` lists and objects deep (walked without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def extract_json(text: str) -> Any | None:
    """The first JSON object in `text` (whole, in a code fence, or embedded) that nests no deeper than
    untrusted input may (`MAX_DEPTH`, as a spec's YAML), else None: an answer's JSON is a few levels
    deep, the redactor and the validators walk it recursively, and a model (or a server) can nest past
    Python's recursion limit in a few kilobytes."""
    text = text.strip()
    candidates = [text] + [m.strip() for m in _JSON_FENCE.findall(text)]
    for c in candidates:
        try:
            value = json.loads(c)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than Python recurses
            continue
        if isinstance(value, dict) and shallow(value):
            return value
    decoder = json.JSONDecoder()
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                value, _ = decoder.raw_decode(text, i)
            except (ValueError, RecursionError):
                continue
            if isinstance(value, dict) and shallow(value):
                return value
    return None


def parse_confidence(text: str) -> int | None:
    """N of the last "(Confidence: N)" in `text`."""
    found = _CONFIDENCE.findall(text)
    return int(found[-1]) if found else None


def without_confidence(text: str) -> str:
    """`text` with every "(Confidence: N)" taken out."""
    kept, pos = [], 0
    for m in _CONFIDENCE.finditer(text):
        kept.append(_before_confidence(text[pos:m.start()]))
        pos = m.end()
    return ("".join(kept) + text[pos:]).strip()


def without_trailing_confidence(text: str) -> str:
    """`text` without a "(Confidence: N)" that ends it."""
    m = _TRAILING_CONFIDENCE.search(text)
    return _before_confidence(text[:m.start()]) if m else text


def _before_confidence(head: str) -> str:
    """What precedes a "Confidence: N", less the spaces and the parenthesis that open it."""
    head = head.rstrip()
    return head[:-1].rstrip() if head.endswith("(") else head


def _scalar(raw: str) -> str:
    return raw.strip().strip("'\"`*").rstrip(".,;:)")


def parse_changes(sentence: str) -> list[tuple[str, str, str]]:
    """[(name, old, new)] from "Change X from A to B, Y from C to D and Z from E to F."."""
    m = _CHANGE.search(sentence)
    body = m.group(1) if m else sentence
    return [(name, _scalar(old), _scalar(new)) for name, old, new in _PAIR.findall(body)]


@dataclass
class TextItem:
    """One numbered or bulleted item of a text answer."""

    text: str
    changes: list[tuple[str, str, str]] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)
    confidence: int | None = None


def change_items(text: str) -> list[TextItem]:
    """Items that contain a "Change ..." sentence, with their "Reason:"/"Expected:" fields."""
    items: list[list[str]] = []
    for line in text.splitlines():
        if _ITEM.match(line) or (re.match(r"^\s*Change\b", line, re.I) and (not items or items[-1])):
            items.append([_ITEM.sub("", line, count=1)])
        elif items and line.strip():
            items[-1].append(line.strip())
    out = []
    for lines in items:
        body = " ".join(lines)
        changes = parse_changes(body)
        if not changes:
            continue
        fields = {}
        for key in ("reason", "why", "expected", "expected_effect", "expected impact", "impact", "kind"):
            m = re.search(rf"\b{key}\s*:\s*(.*?)(?=\s+\b(?:reason|why|expected|expected_effect|expected impact|"
                          rf"impact|kind|confidence)\s*:|\(Confidence|$)", body, re.I)
            if m:
                fields[key.replace(" ", "_")] = m.group(1).strip()
        out.append(TextItem(text=body, changes=changes, fields=fields, confidence=parse_confidence(body)))
    return out


def parse_kv(text: str) -> dict[str, str]:
    """"KEY: value" lines as {key: value}, keys lower-cased with spaces as underscores."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _KV.match(line)
        if m and (value := m.group(2).rstrip()):
            out[m.group(1).strip().lower().replace(" ", "_").replace("-", "_")] = value
    return out


def kv_blocks(text: str, header: str = "proposal") -> list[dict[str, str]]:
    """"KEY: value" blocks, split at lines starting with `header` (else at blank lines).
    Each block also carries its raw text under "_text"."""
    parts = re.split(rf"^[ \t]*(?:#+[ \t]*)?\**{header}\b[^\n]*$", text, flags=re.I | re.M)
    if len(parts) == 1:
        parts = re.split(r"\n\s*\n", text)
    blocks = []
    for part in parts:
        kv = parse_kv(part)
        if kv:
            kv["_text"] = part.strip()
            blocks.append(kv)
    return blocks


def coerce_value(field_name: str, raw: Any) -> Any:
    """A value as the Strategy model wants it: "none" -> None, "true" -> True, "2" -> 2."""
    annotation = Strategy.model_fields[field_name].annotation
    if not isinstance(raw, str):
        if field_name == "virtual_pipeline_model_parallel_size" and raw == 1:
            return None
        return raw
    s = _scalar(raw)
    low = s.lower()
    if annotation is bool:
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        return s
    if low in _NONE and field_name not in ("moe_token_dispatcher_type",):
        return None
    if re.fullmatch(r"[+-]?\d+", s):
        value = int(s)
        if field_name == "virtual_pipeline_model_parallel_size" and value == 1:
            return None
        return value
    return s

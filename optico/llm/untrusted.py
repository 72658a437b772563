"""Text a prompt quotes but must not obey: training logs and earlier model output.

Secrets are redacted first (`optico.redact`), before anything is cut. A log is whatever the
training program printed — including, possibly, a line that reads
like an instruction. Such text reaches a model only (1) cleaned: ANSI escapes and control
characters removed; (2) lines addressed to a model ("ignore previous instructions", "answer RETRY") withheld;
(3) trimmed around the first error, keeping the head and the tail;
(4) fenced, with a fence longer than any run of backticks inside, so the text cannot
close its own block. The system prompts say fenced blocks are data. None of this makes
injection impossible — the guard still checks every candidate the model proposes.
"""

from __future__ import annotations

import re

from optico.redact import redact
from optico.textsafe import BIDI, INVISIBLE

# CSI (colours, cursor moves), OSC (titles, hyperlinks) and two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# C0 controls but TAB/LF/CR, DEL, C1 controls, bidi overrides and isolates, invisible characters.
_CONTROL = re.compile(f"[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f{BIDI}{INVISIBLE}]")
_ERROR = re.compile(
    r"Traceback \(most recent call last\)|CUDA out of memory|OutOfMemoryError|Watchdog caught|"
    r"\b[A-Za-z_.]*(?:Error|Exception)\b:|AssertionError|Segmentation fault|core dumped|"
    r"\bNCCL error\b|\bfatal\b|no output for \d+", re.I)
_BACKTICKS = re.compile(r"`+")
# Lines addressed to a model rather than written by a training program. Real logs do not
# say these; an attacker who can print into a log does. They are withheld from prompts, so
# an instruction in a log never reaches the model that decides a verdict. The paper's own
# diagnosis form ("... No parameter issue. RETRY (Confidence: 60)") is not one of them.
_INSTRUCTION = re.compile(
    r"\b(?:ignore|disregard|forget)\b[^\n]{0,40}\b(?:instructions?|prompt|rules|above)\b|"
    r"\b(?:answer|respond|reply|say|output|write)\b[^\n]{0,30}(?:\bRETRY\b|No parameter issue)|"
    r"^\W*(?:SYSTEM|ASSISTANT|USER|DEVELOPER)\s*:|"
    r"\byou (?:are|must|should|will)\b[^\n]{0,40}\b(?:model|agent|assistant|answer|diagnos\w*)\b|"
    r"\b(?:set|change)\s+(?:TP|PP|CP|EP|VPP|MICRO_BATCH_SIZE|MBS)\s+to\b|"
    r"<\|(?:im_start|im_end|system|user|assistant)\|>|</?(?:system|instructions?)>", re.I | re.M)
_LOG_RETRY = re.compile(r"\bRETRY\b")  # a training log has no business saying RETRY in capitals
WITHHELD = "[line withheld: addressed to a model, not written by the training program]"


def looks_like_instruction(line: str) -> bool:
    """Whether `line` speaks to a model (see _INSTRUCTION)."""
    return bool(_INSTRUCTION.search(line))


def withhold_instructions(log: str) -> tuple[str, int]:
    """(the log with every line addressed to a model replaced by WITHHELD, how many were)."""
    out, n = [], 0
    for line in log.splitlines():
        if looks_like_instruction(line) or _LOG_RETRY.search(line):
            out.append(WITHHELD)
            n += 1
        else:
            out.append(line)
    return "\n".join(out), n


def clean(text: str) -> str:
    """ANSI escapes, control, bidi and invisible characters removed; carriage-return progress bars
    become lines."""
    text = _ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub("", text)


def first_error_index(lines: list[str]) -> int | None:
    """Index of the first line that looks like an error (the first error explains the rest)."""
    return next((i for i, line in enumerate(lines) if _ERROR.search(line)), None)


def _assemble(lines: list[str], keep: list[int]) -> str:
    out, last = [], -1
    for i in keep:
        if i > last + 1:
            out.append(f"[... {i - last - 1} lines omitted ...]")
        out.append(lines[i])
        last = i
    if last < len(lines) - 1:
        out.append(f"[... {len(lines) - 1 - last} lines omitted ...]")
    return "\n".join(out)


def excerpt(log: str, max_chars: int = 4000, *, head: int = 8, before: int = 4, after: int = 16,
            tail: int = 16, line_chars: int = 400) -> str:
    """The log cleaned and cut to `max_chars`: its head, a window around the first error and
    its tail, each gap marked with how many lines were left out."""
    # Redacted before anything is cut: a key split by a cut would no longer be recognised.
    cleaned, _ = withhold_instructions(clean(redact(log)))
    lines = [line if len(line) <= line_chars else line[:line_chars] + " [...]" for line in cleaned.splitlines()]
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    err = first_error_index(lines)
    while True:
        keep = set(range(min(head, len(lines)))) | set(range(max(0, len(lines) - tail), len(lines)))
        if err is not None:
            keep |= set(range(max(0, err - before), min(len(lines), err + after + 1)))
        text = _assemble(lines, sorted(keep))
        if len(text) <= max_chars or head + tail + after + before <= 4:
            break
        # Shrink the tail and the head first: the first error matters most.
        head, tail, after, before = head // 2, tail // 2, max(2, after * 2 // 3), max(1, before // 2)
    if len(text) > max_chars:  # a few enormous lines: keep the start of the first error's window
        text = text[: max_chars - 20] + "\n[... truncated ...]"
    return text


def fence(text: str, label: str) -> str:
    """`text` in a fenced block labelled `untrusted-<label>` that the text cannot close."""
    longest = max((len(m.group()) for m in _BACKTICKS.finditer(text)), default=0)
    bar = "`" * max(3, longest + 1)
    return f"{bar}untrusted-{label}\n{text}\n{bar}"


def cell(text: str | None, words: int = 30) -> str:
    """One table cell of untrusted text: one line, no pipes or backticks, at most `words` words."""
    if not text:
        return ""
    flat = " ".join(clean(redact(text)).replace("|", "/").replace("`", "'").split())
    if looks_like_instruction(flat):
        return "[withheld: addressed to a model]"
    parts = flat.split(" ")
    return flat if len(parts) <= words else " ".join(parts[:words]) + " ..."

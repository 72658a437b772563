"""What the pool keeps of each model call, and the redaction that keeps secrets out of it.

The reasoners never hold the store: they are given a `Recorder` callback, which
`optico.runner.build_context` wires to `Store.add_message(job_id, iteration, agent, kind,
content, text)`. One message per call: kind `llm_call` for the first request of an agent
in an iteration, `llm_reask` for the re-ask that quotes a parse error. Its content:

    {"model", "endpoint", "mode", "messages" (the prompt), "completion" (the answer without
     its <think> block), "reasoning" (the <think> block: stored, shown only with
     `optico jobs show --reasoning`), "prompt_tokens", "completion_tokens", "tokens_reported",
     "latency_s", "attempts", "retries" [{attempt, error, wait_s}], "cost_usd", "error",
     "fallback" (true when the agent fell back to its offline reasoner after this call),
     "history" (rows and estimated tokens of the compact history view)}

Everything passes through `Redactor.scrub` before it is recorded, raised or printed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Recorder = Callable[[str, int, str, dict[str, Any], str], None]
"""record(agent, iteration, kind, content, text): stores one message in the pool."""

# Shapes of credentials worth scrubbing even when they are not the configured key
# (an endpoint that echoes a header, a URL with user:password).
_GENERIC = [
    re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-.=]{8,}"),
    re.compile(r"(?i)(api[-_]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9_\-.]{8,}"),
    re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+(?=@)"),
]
MASK = "***"


class Redactor:
    """Replaces the configured secrets, and anything shaped like a credential, with ***."""

    def __init__(self, secrets: list[str]):
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def text(self, value: str) -> str:
        for secret in self._secrets:
            value = value.replace(secret, MASK)
        for pattern in _GENERIC:
            value = pattern.sub(lambda m: (m.group(1) if m.re.groups else "") + MASK, value)
        return value

    def scrub(self, value: Any) -> Any:
        """`value` (str, list, dict, scalars) with every string redacted."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.scrub(v) for v in value]
        return value


def null_recorder(agent: str, iteration: int, kind: str, content: dict[str, Any], text: str) -> None:
    """Records nothing (a reasoner used outside a job)."""

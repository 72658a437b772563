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

from collections.abc import Callable
from typing import Any

from optico.redact import MASK, Redactor

__all__ = ["MASK", "Recorder", "Redactor", "null_recorder"]

Recorder = Callable[[str, int, str, dict[str, Any], str], None]
"""record(agent, iteration, kind, content, text): stores one message in the pool."""


def null_recorder(agent: str, iteration: int, kind: str, content: dict[str, Any], text: str) -> None:
    """Records nothing (a reasoner used outside a job)."""

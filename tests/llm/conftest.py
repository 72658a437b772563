"""Fixtures for the LLM reasoner tests: a scripted OpenAI-compatible server on 127.0.0.1 and
OPTICO_LLM_* pointing at it with short timeouts and backoff (whole jobs then run through the
real `openai` client)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Script
from llm_testkit import API_KEY, FAST


@pytest.fixture
def llm_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """configure(server, **OPTICO_LLM_* overrides): points the reasoners at `server`."""
    for var in ("OPENAI_API_KEY", "OPTICO_LLM_API_KEY", "OPTICO_LLM_PRICES", "OPTICO_LLM_STRUCTURED_OUTPUT"):
        monkeypatch.delenv(var, raising=False)

    def configure(server: FakeOpenAI, **overrides: str) -> None:
        env = {"OPTICO_LLM_BASE_URL": server.url, "OPTICO_LLM_MODEL": "fake-model", "OPTICO_LLM_API_KEY": API_KEY,
               **FAST, **{f"OPTICO_LLM_{k.upper()}": str(v) for k, v in overrides.items()}}
        for k, v in env.items():
            monkeypatch.setenv(k, v)

    return configure


@pytest.fixture
def fake_llm(llm_env: Callable[..., None]) -> Iterator[Callable[..., FakeOpenAI]]:
    """start(script=None, formats=..., **settings): a running server the reasoners talk to."""
    servers: list[FakeOpenAI] = []

    def start(script: Script | None = None, *, formats: tuple[str, ...] = ("json_schema", "json_object"),
              require_key: str | None = None, stream_usage: bool = True, format_status: int = 400,
              **settings: Any) -> FakeOpenAI:
        server = FakeOpenAI(script, formats=formats, require_key=require_key, stream_usage=stream_usage,
                            format_status=format_status).__enter__()
        servers.append(server)
        llm_env(server, **settings)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)

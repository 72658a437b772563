"""An endpoint that never finishes, answers without end or redirects elsewhere: each call ends within
its bounds with EndpointError (the agent then falls back), against real HTTP servers that misbehave."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from optico.llm.client import ChatClient, EndpointError
from optico.llm.settings import LLMSettings

CHUNK = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m"}


@contextmanager
def serve(answer: Callable[[BaseHTTPRequestHandler], None]) -> Iterator[tuple[str, list[str]]]:
    """A server whose every POST is answered by `answer`; yields (base URL, paths requested)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.path)
            try:
                answer(self)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: what it should do

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        block_on_close = False

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def _events(handler: BaseHTTPRequestHandler) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()


def keep_alive_for_ever(handler: BaseHTTPRequestHandler) -> None:
    _events(handler)
    for _ in range(120):  # SSE comments: bytes arrive, no chunk ever does
        handler.wfile.write(b": keep-alive\n\n")
        handler.wfile.flush()
        time.sleep(0.25)


def answer_without_end(handler: BaseHTTPRequestHandler) -> None:
    _events(handler)
    piece = {**CHUNK, "choices": [{"index": 0, "delta": {"content": "x" * 4096}, "finish_reason": None}]}
    for _ in range(2000):  # 8 MB of text for an answer of at most 50 tokens
        handler.wfile.write(f"data: {json.dumps(piece)}\n\n".encode())


def _client(url: str, **settings: object) -> ChatClient:
    return ChatClient(LLMSettings(**{"base_url": url, "model": "m", "timeout_s": 1.5, "max_attempts": 1, **settings}))


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_that_never_ends_is_a_timeout_within_the_attempt_s_bound(stream: bool):
    with serve(keep_alive_for_ever) as (url, _):
        start = time.monotonic()
        with pytest.raises(EndpointError, match="Timeout"):
            _client(url, stream=stream).complete([{"role": "user", "content": "hi"}], max_tokens=50)
        assert time.monotonic() - start < 6  # 1.5 s allowed; the server would go on for 30 s


def test_an_answer_past_the_tokens_asked_for_is_cut_off_not_read_to_the_end():
    with serve(answer_without_end) as (url, _):
        with pytest.raises(EndpointError, match="AnswerTooLong"):
            _client(url, timeout_s=30).complete([{"role": "user", "content": "hi"}], max_tokens=50)


def test_a_redirect_is_an_error_and_the_prompt_goes_nowhere_else():
    with serve(lambda h: (h.send_response(200), h.end_headers())) as (elsewhere, stolen):
        def redirect(handler: BaseHTTPRequestHandler) -> None:
            handler.send_response(307)
            handler.send_header("Location", f"{elsewhere}/chat/completions")
            handler.end_headers()

        with serve(redirect) as (url, asked):
            with pytest.raises(EndpointError, match="307"):
                _client(url).complete([{"role": "user", "content": "the workload and its history"}], max_tokens=50)
    assert asked and stolen == []


def test_the_bounds_hold_through_a_proxy_named_in_the_environment(monkeypatch: pytest.MonkeyPatch):
    # httpx mounts a transport of its own for a proxy: the bounds must not depend on which one runs.
    with serve(keep_alive_for_ever) as (proxy_url, asked):
        proxy = proxy_url.removesuffix("/v1")
        for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
            monkeypatch.setenv(name, proxy)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        start = time.monotonic()
        with pytest.raises(EndpointError, match="Timeout"):
            _client("http://llm.example.invalid/v1").complete([{"role": "user", "content": "hi"}], max_tokens=50)
        assert time.monotonic() - start < 6  # 1.5 s allowed; the proxy would drip for 30 s
    assert asked and asked[0].startswith("http://llm.example.invalid/")  # the request did go through it

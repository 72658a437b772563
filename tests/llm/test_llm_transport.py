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

        do_GET = do_POST

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


# -- a server that answers, but not with a Chat Completion ---------------------------------------

def _body(handler: BaseHTTPRequestHandler, data: bytes, content_type: str = "application/json",
          status: int = 200) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _sse(handler: BaseHTTPRequestHandler, *lines: str) -> None:
    _events(handler)
    for line in lines:
        handler.wfile.write(f"{line}\n\n".encode())
    handler.wfile.flush()


def _whole(payload: object) -> Callable[[BaseHTTPRequestHandler], None]:
    return lambda h: _body(h, json.dumps(payload).encode())


def _chunk(choices: object) -> str:
    return "data: " + json.dumps({**CHUNK, "choices": choices})


MALFORMED = {
    "not JSON": (lambda h: _body(h, b"{not json <html>"), False),
    "not JSON, streamed": (lambda h: _sse(h, "data: {not json", "data: [DONE]"), True),
    "choices not a list": (_whole({"id": "x", "object": "chat.completion", "choices": "abc"}), False),
    "choices not a list, streamed": (lambda h: _sse(h, "data: " + json.dumps({**CHUNK, "choices": "abc"})), True),
    "no choices": (_whole({"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": []}),
                   False),
    "a number as content": (_whole({"choices": [{"index": 0, "message": {"content": 42}, "finish_reason": "stop"}]}),
                            False),
    "a number as content, streamed": (lambda h: _sse(h, _chunk([{"index": 0, "delta": {"content": 42},
                                                                 "finish_reason": "stop"}])), True),
    "a list as the body": (_whole([1, 2, 3]), False),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_body_that_is_not_a_chat_completion_is_an_endpoint_error_not_a_crash(case: str):
    # Before: JSONDecodeError, AttributeError or TypeError escaped the client, so the call was not
    # recorded, did not count for the breaker, and `optico llm check` printed a traceback.
    answer, stream = MALFORMED[case]
    with serve(answer) as (url, asked):
        with pytest.raises(EndpointError, match="MalformedResponse"):
            _client(url, stream=stream, max_attempts=3).complete([{"role": "user", "content": "hi"}], max_tokens=50)
    assert len(asked) == 1  # it would answer the same again: not retried


def _over_the_cap(handler: BaseHTTPRequestHandler) -> None:
    """A JSON body of 40 MiB, sent as it is generated (no Content-Length)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(b'{"choices": [{"index": 0, "message": {"content": "')
    for _ in range(40):
        handler.wfile.write(b"A" * 2**20)


def _one_endless_event(handler: BaseHTTPRequestHandler) -> None:
    _events(handler)
    handler.wfile.write(b'data: {"choices": "')
    for _ in range(40):
        handler.wfile.write(b"A" * 2**20)


@pytest.mark.parametrize("answer, stream", [(_over_the_cap, False), (_one_endless_event, True)])
def test_a_response_over_the_size_cap_is_not_retried_and_says_so(answer, stream: bool):
    # Before: the cap's read error reached the client as openai's "Connection error.", a transient
    # fault, so each attempt downloaded another 32 MiB; docs/llm.md says never retried.
    with serve(answer) as (url, asked):
        with pytest.raises(EndpointError, match="32 MiB") as err:
            _client(url, stream=stream, max_attempts=3, timeout_s=30).complete(
                [{"role": "user", "content": "hi"}], max_tokens=100_000_000)
    assert len(asked) == 1 and err.value.attempts == 1


def test_an_endpoint_error_message_reaches_no_one_with_its_escape_sequences():
    # A server's error text ends up in the fallback reason: the pool, the log line on stderr, the
    # REST stream. Before: "\x1b]8;;http://evil..." (a hyperlink), colours and a window title went raw.
    message = ("bad request \x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b[31mred\x1b[0m "
               "\x1b]0;title\x07 \x9b2J")
    payload = json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()
    with serve(lambda h: _body(h, payload, status=400)) as (url, _):
        with pytest.raises(EndpointError) as err:
            _client(url).complete([{"role": "user", "content": "hi"}], max_tokens=50)
    text = str(err.value)
    assert "bad request \\x1b]8;;http://evil.example/" in text  # shown, not obeyed
    assert not any(c in text for c in "\x1b\x07\x9b")


def _answer_then(second: bytes, usage: object = None) -> Callable[[BaseHTTPRequestHandler], None]:
    """A streamed answer (with `usage` in its last chunk when given, else none), then `second` as the
    body of the next request: the one-token request that asks the server to count the prompt."""
    calls = []

    def answer(handler: BaseHTTPRequestHandler) -> None:
        calls.append(1)
        if len(calls) > 1:
            return _body(handler, second)
        lines = [_chunk([{"index": 0, "delta": {"content": "hello"}, "finish_reason": "stop"}])]
        if usage is not None:
            lines.append("data: " + json.dumps({**CHUNK, "choices": [], "usage": usage}))
        _sse(handler, *lines, "data: [DONE]")
    return answer


@pytest.mark.parametrize("second, usage", [
    (b"{bad", None),  # the count request answered with no JSON
    (json.dumps({"choices": [], "usage": {"prompt_tokens": "abc"}}).encode(), None),  # a count that is none
    (json.dumps({"choices": [], "usage": "abc"}).encode(), "abc"),  # usage a string, in the stream too
])
def test_a_bad_token_count_keeps_the_answer_and_estimates_the_tokens(second: bytes, usage: object):
    """The answer was good; the server's token count was not. Before: a JSONDecodeError, AttributeError
    or TypeError escaped the client and threw the answer away (the agent fell back to the rules)."""
    with serve(_answer_then(second, usage)) as (url, _):
        completion = _client(url, stream=True, model="gpt-4.1-mini").complete([{"role": "user", "content": "hi"}],
                                                                               max_tokens=50)
    assert completion.text == "hello" and completion.usage_source == "estimate" and completion.prompt_tokens > 0


@pytest.mark.parametrize("body", [b"{bad", json.dumps({"data": 5}).encode(), json.dumps({"data": [{"x": 1}]}).encode()])
def test_a_model_list_that_is_no_list_of_models_is_an_endpoint_error(body: bytes):
    with serve(lambda h: _body(h, body)) as (url, _):
        with pytest.raises(EndpointError, match="MalformedResponse"):
            _client(url).list_models()


# -- a streamed request answered with one body ---------------------------------------------------

WHOLE = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("answer, said", [
    (lambda h: _body(h, json.dumps({"error": {"message": "model overloaded, try later"}}).encode()),
     "model overloaded, try later"),
    (lambda h: _body(h, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"), "502 Bad Gateway"),
])
def test_a_streamed_request_answered_with_an_error_body_quotes_it_and_is_not_retried(answer, said: str):
    # Before: read as a stream with no events, 'the stream ended before the answer did (server gone?)',
    # retried three times, counted against the breaker, and the server's own message lost.
    with serve(answer) as (url, asked):
        with pytest.raises(EndpointError, match="MalformedResponse") as err:
            _client(url, stream=True, max_attempts=3).complete([{"role": "user", "content": "hi"}], max_tokens=50)
    assert said in str(err.value) and "OPTICO_LLM_STREAM=false" in str(err.value)
    assert len(asked) == 1


def test_a_server_that_ignores_stream_is_read_whole():
    with serve(_whole(WHOLE)) as (url, asked):
        completion = _client(url, stream=True).complete([{"role": "user", "content": "hi"}], max_tokens=50)
    assert completion.text == "hello" and completion.finish_reason == "stop" and not completion.streamed


@pytest.mark.parametrize("stream", [True, False])
def test_the_servers_labels_are_stored_bounded(stream: bool):
    # An 8 MB `model` (and a 4 MB finish reason) went into every stored call: a 4-trial job left 135 MB.
    big = "\x1b[31m" + "M" * 2_000_000
    if stream:
        answer = lambda h: _sse(h, "data: " + json.dumps({**CHUNK, "model": big, "choices": [
            {"index": 0, "delta": {"content": "hello"}, "finish_reason": "s" * 1_000_000}]}), "data: [DONE]")
    else:
        answer = _whole({**WHOLE, "model": big, "choices": [{**WHOLE["choices"][0], "finish_reason": "s" * 10**6}]})
    with serve(answer) as (url, _):
        completion = _client(url, stream=stream, timeout_s=30).complete([{"role": "user", "content": "hi"}],
                                                                        max_tokens=50)
    assert completion.text == "hello"
    assert len(completion.model) <= 200 and len(completion.finish_reason or "") <= 200


def test_a_stream_relabelled_text_plain_by_a_proxy_is_still_read_as_a_stream():
    def relabelled(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.end_headers()
        handler.wfile.write((_chunk([{"index": 0, "delta": {"content": "hello"}, "finish_reason": "stop"}])
                             + "\n\ndata: [DONE]\n\n").encode())

    with serve(relabelled) as (url, _):
        completion = _client(url, stream=True).complete([{"role": "user", "content": "hi"}], max_tokens=50)
    assert completion.text == "hello" and completion.streamed

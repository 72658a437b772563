"""One Chat Completions call with the policies around it.

- Transport: the `openai` package (AzureOpenAI for provider=azure), its own retries off, over an
  HTTP client that bounds each response in time and size and follows no redirect
  (`optico.llm.transport`); an answer longer than the tokens asked for allow is cut off
  (`AnswerTooLong`) and not retried.
  Answers are streamed (`stream_options.include_usage`): when an attempt times out the
  stream is closed, and llama.cpp's server (llama-cpp-python checks for a disconnected
  client after every token) and vLLM stop generating, so an abandoned answer never
  delays the next call. A non-streamed answer cannot be abandoned that way: the server
  finishes it while the retry waits in its queue.
- Usage: from the stream where the server sends it; a server that sends none in streams
  (llama-cpp-python) is asked once more, without streaming, for one token of the same
  prompt — it has the prompt cached, so this costs one token — and its `usage` gives the
  prompt tokens; the completion tokens are the streamed token chunks.
- Retries (tenacity): 429, 408/409, 5xx, timeouts, dropped connections and streams cut
  short, with exponential backoff and full jitter, honouring the server's Retry-After (or
  retry-after-ms), up to `max_attempts`; any other error fails at once. Then
  `EndpointError`, and the agent falls back to its offline reasoner.
- Structured output, negotiated once per endpoint and model (for the whole process): a
  JSON schema first; an endpoint whose error names response_format (llama.cpp answers
  json_schema with HTTP 500 "Input should be 'text' or 'json_object'") is asked again at
  once, not retried, in its own schema form (`{"type": "json_object", "schema": ...}`,
  llama.cpp's grammar-constrained JSON), then in JSON mode, then in plain text.
- A circuit breaker: after `breaker_failures` calls in a row fail, the endpoint is skipped
  for `breaker_cooldown_s` (every call fails fast) so a dead endpoint does not cost each
  agent every timeout of every iteration.
- A response that is not a Chat Completion (not JSON, no choices, content that is not text) is
  `MalformedResponse`, one past the transport's size cap `AnswerTooLong`: endpoint errors, not
  retried (the server would answer the same again), never a crash of the caller.
- Secrets: error messages are redacted before they are cut or leave this module, and their control
  characters shown as visible escapes (a server's error text reaches the pool, the logs and a terminal).
"""

from __future__ import annotations

import email.utils
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import openai
from openai.types.chat import ChatCompletion
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from optico.llm.audit import Redactor
from optico.redact import known_secrets, register
from optico.llm.history import estimate_tokens
from optico.llm.settings import LLMSettings
from optico.llm.transport import ResponseTooLarge, bounded_http_client, http_library
from optico.textsafe import terminal_text

_DOWNGRADE = {"json_schema": "json_object_schema", "json_object_schema": "json_object", "json_object": "text"}
# An error that names the response format refuses the format, whatever its status code.
_NAMES_FORMAT = re.compile(r"response_format|json_schema|json_object|\bschema\b", re.I)


@dataclass
class EndpointFacts:
    """What one endpoint (base URL and model) was found to accept."""

    mode: str  # json_schema | json_object_schema | json_object | text
    stream_usage: bool | None = None  # does it send usage in streams? None: not seen yet
    notes: list[str] = field(default_factory=list)


# Negotiated once per process, not per job: a benchmark runs hundreds of jobs against one server.
_FACTS: dict[tuple[str, str], EndpointFacts] = {}
_FACTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Completion:
    """A model's answer and what it cost."""

    text: str
    reasoning: str
    model: str
    mode: str = "text"  # json_schema | json_object | text: how the answer was requested
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_reported: bool = True  # False: the endpoint sent no usage; the counts are estimates
    latency_s: float = 0.0  # wall time of the call, retries and backoff included
    attempts: int = 1
    retries: list[dict[str, Any]] = field(default_factory=list)
    cost_usd: float | None = None
    finish_reason: str | None = None
    notes: list[str] = field(default_factory=list)  # structured-output downgrades
    usage_source: str = "response"  # response | stream | probe (prompt from a 1-token request) | estimate
    streamed: bool = False


class EndpointError(RuntimeError):
    """The endpoint gave no usable answer within the allowed attempts (or was skipped)."""

    def __init__(self, message: str, *, attempts: int, latency_s: float,
                 retries: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.attempts, self.latency_s, self.retries = attempts, latency_s, retries or []


# Characters of an answer (content and reasoning) per completion token asked for: a token is about
# four characters; 16 leaves room for any tokenizer. A server that ignores max_tokens is cut there.
CHARS_PER_TOKEN = 16


class AnswerTooLong(openai.OpenAIError):
    """The endpoint answered past the tokens asked for: not retried (it would again); the agent falls back."""


class MalformedResponse(openai.OpenAIError):
    """The endpoint answered with something that is not a Chat Completion: not retried (it would again)."""


def _size_cap(exc: BaseException) -> BaseException | None:
    """The transport's size-cap error behind `exc` (openai wraps it as a dropped connection), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ResponseTooLarge):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


@contextmanager
def _reading_response() -> Iterator[None]:
    """Errors of reading a response that are the response's fault, as endpoint errors that are not retried:
    `openai` hands a body that is not JSON, or not shaped like a Chat Completion, to the caller as a
    JSONDecodeError, an AttributeError or a TypeError."""
    try:
        yield
    except openai.APIConnectionError as exc:
        cap = _size_cap(exc)
        if cap is None:
            raise
        raise AnswerTooLong(str(cap)) from None
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        raise MalformedResponse(f"the response is not a Chat Completion ({type(exc).__name__}: {exc})") from None


# A server's own labels (the model it says answered, the finish reason) are stored with every call:
# an 8 MB `model` made every stored message 8 MB.
MAX_LABEL_CHARS = 200


def _label(value: object) -> str | None:
    """A label the server sent, cut to MAX_LABEL_CHARS; None when it is no text."""
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) and value else None


def _server_said(body: object) -> str:
    """What an answer that is no Chat Completion says, for the error: its `error.message` (a 200 carrying
    an error object), else the start of its text. Redacted and escaped where the error is described."""
    if isinstance(body, (bytes, bytearray)):
        text = bytes(body[:4096]).decode("utf-8", "replace")
        try:
            body = json.loads(body)
        except ValueError:
            return " ".join(text.split())[:200]
    extra = getattr(body, "model_extra", None)
    error = body.get("error") if isinstance(body, dict) else (extra or {}).get("error")
    if isinstance(error, dict):
        error = error.get("message") or error
    if error:
        return " ".join(str(error).split())[:200]
    return " ".join(str(body).split())[:200]


def _token_count(value: object) -> int | None:
    """A token count a server reported, or None when what it sent is none (a string, a negative, a bool)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**12:
        return value
    return None


def refuses_format(exc: BaseException) -> bool:
    """An error about the response format (a downgrade, not a transient fault)."""
    if not isinstance(exc, openai.APIStatusError) or exc.status_code in (408, 409, 429):
        return False
    body = getattr(exc, "body", None)
    return bool(_NAMES_FORMAT.search(f"{getattr(exc, 'message', '')} {body!r}"))


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: rate limits, server errors, timeouts, dropped connections."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError and cut streams
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def retry_after_s(exc: BaseException | None) -> float | None:
    """The wait the server asked for (retry-after-ms, or Retry-After in seconds or as a date)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _describe(exc: BaseException, redactor: Redactor) -> str:
    """One line naming the error; redacted before it is cut, so a key cannot survive half-masked."""
    status = getattr(exc, "status_code", None)
    message = redactor.text(" ".join(str(getattr(exc, "message", None) or exc).split()))
    # The server wrote it, and it goes to the pool, the log and terminals: escapes shown, not obeyed.
    message = terminal_text(message, one_line=True, max_chars=None)
    return f"{type(exc).__name__}{f' {status}' if status else ''}: {message[:300]}"


@dataclass
class _Answer:
    text: str
    reasoning: str
    model: str | None
    finish_reason: str | None
    usage: Any  # the server's usage object, or None
    chunks: int = 0  # streamed content chunks (llama.cpp sends one per token)
    streamed: bool = False


class ChatClient:
    """Chat Completions against one configured endpoint; see the module docstring."""

    def __init__(self, settings: LLMSettings, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.model = settings.require_model()
        register(*settings.secrets())
        self.redactor = Redactor([*settings.secrets(), *known_secrets()])
        self._sleep, self._clock = sleep, clock
        self.facts = self._facts()
        self._first_call = True
        self._failures_in_row = 0
        self._open_until: float | None = None
        self._last_error = ""
        self._client = self._build()

    def _facts(self) -> EndpointFacts:
        s = self.settings
        if s.structured_output != "auto":
            return EndpointFacts(mode=s.structured_output)
        with _FACTS_LOCK:
            return _FACTS.setdefault((s.endpoint_label(), self.model), EndpointFacts(mode="json_schema"))

    def _build(self) -> openai.OpenAI:
        s = self.settings
        key = s.api_key.get_secret_value() if s.api_key else None
        if s.provider == "azure":
            if not key:
                raise ValueError("OPTICO_LLM_API_KEY (or OPENAI_API_KEY) is not set: Azure OpenAI needs the "
                                 "resource's key")
            return openai.AzureOpenAI(azure_endpoint=s.base_url, api_version=s.api_version, api_key=key,
                                      timeout=s.timeout_s, max_retries=0, http_client=bounded_http_client(s.timeout_s))
        if not key and not s.base_url:
            raise ValueError("OPTICO_LLM_API_KEY (or OPENAI_API_KEY) is not set: api.openai.com needs a key; "
                             "for a local server set OPTICO_LLM_BASE_URL")
        # Local servers (vLLM, SGLang, Ollama, llama.cpp) ignore the key, but the client needs one.
        return openai.OpenAI(base_url=s.base_url, api_key=key or "no-key", timeout=s.timeout_s, max_retries=0,
                             http_client=bounded_http_client(s.timeout_s))

    @property
    def mode(self) -> str:
        """How the next structured request will ask for JSON: json_schema, json_object_schema, json_object
        or text."""
        return self.facts.mode

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint_label()

    # -- one attempt ---------------------------------------------------------------------------
    def _kwargs(self, mode: str, schema: dict[str, Any] | None, name: str, max_tokens: int) -> dict[str, Any]:
        s = self.settings
        kwargs: dict[str, Any] = {}
        if mode == "json_schema":
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": name, "schema": schema, "strict": False}}
        elif mode == "json_object_schema":  # llama.cpp's own form: a grammar built from the schema
            kwargs["response_format"] = {"type": "json_object", "schema": schema}
        elif mode == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        if s.temperature is not None:
            kwargs["temperature"] = s.temperature
        # OpenAI's and Azure's newer models refuse max_tokens; the local servers know max_tokens.
        limit_key = "max_completion_tokens" if s.provider == "azure" or not s.base_url else "max_tokens"
        kwargs[limit_key] = max_tokens
        return kwargs

    def _request(self, messages: list[dict[str, str]], schema: dict[str, Any] | None, name: str,
                 notes: list[str], max_tokens: int, extra: dict[str, Any] | None = None) -> tuple[str, _Answer]:
        s = self.settings
        while True:
            mode = self.facts.mode if schema is not None else "text"
            kwargs = self._kwargs(mode, schema, name, max_tokens)
            if extra:
                kwargs["extra_body"] = extra
            max_chars = max_tokens * CHARS_PER_TOKEN
            try:
                with _reading_response():
                    if s.stream:
                        return mode, self._streamed(messages, kwargs, max_chars)
                    response = self._client.chat.completions.create(model=self.model, messages=messages, **kwargs)
                    return mode, self._whole(response, max_chars)
            except openai.APIStatusError as exc:
                if mode == "text" or s.structured_output != "auto" or not refuses_format(exc):
                    raise
                with _FACTS_LOCK:
                    if self.facts.mode == mode:  # another job may have downgraded it meanwhile
                        self.facts.mode = _DOWNGRADE[mode]
                        self.facts.notes.append(f"{mode} refused ({_describe(exc, self.redactor)[:200]}); "
                                                f"now {self.facts.mode}")
                notes.append(self.facts.notes[-1])

    def _streamed(self, messages: list[dict[str, str]], kwargs: dict[str, Any], max_chars: int) -> _Answer:
        deadline = self._clock() + self.settings.timeout_s
        stream = self._client.chat.completions.create(model=self.model, messages=messages, stream=True,
                                                      stream_options={"include_usage": True}, **kwargs)
        parts: list[str] = []
        thinking: list[str] = []
        model = finish = usage = None
        chunks = size = 0
        http = http_library()
        media = stream.response.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            # A whole answer, or an error page, sent with 200. Other types (text/plain, octet-stream: a
            # proxy's relabelling) are read as the stream they usually still are.
            if media.endswith("json") or media == "text/html":
                return self._unstreamed(stream.response.read(), media, max_chars)
            for chunk in stream:
                model = _label(getattr(chunk, "model", None)) or model
                usage = getattr(chunk, "usage", None) or usage
                for choice in chunk.choices or []:
                    delta = choice.delta
                    if delta is not None and delta.content:
                        parts.append(delta.content)
                        size += len(delta.content)
                        chunks += 1
                    extra = (delta.model_extra or {}) if delta is not None else {}
                    thought = extra.get("reasoning_content") or extra.get("reasoning")
                    if thought:
                        thinking.append(str(thought))
                        size += len(str(thought))
                    finish = _label(choice.finish_reason) or finish
                if size > max_chars:
                    raise AnswerTooLong(f"the answer passed {max_chars:,} characters, more than the "
                                        f"{max_chars // CHARS_PER_TOKEN:,} tokens asked for allow")
                if self._clock() > deadline:
                    raise openai.APITimeoutError(request=stream.response.request)
        except http.TimeoutException:  # the transport's deadline (optico.llm.transport)
            raise openai.APITimeoutError(request=stream.response.request) from None
        except http.HTTPError as exc:  # its size cap, or the connection dropped mid-answer
            if isinstance(exc, ResponseTooLarge):
                raise AnswerTooLong(str(exc)) from None
            raise openai.APIConnectionError(message=str(exc), request=stream.response.request) from None
        finally:
            stream.close()  # closing the connection is what makes the server stop generating
        if finish is None:
            raise openai.APIConnectionError(message="the stream ended before the answer did (server gone?)",
                                            request=stream.response.request)
        return _Answer(text="".join(parts), reasoning="".join(thinking), model=model, finish_reason=finish,
                       usage=usage, chunks=chunks, streamed=True)

    def _unstreamed(self, body: bytes, media: str, max_chars: int) -> _Answer:
        """A streamed request answered with one body: a whole Chat Completion (a server that ignores
        `stream`) is read as one; anything else (an error object or an HTML error page sent with status
        200) is the endpoint's fault, quoted, and not retried. It read as a stream cut short: retried,
        counted against the breaker, and the server's message lost."""
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("choices"), list):
            return self._whole(ChatCompletion.model_validate(data), max_chars)
        raise MalformedResponse(f"the server answered a streamed request with {media[:60]}, not a stream "
                                f"(OPTICO_LLM_STREAM=false reads whole answers): {_server_said(body)}")

    @staticmethod
    def _whole(response: Any, max_chars: int) -> _Answer:
        choices = getattr(response, "choices", None)
        if not isinstance(choices, list) or not choices:  # an answer of nothing is the endpoint's fault
            raise MalformedResponse(f"the response has no choices: {_server_said(response)}")
        choice = choices[0]
        message = choice.message
        reasoning = ""
        if message is not None:  # vLLM and SGLang reasoning parsers return the thinking apart
            extra = message.model_extra or {}
            reasoning = str(extra.get("reasoning_content") or extra.get("reasoning") or "")
        text = (message.content or "") if message else ""
        if not isinstance(text, str):
            raise MalformedResponse(f"the answer's content is a {type(text).__name__}, not text")
        if len(text) + len(reasoning) > max_chars:
            raise AnswerTooLong(f"the answer has {len(text) + len(reasoning):,} characters, more than the "
                                f"{max_chars // CHARS_PER_TOKEN:,} tokens asked for allow")
        return _Answer(text=text, reasoning=reasoning, model=_label(getattr(response, "model", None)),
                       finish_reason=_label(getattr(choice, "finish_reason", None)),
                       usage=getattr(response, "usage", None))

    def _probe_prompt_tokens(self, messages: list[dict[str, str]]) -> int | None:
        """The prompt's tokens as the server counts them: one token of the same prompt, not streamed
        (the server has the prompt cached from the answer just streamed). None if it will not say."""
        try:
            with _reading_response():  # a body that is no JSON, or no Chat Completion, says nothing
                response = self._client.chat.completions.create(
                    model=self.model, messages=messages, **self._kwargs("text", None, "probe", 1))
        except openai.OpenAIError:
            return None
        return _token_count(getattr(getattr(response, "usage", None), "prompt_tokens", None))

    # -- one call ----------------------------------------------------------------------------
    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any] | None = None,
                 name: str = "answer", max_tokens: int | None = None,
                 extra: dict[str, Any] | None = None) -> Completion:
        """The model's answer to `messages`; with `schema`, asked for as structured JSON where the
        endpoint supports it; `extra`: more request fields the server knows (e.g. logit_bias).
        Raises EndpointError (message redacted) when no answer came."""
        s, start = self.settings, self._clock()
        if self._open_until is not None and start < self._open_until:
            raise EndpointError(f"endpoint skipped for {self._open_until - start:.0f} s more: {self._failures_in_row} "
                                f"calls in a row failed (last: {self._last_error})", attempts=0, latency_s=0.0)
        retries: list[dict[str, Any]] = []
        notes: list[str] = []
        if self._first_call and self.facts.notes:
            notes.append(f"structured output {self.facts.mode}, negotiated earlier in this process: "
                         + "; ".join(self.facts.notes))
        self._first_call = False
        attempts = 0
        jitter = wait_random_exponential(multiplier=s.backoff_base_s, max=s.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            asked = retry_after_s(state.outcome.exception() if state.outcome else None)
            return min(asked, s.retry_after_max_s) if asked is not None else jitter(state)

        def before_sleep(state: RetryCallState) -> None:
            # Called only when another attempt follows (wait() is also asked after the last one).
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            retries.append({"attempt": state.attempt_number, "error": _describe(exc, self.redactor),
                            "wait_s": round(delay, 3), "retry_after": retry_after_s(exc) is not None})

        def attempt() -> tuple[str, _Answer]:
            nonlocal attempts
            attempts += 1
            return self._request(messages, schema, name, notes, max_tokens or s.max_tokens, extra)

        retrying = Retrying(stop=stop_after_attempt(s.max_attempts), wait=wait, retry=retry_if_exception(is_transient),
                            before_sleep=before_sleep, sleep=self._sleep, reraise=True)
        try:
            mode, answer = retrying(attempt)
        except openai.OpenAIError as exc:
            latency = self._clock() - start
            self._trip(exc)
            raise EndpointError(f"{_describe(exc, self.redactor)} (after {attempts} attempt(s), {latency:.1f} s)",
                                attempts=attempts, latency_s=latency, retries=retries) from None
        self._failures_in_row, self._open_until = 0, None
        return self._completion(answer, mode, messages, attempts, retries, notes, start)

    def _trip(self, exc: BaseException) -> None:
        self._failures_in_row += 1
        self._last_error = _describe(exc, self.redactor)[:160]
        if self._failures_in_row >= self.settings.breaker_failures:
            self._open_until = self._clock() + self.settings.breaker_cooldown_s

    def _usage(self, answer: _Answer, messages: list[dict[str, str]]) -> tuple[int, int, str]:
        """(prompt tokens, completion tokens, where they came from)."""
        usage = answer.usage  # a server may send anything here: a string, counts that are no counts
        prompt = _token_count(getattr(usage, "prompt_tokens", None))
        if prompt is not None:
            if answer.streamed:
                self.facts.stream_usage = True
            completion = _token_count(getattr(usage, "completion_tokens", None)) or 0
            return prompt, completion, "stream" if answer.streamed else "response"
        if answer.streamed:
            self.facts.stream_usage = False
            prompt = self._probe_prompt_tokens(messages)
            if prompt is not None:
                return prompt, answer.chunks, "probe"
        estimate = estimate_tokens("".join(m["content"] for m in messages))
        return estimate, estimate_tokens(answer.text + answer.reasoning), "estimate"

    def _completion(self, answer: _Answer, mode: str, messages: list[dict[str, str]], attempts: int,
                    retries: list[dict[str, Any]], notes: list[str], start: float) -> Completion:
        prompt_tokens, completion_tokens, source = self._usage(answer, messages)
        price = self.settings.price(self.model)
        cost = None if price is None else round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)
        return Completion(text=answer.text, reasoning=answer.reasoning, model=answer.model or self.model,
                          mode=mode, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          tokens_reported=source != "estimate", latency_s=round(self._clock() - start, 3),
                          attempts=attempts, retries=retries, cost_usd=cost, finish_reason=answer.finish_reason,
                          notes=notes, usage_source=source, streamed=answer.streamed)

    def list_models(self) -> list[str]:
        """Model ids the endpoint serves (GET /models); EndpointError if it will not say."""
        try:
            with _reading_response():  # a body that is no JSON, or no list of models
                ids = [getattr(m, "id", None) for m in self._client.models.list()]
                if not all(isinstance(i, str) for i in ids):
                    raise TypeError("a model without a text id")
                return [i[:200] for i in ids]
        except openai.OpenAIError as exc:
            raise EndpointError(_describe(exc, self.redactor), attempts=1, latency_s=0.0) from None

    def close(self) -> None:
        self._client.close()

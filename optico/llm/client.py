"""One Chat Completions call with the policies around it.

- Transport: the `openai` package (AzureOpenAI for provider=azure), its own retries off.
- Retries (tenacity): 429, 408/409, 5xx, timeouts and connection errors, with exponential
  backoff and full jitter, honouring the server's Retry-After (or retry-after-ms), up to
  `max_attempts`; any other error fails at once. Then `EndpointError`, and the agent falls
  back to its offline reasoner.
- Structured output, negotiated: a JSON schema first; an endpoint that refuses
  response_format (400/422) is asked again at once in JSON mode, then in plain text, and the
  client remembers what worked.
- A circuit breaker: after `breaker_failures` calls in a row fail, the endpoint is skipped
  for `breaker_cooldown_s` (every call fails fast) so a dead endpoint does not cost each
  agent every timeout of every iteration.
- Secrets: error messages are redacted before they leave this module.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import openai
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from optico.llm.audit import Redactor
from optico.redact import known_secrets, register
from optico.llm.history import estimate_tokens
from optico.llm.settings import LLMSettings

_DOWNGRADE = {"json_schema": "json_object", "json_object": "text"}


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


class EndpointError(RuntimeError):
    """The endpoint gave no usable answer within the allowed attempts (or was skipped)."""

    def __init__(self, message: str, *, attempts: int, latency_s: float,
                 retries: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.attempts, self.latency_s, self.retries = attempts, latency_s, retries or []


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt: rate limits, server errors, timeouts, dropped connections."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
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


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    message = getattr(exc, "message", None) or str(exc)
    return f"{type(exc).__name__}{f' {status}' if status else ''}: {' '.join(str(message).split())[:300]}"


class ChatClient:
    """Chat Completions against one configured endpoint; see the module docstring."""

    def __init__(self, settings: LLMSettings, *, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.model = settings.require_model()
        self.redactor = Redactor([*settings.secrets(), *known_secrets()])
        register(*settings.secrets())
        self._sleep, self._clock = sleep, clock
        self._mode = "json_schema" if settings.structured_output == "auto" else settings.structured_output
        self._failures_in_row = 0
        self._open_until: float | None = None
        self._last_error = ""
        self._client = self._build()

    def _build(self) -> openai.OpenAI:
        s = self.settings
        key = s.api_key.get_secret_value() if s.api_key else None
        if s.provider == "azure":
            if not key:
                raise ValueError("OPTICO_LLM_API_KEY (or OPENAI_API_KEY) is not set: Azure OpenAI needs the "
                                 "resource's key")
            return openai.AzureOpenAI(azure_endpoint=s.base_url, api_version=s.api_version, api_key=key,
                                      timeout=s.timeout_s, max_retries=0)
        if not key and not s.base_url:
            raise ValueError("OPTICO_LLM_API_KEY (or OPENAI_API_KEY) is not set: api.openai.com needs a key; "
                             "for a local server set OPTICO_LLM_BASE_URL")
        # Local servers (vLLM, SGLang, Ollama) ignore the key, but the client needs one.
        return openai.OpenAI(base_url=s.base_url, api_key=key or "no-key", timeout=s.timeout_s, max_retries=0)

    @property
    def mode(self) -> str:
        """How the next structured request will ask for JSON: json_schema, json_object or text."""
        return self._mode

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint_label()

    # -- one call ----------------------------------------------------------------------------
    def _request(self, messages: list[dict[str, str]], schema: dict[str, Any] | None, name: str,
                 notes: list[str], max_tokens: int | None) -> tuple[str, Any]:
        s = self.settings
        while True:
            mode = self._mode if schema is not None else "text"
            kwargs: dict[str, Any] = {}
            if mode == "json_schema":
                kwargs["response_format"] = {"type": "json_schema",
                                             "json_schema": {"name": name, "schema": schema, "strict": False}}
            elif mode == "json_object":
                kwargs["response_format"] = {"type": "json_object"}
            if s.temperature is not None:
                kwargs["temperature"] = s.temperature
            # OpenAI's and Azure's newer models refuse max_tokens; the local servers know max_tokens.
            limit_key = "max_completion_tokens" if s.provider == "azure" or not s.base_url else "max_tokens"
            kwargs[limit_key] = max_tokens or s.max_tokens
            try:
                return mode, self._client.chat.completions.create(model=self.model, messages=messages, **kwargs)
            except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
                if mode == "text" or s.structured_output != "auto":
                    raise
                self._mode = _DOWNGRADE[mode]
                notes.append(f"{mode} refused ({self.redactor.text(_describe(exc))[:200]}); now {self._mode}")

    def complete(self, messages: list[dict[str, str]], *, schema: dict[str, Any] | None = None,
                 name: str = "answer", max_tokens: int | None = None) -> Completion:
        """The model's answer to `messages`; with `schema`, asked for as structured JSON where the
        endpoint supports it. Raises EndpointError (message redacted) when no answer came."""
        s, start = self.settings, self._clock()
        if self._open_until is not None and start < self._open_until:
            raise EndpointError(f"endpoint skipped for {self._open_until - start:.0f} s more: {self._failures_in_row} "
                                f"calls in a row failed (last: {self._last_error})", attempts=0, latency_s=0.0)
        retries: list[dict[str, Any]] = []
        notes: list[str] = []
        attempts = 0
        jitter = wait_random_exponential(multiplier=s.backoff_base_s, max=s.backoff_max_s)

        def wait(state: RetryCallState) -> float:
            asked = retry_after_s(state.outcome.exception() if state.outcome else None)
            return min(asked, s.retry_after_max_s) if asked is not None else jitter(state)

        def before_sleep(state: RetryCallState) -> None:
            # Called only when another attempt follows (wait() is also asked after the last one).
            exc = state.outcome.exception() if state.outcome else None
            delay = state.next_action.sleep if state.next_action else 0.0
            retries.append({"attempt": state.attempt_number, "error": self.redactor.text(_describe(exc)),
                            "wait_s": round(delay, 3), "retry_after": retry_after_s(exc) is not None})

        def attempt() -> tuple[str, Any]:
            nonlocal attempts
            attempts += 1
            return self._request(messages, schema, name, notes, max_tokens)

        retrying = Retrying(stop=stop_after_attempt(s.max_attempts), wait=wait, retry=retry_if_exception(is_transient),
                            before_sleep=before_sleep, sleep=self._sleep, reraise=True)
        try:
            mode, response = retrying(attempt)
        except openai.OpenAIError as exc:
            latency = self._clock() - start
            self._trip(exc)
            raise EndpointError(f"{self.redactor.text(_describe(exc))} (after {attempts} attempt(s), "
                                f"{latency:.1f} s)", attempts=attempts, latency_s=latency, retries=retries) from None
        self._failures_in_row, self._open_until = 0, None
        return self._completion(response, mode, messages, attempts, retries, notes, self._clock() - start)

    def _trip(self, exc: BaseException) -> None:
        self._failures_in_row += 1
        self._last_error = self.redactor.text(_describe(exc))[:160]
        if self._failures_in_row >= self.settings.breaker_failures:
            self._open_until = self._clock() + self.settings.breaker_cooldown_s

    def _completion(self, response: Any, mode: str, messages: list[dict[str, str]], attempts: int,
                    retries: list[dict[str, Any]], notes: list[str], latency: float) -> Completion:
        choice = response.choices[0] if response.choices else None
        message = choice.message if choice else None
        text = (message.content or "") if message else ""
        # vLLM and SGLang reasoning parsers return the thinking apart from the answer.
        reasoning = ""
        if message is not None:
            extra = message.model_extra or {}
            reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
        usage = getattr(response, "usage", None)
        reported = bool(usage and usage.prompt_tokens is not None)
        prompt_tokens = usage.prompt_tokens if reported else estimate_tokens("".join(m["content"] for m in messages))
        completion_tokens = (usage.completion_tokens or 0) if reported else estimate_tokens(text + str(reasoning))
        price = self.settings.price(self.model)
        cost = None if price is None else round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 6)
        return Completion(text=text, reasoning=str(reasoning), model=getattr(response, "model", None) or self.model,
                          mode=mode, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                          tokens_reported=reported, latency_s=round(latency, 3), attempts=attempts, retries=retries,
                          cost_usd=cost, finish_reason=getattr(choice, "finish_reason", None), notes=notes)

    def list_models(self) -> list[str]:
        """Model ids the endpoint serves (GET /models); EndpointError if it will not say."""
        try:
            return [m.id for m in self._client.models.list()]
        except openai.OpenAIError as exc:
            raise EndpointError(self.redactor.text(_describe(exc)), attempts=1, latency_s=0.0) from None

    def close(self) -> None:
        self._client.close()

"""Where the LLM endpoint is and how to talk to it: `OPTICO_LLM_*` environment variables.

Every OpenAI-compatible server speaks Chat Completions, so one client serves OpenAI,
Azure OpenAI, vLLM, SGLang and Ollama; only the base URL, the model name and (for Azure)
the API version differ. See docs/llm.md for one block per endpoint kind.
"""

from __future__ import annotations

import math
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from optico.errors import settings_variable
from optico.host_addresses import is_link_local, literal_addresses
from optico.redact import redact

# USD per million (prompt, completion) tokens, list prices when this table was written.
# Local servers (vLLM, SGLang, Ollama) cost nothing per token: their models are not listed,
# and an unlisted model reports no cost rather than a guessed one. Override with
# OPTICO_LLM_PRICES='{"my-model": [0.5, 1.5]}'.
DEFAULT_PRICES: dict[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o4-mini": (1.10, 4.40),
}

StructuredOutput = Literal["auto", "json_schema", "json_object_schema", "json_object", "text"]


# Upper bounds: a setting past them is a typo or a hostile environment, and an infinite timeout or backoff
# would hold a job forever ("inf" and "1e309" read as floats).
MAX_TOKENS = 1_048_576  # no model answers in more
HOUR = 3600.0
MAX_PRICE_USD = 10_000.0  # per million tokens: a hundred times the dearest model listed anywhere
MAX_MODEL_CHARS = 256


class LLMSettings(BaseSettings):
    """The endpoint, the model and the call policy. Each field reads `OPTICO_LLM_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="OPTICO_LLM_", extra="ignore", populate_by_name=True,
                                      frozen=True, env_parse_none_str="none")

    base_url: str | None = Field(None, description="Chat Completions base URL, e.g. http://localhost:8000/v1 "
                                                   "(vLLM); None = api.openai.com. Azure: the resource endpoint.")
    model: str | None = Field(None, description="Model name as the server knows it (Azure: the deployment).")
    api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPTICO_LLM_API_KEY", "OPENAI_API_KEY"),
        description="Bearer key; falls back to OPENAI_API_KEY. Local servers need none.")
    provider: Literal["openai", "azure"] = Field("openai", description="azure: use the AzureOpenAI client "
                                                                        "(api-key header, api-version query).")
    api_version: str | None = Field(None, description="Azure OpenAI API version, e.g. 2024-10-21.")
    temperature: float | None = Field(0.2, ge=0, le=2, description="Sampling temperature; low keeps reruns "
                                                                    "alike. none: not sent (models that refuse it).")
    max_tokens: int = Field(2048, gt=0, le=MAX_TOKENS,
                            description="Completion tokens per call at most (reasoning included); "
                                        "each agent asks for less (max_tokens_<agent>).")
    max_tokens_analysis: int = Field(900, gt=0, le=MAX_TOKENS,
                                     description="Completion tokens an analysis answer may take.")
    max_tokens_generation: int = Field(1100, gt=0, le=MAX_TOKENS,
                                       description="Completion tokens a generation answer may take.")
    max_tokens_failure: int = Field(450, gt=0, le=MAX_TOKENS,
                                    description="Completion tokens a failure diagnosis may take.")
    stream: bool = Field(True, description="Stream answers, so that a timeout closes the connection and the server "
                                           "stops generating (llama.cpp, vLLM) instead of finishing an abandoned "
                                           "answer that later calls wait behind.")
    timeout_s: float = Field(60.0, gt=0, le=HOUR,
                             description="Seconds one HTTP attempt may take before it counts as a timeout and is "
                                         "retried.")
    max_attempts: int = Field(4, ge=1, le=20, description="HTTP attempts per call (429, 5xx, timeouts and "
                                                          "connection errors are retried), then the agent "
                                                          "falls back to its offline reasoner.")
    backoff_base_s: float = Field(1.0, gt=0, le=HOUR,
                                  description="First backoff; doubles per attempt, with full jitter.")
    backoff_max_s: float = Field(30.0, gt=0, le=HOUR, description="Longest backoff between two attempts.")
    retry_after_max_s: float = Field(60.0, ge=0, le=HOUR,
                                     description="A server's Retry-After is honoured up to this.")
    structured_output: StructuredOutput = Field(
        "auto", description="auto: try a JSON schema, then the server's own schema form (json_object with a "
                            "schema: llama.cpp), then JSON mode, then plain text, remembering per endpoint what "
                            "it accepted; or force one of them.")
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES),
        description="Model -> USD per million (prompt, completion) tokens, for the cost of each call.")
    max_proposals: int = Field(3, ge=1, le=12, description="Ranked proposals the generation agent may return.")
    max_suggestions: int = Field(6, ge=1, le=12, description="Ranked suggestions the analysis agent may return.")
    model_candidates: int = Field(8, ge=0, le=30, description="Performance-model candidate moves shown to the "
                                                               "analysis agent as evidence.")
    history_best_k: int = Field(5, ge=1, le=1000, description="Best successful runs the history view keeps.")
    history_last_n: int = Field(6, ge=1, le=1000, description="Most recent runs the history view keeps.")
    history_token_budget: int = Field(2500, ge=200, le=MAX_TOKENS,
                                      description="Tokens (estimated) the compact history view of the "
                                                  "model-guided mode may use.")
    history_token_budget_led: int = Field(900, ge=200, le=MAX_TOKENS,
                                          description="Tokens (estimated) the full history table of "
                                                      "the llm-led mode may use before it is "
                                                      "compressed (failures are never dropped).")
    log_max_chars: int = Field(4000, ge=500, le=1_000_000,
                               description="Characters of a training log a prompt may quote.")
    breaker_failures: int = Field(3, ge=1, le=1000,
                                  description="Calls failing in a row (after their retries) before "
                                              "the endpoint is skipped for `breaker_cooldown_s`.")
    breaker_cooldown_s: float = Field(300.0, ge=0, le=24 * HOUR,
                                      description="How long a tripped breaker skips the endpoint.")

    @field_validator("base_url")
    @classmethod
    def _reachable_url(cls, url: str | None) -> str | None:
        """An http(s) URL with a host and a valid port. Refused: other schemes (file://, ftp:// were
        accepted, and every call then failed as a 'connection error' naming nothing), and link-local hosts
        (169.254.169.254 is a cloud's metadata service: no model is served there, and the prompt and the
        key would go to it). A name that resolves there (metadata.google.internal) is not looked up."""
        if url is None:
            return None
        # The URL is not quoted back: it may hold a password.
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https"):
            raise ValueError("not an http:// or https:// URL (e.g. http://localhost:8000/v1)")
        if not parts.hostname:
            raise ValueError("the URL names no host")
        try:
            parts.port  # noqa: B018 - raises on a port that is no port (99999, 'x')
        except ValueError as exc:
            raise ValueError(f"the URL's port: {exc}") from None
        # In every spelling the resolver takes: 2852039166, 0xa9fea9fe, 169.254.43518, octal, IPv4-mapped.
        if any(is_link_local(a) for a in literal_addresses(parts.hostname)):
            raise ValueError(f"{parts.hostname} is a link-local address (a cloud metadata service), "
                             "not a model server")
        try:  # what the HTTP client refuses (a leading zero in a dotted address, 1.2.3.04) fails here, not per call
            httpx.URL(url.strip())
        except httpx.InvalidURL as exc:
            raise ValueError(f"not a URL the HTTP client takes ({redact(str(exc))[:120]})") from None
        return url.strip()

    @field_validator("model")
    @classmethod
    def _printable_model(cls, model: str | None) -> str | None:
        if model is not None and (len(model) > MAX_MODEL_CHARS or not model.isprintable()):
            raise ValueError(f"a model name is at most {MAX_MODEL_CHARS} printable characters")
        return model

    @field_validator("prices")
    @classmethod
    def _finite_prices(cls, prices: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        # 1e308 or NaN made every answer's cost unstorable and threw the answers away; -5 cost money back.
        for model, pair in prices.items():
            if not all(math.isfinite(p) and 0 <= p <= MAX_PRICE_USD for p in pair):
                raise ValueError(f"{model[:80]!r}: prices are USD per million tokens, from 0 to "
                                 f"{MAX_PRICE_USD:,.0f}, not {list(pair)}")
        return prices

    @model_validator(mode="after")
    def _coherent(self) -> LLMSettings:
        if self.provider == "azure" and not (self.base_url and self.api_version):
            raise ValueError("OPTICO_LLM_PROVIDER=azure needs OPTICO_LLM_BASE_URL (the resource endpoint) "
                             "and OPTICO_LLM_API_VERSION")
        return self

    def agent_max_tokens(self, agent: str) -> int:
        """The completion-token bound of one agent's answer (never above max_tokens)."""
        bound = {"analysis": self.max_tokens_analysis, "generation": self.max_tokens_generation,
                 "failure": self.max_tokens_failure}.get(agent, self.max_tokens)
        return min(bound, self.max_tokens)

    def require_model(self) -> str:
        if not self.model:
            raise ValueError("OPTICO_LLM_MODEL is not set: name the model the endpoint serves "
                             "(e.g. gpt-4.1-mini, or the model vLLM/Ollama was started with)")
        return self.model

    def secrets(self) -> list[str]:
        """Values that must never be stored or printed."""
        key = self.api_key.get_secret_value() if self.api_key else ""
        return [key] if len(key) >= 4 else []

    def price(self, model: str) -> tuple[float, float] | None:
        """(prompt, completion) USD per million tokens: the exact name, else the longest listed prefix
        (a dated snapshot such as gpt-4o-mini-2024-07-18 costs what gpt-4o-mini costs)."""
        if model in self.prices:
            return self.prices[model]
        matches = [name for name in self.prices if model.startswith(name)]
        return self.prices[max(matches, key=len)] if matches else None

    def endpoint_label(self) -> str:
        """The base URL without credentials or query (safe to store and print)."""
        if not self.base_url:
            return "https://api.openai.com/v1"
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, "", ""))


def load_settings(**overrides: object) -> LLMSettings:
    """Settings from the environment (and `overrides`); ValueError with a one-line reason,
    naming the variable, when they cannot work."""
    try:
        settings = LLMSettings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][:1])  # the variable; not a key inside its JSON
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"OPTICO_LLM_{where.upper()}: {msg}" if where else msg) from None
    except (SettingsError, RecursionError) as exc:
        # A JSON setting is decoded before it is validated: not JSON, or nested past the parser's depth.
        name = settings_variable(exc, "OPTICO_LLM_", "OPTICO_LLM_PRICES")
        example = " e.g. '{\"my-model\": [0.5, 1.5]}' (USD per million tokens)" if name.endswith("PRICES") else ""
        raise ValueError(f"{name}: not valid JSON, or nested or long past what is read;{example}") from None
    settings.require_model()
    return settings

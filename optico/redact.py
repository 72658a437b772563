"""Secrets never leave as text: one redactor for everything stored, printed or sent to an LLM.

Known secret values come from
- the environment: every `OPTICO_*` variable (and `OPENAI_API_KEY`) whose name says it holds
  a secret (`SECRET_NAME`: KEY, TOKEN, SECRET, PASSWORD, AUTH, COOKIE, ...), and the password inside
  `OPTICO_DATABASE_URL`;
- values registered at run time (`register`): an LLM key from settings, a secret in a spec's
  `launcher.env`, a token just minted.
Besides the known values, anything shaped like a credential is masked: `sk-...` keys,
`Bearer ...`, `Authorization: ...`, `api_key=...`, `access_token=...`, `password=...`, `user:password@`
in URLs (with or without a user), JSON Web Tokens, and the well-known token formats of GitHub
(`ghp_...`), Hugging Face (`hf_...`), AWS access key ids, Slack, Google API keys, GitLab, npm, PyPI,
Stripe.

A key with an invisible character inside, or wrapped across lines by a log, is found in the text
without them and masked where it stands.

Redact first, then truncate: a secret cut in half by truncation would no longer match.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

MASK = "***"

# Names of environment variables whose values are secrets.
# PASS and SAS only as whole words of a name (MY_PASS, AZURE_SAS): BYPASS, PASSTHROUGH hold no secret.
SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|CREDS|AUTH|COOKIE|SIGNATURE"
                         r"|(?:^|_)(?:PASS|SAS)(?:_|$))")

# An assigned value: quoted (the quotes kept, what is between them masked), or an unbroken run.
_VALUE = r"(?:(?P<quote>[\"'])(?:(?!(?P=quote))[^\n]){1,512}(?P=quote)|[^\s\"',;&]{4,})"

# Shapes of credentials worth scrubbing even when they are not a configured value
# (an endpoint that echoes a header, a URL with user:password).
_SHAPES = [
    re.compile(r"\bsk-[A-Za-z0-9_\-]{12,}"),
    # Glued to what comes before ("1sk-...", a key pasted into a name): only a long unbroken run, so
    # ordinary words ("risk-assessment") stay as they are.
    re.compile(r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_]{32,}"),
    re.compile(r"optico_[rw]_[A-Za-z0-9_\-]{16,}"),  # our own API tokens
    re.compile(r"(?i)(bearer:?\s+)[A-Za-z0-9_\-.=~+/]{8,}"),
    # An Authorization header as a log or an error quotes it, whatever its scheme (Basic: user:password
    # in base64).
    re.compile(r"(?i)(authorization[\"']?\s*[:=]\s*[\"']?(?:[a-z]+\s+)?)[A-Za-z0-9_\-.=~+/]{8,}"),
    re.compile(r"(?i)((?:api[-_]?key|access[-_]?token|refresh[-_]?token|auth[-_]?token|id[-_]?token|client[-_]?secret"
               r"|secret[-_]?key|token)[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9_\-.~+/]{8,}"),
    # user:password@ in a URL, also one a path normalization wrote with a single slash ("https:/u:p@h"),
    # one with no user ("redis://:p@h"), and a password holding an @ (up to the last @ of the authority).
    re.compile(r"(?<=:/)(/?)[^/@\s:]*:[^/\s]+(?=@)"),
    # A JSON Web Token: header and payload are base64 of '{"...'.
    re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    re.compile(r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"),  # Stripe
    # The keyword anywhere in a name of at most 64 characters that starts where a word starts
    # (DB_PASSWORD=, PGPASSWORD=, sslpassword=, aws_secret_access_key=; not passwordless:), the
    # assignment on one line; a quoted value up to its closing quote, spaces and all. Bounded and
    # anchored so a long run of names ('pwd-pwd-...', a request path) costs linear time. Not after a
    # slash: "/etc/passwd: must be ..." names a file, it assigns nothing.
    re.compile(r"(?i)(?<![\w\-/\\])([\w\-]{0,64}?(?:password|passwd|pwd|secret)(?!less)[\w\-]{0,64}?[\"']?[ \t]*[:=][ \t]*)"
               + _VALUE),
    # An environment variable's assignment whose name ends in a word SECRET_NAME calls a secret, in
    # capitals as such names are written: DB_PASS=, MY_PRIVATE_KEY=, AZURE_STORAGE_KEY=,
    # CLIENT_CREDENTIALS= (not MAX_TOKENS=, KEY_LEN=, MOE_TOKEN_DISPATCHER_TYPE:).
    re.compile(r"(?<![A-Za-z0-9_])([A-Z0-9_]{0,64}?(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|CREDS"
               r"|SIGNATURE|COOKIE|_PASS|_SAS|_AUTH))([\"']?[ \t]*[:=][ \t]*)" + _VALUE),
    # Well-known token formats a log or a spec may carry under any name: GitHub, Hugging Face, AWS
    # access key ids, Slack, Google API keys, GitLab, npm, PyPI.
    re.compile(r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"),
    re.compile(r"hf_[A-Za-z0-9]{30,}"),
    re.compile(r"(?i)(?<=[?&]sig=)[A-Za-z0-9%+/=]{16,}"),  # an Azure SAS URL's signature
    re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    re.compile(r"\bxox[abprs]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"\bAIza[A-Za-z0-9_\-]{35}"),
    re.compile(r"\b(?:glpat-[A-Za-z0-9_\-]{20,}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_\-]{50,})"),
]
# What a terminal or a browser shows as nothing: escape sequences (CSI, OSC), control characters other
# than line breaks and tabs, zero-width and bidi format characters, the soft hyphen.
_INVISIBLE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                        r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")
# What hides inside a key without showing: those, and a line break inside an unbroken run of text.
_LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
_HIDING = re.compile(_INVISIBLE.pattern + r"|(?<=\S)(?:\r\n|\r|\n)(?=\S)")
_MIN_SECRET_LEN = 4  # shorter values would mask ordinary words and numbers
# A known secret this long or longer is also masked in pieces: a run of key characters of at least
# _MIN_FRAGMENT_LEN that is part of it (an echo split by a space: 'sk-test-AA AAAA...'). Shorter
# secrets' pieces would be ordinary words.
_MIN_FRAGMENTED_LEN = 16
_MIN_FRAGMENT_LEN = 8
_KEY_RUN = re.compile(r"[A-Za-z0-9_\-]{%d,}" % _MIN_FRAGMENT_LEN)
# Texts up to this long have their shapes masked through a cache: a stored message repeats the same
# keys and knob values hundreds of times, and each costs a dozen regular-expression passes.
_CACHED_CHARS = 200


def _value_span(m: re.Match[str]) -> tuple[int, int]:
    """Where the secret of a shape's match stands: after its leading groups (a name and its `=`),
    inside a quoted value's quotes."""
    leading = m.re.groups - ("quote" in m.re.groupindex)
    start, end = (m.end(leading) if leading else m.start()), m.end()
    if m.groupdict().get("quote"):
        start, end = start + 1, end - 1
    return start, end


def _masked(m: re.Match[str]) -> str:
    start, end = _value_span(m)
    return m.string[m.start():start] + MASK + m.string[end:m.end()]


def _mask_shapes(value: str) -> str:
    for pattern in _SHAPES:
        value = pattern.sub(_masked, value)
    return value


# Keyed by the text alone: the shapes are constants, and known secret values are replaced before.
_shapes_masked = lru_cache(maxsize=4096)(_mask_shapes)

_registered: set[str] = set()
_lock = threading.Lock()


# Where OptiCo reads its own settings and secrets from: the LLM key falls back to OPENAI_API_KEY.
OWN_NAMES = frozenset({"OPENAI_API_KEY"})


def is_optico_own(name: str) -> bool:
    """A variable of OptiCo's own (its settings, its LLM key; OPTICO_BENCH_* are the trial driver's
    switches): never copied from the worker into a trial, whatever a spec asks (`launcher.env` with
    `***`, `launcher.pass_env`). Any case: the settings read their variables whatever the case."""
    upper = name.upper()
    return (upper.startswith("OPTICO_") and not upper.startswith("OPTICO_BENCH_")) or upper in OWN_NAMES


def is_secret_name(name: str) -> bool:
    """True when an environment variable of this name holds a secret."""
    return bool(SECRET_NAME.search(name))


def _url_password(url: str) -> str | None:
    match = re.search(r"://[^/@\s:]*:([^/\s]+)@", url)
    return match.group(1) if match else None


def environment_secrets(environ: dict[str, str] | None = None) -> set[str]:
    """Secret values held in our own environment variables."""
    env = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in env.items():
        if not value:
            continue
        upper = name.upper()  # our settings read their variables whatever the case
        ours = upper.startswith("OPTICO_") or upper in OWN_NAMES
        if ours and is_secret_name(name):
            found.add(value)
        if upper.endswith("DATABASE_URL"):
            password = _url_password(value)
            if password:
                found.add(password)
    return found


def register(*values: str | None) -> None:
    """Adds secret values to redact from now on, in this process."""
    with _lock:
        _registered.update(v for v in values if v and len(v) >= _MIN_SECRET_LEN)


def known_secrets() -> list[str]:
    """Every secret value known now, longest first (so a key containing another is masked whole)."""
    with _lock:
        values = set(_registered)
    values |= {v for v in environment_secrets() if len(v) >= _MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


class Redactor:
    """Masks the given secrets and credential shapes with ***."""

    def __init__(self, secrets: Iterable[str] = ()):
        self._secrets = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_LEN}, key=len, reverse=True)
        # Only secrets that are one run of key characters (an API key, a token): a URL or a passphrase
        # registered as a secret has ordinary words inside ('services', 'localhost'), not pieces of a key.
        fragmented = [s for s in self._secrets if len(s) >= _MIN_FRAGMENTED_LEN and _KEY_RUN.fullmatch(s)]
        self._fragmented = "\n".join(fragmented)  # one search per run, whatever the number of secrets

    def _is_fragment(self, run: str) -> bool:
        return run in self._fragmented

    def text(self, value: str) -> str:
        # A key with something a reader does not see inside: an escape, a zero-width space, a bidi control
        # ('sk-\x1b[0m...'), or a line break where a log wrapped it at its width. Shown, the halves read
        # as one key; found in the text without them, the key is masked where it stands.
        if not _HIDING.search(value):
            return self._masked(value)
        joined = _Joined(value)
        spans = [*self._spans(value),
                 *((joined.origin(a), joined.origin(b - 1) + 1) for a, b in self._spans(joined.text))]
        pieces, end = [], len(value)
        for start, stop in reversed(_merged(spans)):
            # The line breaks a key spans stay, so the lines around it keep their shape.
            masked = (part if _LINE_BREAK.fullmatch(part) else MASK
                      for part in _LINE_BREAK.split(value[start:stop]) if part)
            pieces += [value[stop:end], "".join(masked)]
            end = start
        pieces.append(value[:end])
        return "".join(reversed(pieces))

    def _spans(self, value: str) -> Iterator[tuple[int, int]]:
        """Where a secret stands in `value`: a known value, or the secret part of a credential shape."""
        for secret in self._secrets:
            at = value.find(secret)
            while at >= 0:
                yield at, at + len(secret)
                at = value.find(secret, at + len(secret))
        if self._fragmented:
            for match in _KEY_RUN.finditer(value):
                if self._is_fragment(match.group()):
                    yield match.span()
        for pattern in _SHAPES:
            for match in pattern.finditer(value):
                start, end = _value_span(match)
                if end > start:
                    yield start, end

    def _masked(self, value: str) -> str:
        for secret in self._secrets:
            value = value.replace(secret, MASK)
        if self._fragmented:
            value = _KEY_RUN.sub(lambda m: MASK if self._is_fragment(m.group()) else m.group(), value)
        return _shapes_masked(value) if len(value) <= _CACHED_CHARS else _mask_shapes(value)

    def scrub(self, value: Any) -> Any:
        """`value` (str, list, dict, scalars) with every string redacted, keys included."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(k) if isinstance(k, str) else k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.scrub(v) for v in value]
        return value


class _Joined:
    """`value` without what `_HIDING` matches (`text`), and where each of its characters stood in `value`:
    one offset per removed run, not one per character (a long log keeps its size)."""

    def __init__(self, value: str) -> None:
        kept: list[str] = []
        self._starts: list[int] = [0]  # index in `text` from which `_shifts` at the same place applies
        self._shifts: list[int] = [0]  # characters removed before that index
        at = removed = 0
        for match in _HIDING.finditer(value):
            kept.append(value[at:match.start()])
            removed += match.end() - match.start()
            self._starts.append(match.end() - removed)
            self._shifts.append(removed)
            at = match.end()
        kept.append(value[at:])
        self.text = "".join(kept)

    def origin(self, index: int) -> int:
        """Where the character at `index` of `text` stands in `value`."""
        return index + self._shifts[bisect.bisect_right(self._starts, index) - 1]


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping or touching spans joined, in order."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def current() -> Redactor:
    """A redactor for every secret known now (environment and registered)."""
    return Redactor(known_secrets())


def redact(text: str) -> str:
    """`text` with every known secret and credential shape masked."""
    return current().text(text)


def credential_shaped(text: str) -> bool:
    """Whether redaction would change `text`: an identifier that does is refused rather than kept
    (a schedule's name is how it is looked up, so it cannot be stored masked)."""
    return redact(text) != text


def scrub(value: Any) -> Any:
    """A JSON-like value with every string redacted."""
    return current().scrub(value)


def clip(text: str, max_chars: int, *, tail: bool = False) -> str:
    """Redacts, then cuts to `max_chars` (the start, or the end with `tail`)."""
    clean = redact(text)
    if len(clean) <= max_chars:
        return clean
    return clean[-max_chars:] if tail else clean[:max_chars]

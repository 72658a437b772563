"""The regression webhook: a JSON POST that never blocks a tick and never leaks a secret.

- sent from a daemon thread with a bounded timeout: a slow or dead receiver costs the tick nothing;
- the payload is redacted of every known secret (`optico.redact.scrub`);
- only http(s) URLs, and redirects are never followed (a 3xx is reported as the receiver's answer):
  a receiver cannot bounce the request to another scheme or an internal address;
- the URL itself is a secret (chat webhooks carry their token in the path): logs name its host only.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from optico import __version__, redact

log = logging.getLogger("optico.retune")

TIMEOUT_S = 10.0


def check_webhook_url(url: str) -> str:
    """The URL, if it is an absolute http(s) URL with a host; ValueError naming the reason."""
    url = url.strip()
    if len(url) > 2000:
        raise ValueError("webhook_url: longer than 2000 characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed lazily: a bad port raises here
    except ValueError as exc:
        raise ValueError(f"webhook_url: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"webhook_url: must be an http:// or https:// URL, got scheme {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("webhook_url: the URL has no host")
    return url


def where(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/…" if parts.scheme and parts.hostname else "(not a URL)"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None  # urllib then raises HTTPError with the 3xx: reported, not followed


_OPENER = urllib.request.build_opener(_NoRedirects())


def post(url: str, payload: dict[str, Any], *, timeout_s: float = TIMEOUT_S) -> int | str:
    """POSTs `payload` (redacted) now; returns the HTTP status or the error text. Never raises."""
    try:
        check_webhook_url(url)
        body = json.dumps(redact.scrub(payload), default=str).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": f"optico/{__version__}"})
        with _OPENER.open(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except Exception as exc:  # noqa: BLE001 - a notification must never break a tick
        return redact.clip(f"{type(exc).__name__}: {exc}", 300)


def notify(url: str | None, payload: dict[str, Any], *, timeout_s: float = TIMEOUT_S) -> threading.Thread | None:
    """Sends `payload` to `url` in the background (None: nothing to send); returns the thread."""
    if not url:
        return None

    def send() -> None:
        result = post(url, payload, timeout_s=timeout_s)
        ok = isinstance(result, int) and 200 <= result < 300
        log.log(logging.INFO if ok else logging.WARNING, "webhook to %s: %s", where(url), result)

    thread = threading.Thread(target=send, name="optico-webhook", daemon=True)
    thread.start()
    return thread

"""The regression webhook: a JSON POST that never blocks a tick and never leaks a secret.

- sent from a daemon thread with a bounded timeout for the whole exchange, the name lookup included
  (not each read): a slow, dead or trickling receiver or DNS server costs the tick nothing;
- the payload is redacted of every known secret (`optico.redact.scrub`);
- only http(s) URLs, and redirects are never followed (a 3xx is reported as the receiver's answer):
  a receiver cannot bounce the request to another scheme or an internal address;
- the URL itself is a secret (chat webhooks carry their token in the path): logs name its host only;
- no loopback, link-local (the cloud metadata service at 169.254.169.254), other cloud metadata
  (`METADATA_ADDRESSES`), unspecified, multicast or reserved address, named or resolved, unless
  OPTICO_WEBHOOK_ALLOW_LOCAL=true (a receiver on the same host, in development): anyone with a write
  token sets a schedule's URL, and the server would POST from inside the network. Private ranges
  (10/8, 192.168/16, ...) stay allowed: a team's own chat or alerting service usually lives there.
  A name is resolved again when the hook is sent, and the request goes to the address that was
  checked (a second lookup could answer otherwise: DNS rebinding); TLS still verifies the
  certificate against the name. Through an HTTP(S)_PROXY the proxy resolves the name, and its
  policy decides.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from optico import __version__, redact
from optico.host_addresses import literal_addresses

log = logging.getLogger("optico.retune")

TIMEOUT_S = 10.0
ALLOW_LOCAL_ENV = "OPTICO_WEBHOOK_ALLOW_LOCAL"


# Cloud metadata services outside link-local: Alibaba Cloud's (in 100.64/10), AWS's over IPv6 (a
# private fd00::/8 address), Oracle Cloud's older one. 169.254.169.254 is link-local already.
METADATA_ADDRESSES = frozenset(map(ipaddress.ip_address, ("100.100.100.200", "fd00:ec2::254", "192.0.0.192")))


def _local(address: str) -> bool:
    """An address a webhook may not reach from the server (see the module docstring)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):  # an IPv4 address inside: mapped, 6to4 or Teredo's client
        candidates += [a for a in (ip.ipv4_mapped, ip.sixtofour, ip.teredo and ip.teredo[1]) if a]
    return any(a.is_loopback or a.is_link_local or a.is_unspecified or a.is_multicast or a.is_reserved
               or a in METADATA_ADDRESSES for a in candidates)


def _allow_local() -> bool:
    """OPTICO_WEBHOOK_ALLOW_LOCAL in pydantic's spellings, as ServiceSettings checks it when a server
    starts; ValueError for anything else (`schedule add` and `run-now` read it here: 'maybe' meant false)."""
    value = os.environ.get(ALLOW_LOCAL_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off", "f", "n"):
        return False
    if value in ("1", "true", "yes", "on", "t", "y"):
        return True
    raise ValueError(f"{ALLOW_LOCAL_ENV}: {value[:20]!r} is not true or false")


def _check_addresses(host: str, addresses: list[str]) -> None:
    if _allow_local():
        return
    for address in addresses:
        if _local(address):
            named = host if host == address else f"{host} ({address})"
            raise ValueError(f"webhook_url: {named} is a loopback, link-local or cloud metadata address, which the "
                             f"server does not post to (set {ALLOW_LOCAL_ENV}=true to allow it)")


def check_webhook_url(url: str) -> str:
    """The URL, if it is an absolute http(s) URL with a host; ValueError naming the reason."""
    url = url.strip()
    if len(url) > 2000:
        raise ValueError("webhook_url: longer than 2000 characters")
    if re.search(r"[\x00-\x20\x7f-\x9f]", url):
        raise ValueError("webhook_url: holds a space or a control character")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed lazily: a bad port raises here
    except ValueError as exc:
        raise ValueError(f"webhook_url: not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"webhook_url: must be an http:// or https:// URL, got scheme {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise ValueError("webhook_url: the URL has no host")
    if "@" in parts.netloc:  # urllib cannot send it, and its errors print the password
        raise ValueError("webhook_url: must not hold a user name or password (put the secret in the path, "
                         "as Slack and Teams do)")
    _check_addresses(parts.hostname, literal_addresses(parts.hostname))
    return url


def _resolved(host: str, port: int, seconds: float) -> list[tuple[Any, ...]]:
    """`socket.getaddrinfo(host, port)` within `seconds`, TimeoutError after. The system resolver takes
    no timeout (a dead DNS server holds it for retries of 5 s each), so it runs in a daemon thread of
    its own, left to finish alone when the time is up."""
    answer: list[Any] = []

    def lookup() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP))
        except OSError as exc:
            answer.append(exc)

    thread = threading.Thread(target=lookup, name="optico-webhook-lookup", daemon=True)
    thread.start()
    thread.join(max(seconds, 0.0))
    if not answer:
        raise TimeoutError(f"no address for {host} within {seconds:.3g} s")
    if isinstance(answer[0], OSError):
        raise answer[0]
    return answer[0]


def _checked_addresses(url: str, deadline: _Deadline) -> list[str]:
    """The addresses the URL's host resolves to before `deadline`, once every one has passed
    `_check_addresses` (ValueError otherwise)."""
    parts = urlsplit(url)
    infos = _resolved(parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80),
                      deadline.remaining())
    addresses = [str(info[4][0]) for info in infos]
    _check_addresses(parts.hostname or "", addresses)
    return addresses


def where(url: str) -> str:
    """What may be shown of a webhook URL: its scheme and host."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}/…" if parts.scheme and parts.hostname else "(not a URL)"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None  # urllib then raises HTTPError with the 3xx: reported, not followed


class _Deadline:
    """One exchange's time limit: when it is up, every socket the exchange opened (or opens later) is
    shut down, so a blocked read returns at once whatever each read's own timeout."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._started = time.monotonic()
        self.expired = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._started = time.monotonic()
        self._timer.start()

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self._started)

    def cancel(self) -> None:
        self._timer.cancel()

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.expired.is_set():
                _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired.set()
            for sock in self._sockets:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _watched(connection: type[http.client.HTTPConnection], addresses: list[str] | None,
             deadline: _Deadline, host: str, **kwargs: Any) -> http.client.HTTPConnection:
    """`connection` to `host` whose sockets `deadline` watches. With `addresses` the socket goes to one
    of them, in order, as the resolver's answer would be tried: the Host header and TLS's server name
    and certificate check stay the name's. Without, to `host` itself (the proxy)."""
    def connect(where: tuple[str, int], timeout: Any = None,  # seconds, or http.client's "default" sentinel
                source_address: tuple[str, int] | None = None) -> socket.socket:
        error: OSError = OSError(f"no address for {host}")
        for address in addresses or [where[0]]:
            left = deadline.remaining()  # each address's connect within what is left of the exchange
            if left <= 0:
                raise TimeoutError(f"no connection to {host} in time")
            limit = min(timeout, left) if isinstance(timeout, (int, float)) else left
            try:
                sock = socket.create_connection((address, where[1]), limit, source_address)
            except OSError as exc:
                error = exc
                continue
            deadline.watch(sock)
            return sock
        raise error

    conn = connection(host, **kwargs)
    conn._create_connection = connect
    return conn


class _WatchedHTTP(urllib.request.HTTPHandler):
    def __init__(self, addresses: list[str] | None, deadline: _Deadline) -> None:
        super().__init__()
        self.addresses, self.deadline = addresses, deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_watched, http.client.HTTPConnection, self.addresses, self.deadline), req)


class _WatchedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, addresses: list[str] | None, deadline: _Deadline) -> None:
        super().__init__()
        self.addresses, self.deadline = addresses, deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(partial(_watched, http.client.HTTPSConnection, self.addresses, self.deadline), req,
                            context=self._context)


def _opener(url: str, deadline: _Deadline) -> urllib.request.OpenerDirector:
    """Straight to the checked address; through the proxy where the environment names one for it,
    without a lookup here: the proxy resolves the name (a network whose hosts reach the outside only
    through it often cannot resolve outside names at all), and its policy decides."""
    parts = urlsplit(url)
    if urllib.request.getproxies().get(parts.scheme) and not urllib.request.proxy_bypass(parts.hostname or ""):
        return urllib.request.build_opener(_NoRedirects(), _WatchedHTTP(None, deadline), _WatchedHTTPS(None, deadline))
    addresses = _checked_addresses(url, deadline)
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects(),
                                       _WatchedHTTP(addresses, deadline), _WatchedHTTPS(addresses, deadline))


def post(url: str, payload: dict[str, Any], *, timeout_s: float = TIMEOUT_S) -> int | str:
    """POSTs `payload` (redacted) now; returns the HTTP status or the error text. Never raises.
    `timeout_s` bounds the whole exchange, the name lookup included, not each read: a dead DNS server
    or a receiver trickling its answer a byte at a time is cut off like a silent receiver."""
    deadline = _Deadline(timeout_s)
    try:
        check_webhook_url(url)
        body = json.dumps(redact.scrub(payload), default=str).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": f"optico/{__version__}"})
        deadline.start()
        opener = _opener(url, deadline)
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except Exception as exc:  # noqa: BLE001 - a notification must never break a tick
        # urllib wraps a connect's timeout in URLError, and the limit can pass a moment before the
        # deadline's timer thread says so: either way the exchange ran out of time.
        if deadline.expired.is_set() or deadline.remaining() <= 0 \
                or isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            return f"timed out: no whole answer within {timeout_s:g} s"
        return redact.clip(f"{type(exc).__name__}: {exc}", 300)
    finally:
        deadline.cancel()


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

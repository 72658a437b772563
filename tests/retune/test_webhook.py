"""The regression webhook against a real HTTP server on localhost: redacted, bounded, no redirects."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from optico import redact
from optico.retune.webhook import check_webhook_url, notify, post


class _Receiver(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/slow":
            time.sleep(3)
        if self.path == "/bounce":
            self.send_response(307)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
            return
        type(self).received.append({"path": self.path, "body": body, "type": self.headers["Content-Type"],
                                    "host": self.headers["Host"]})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("OPTICO_WEBHOOK_ALLOW_LOCAL", "true")  # the receiver is on this host
    _Receiver.received = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def _timed_post(url: str, timeout_s: float) -> tuple[float, int | str]:
    """How long `post` took, and its answer."""
    started = time.monotonic()
    answer = post(url, {"x": 1}, timeout_s=timeout_s)
    return time.monotonic() - started, answer


def test_the_payload_arrives_redacted_in_the_background(server: str) -> None:
    secret = "sk-test-0123456789abcdef"
    redact.register(secret)
    thread = notify(f"{server}/hook", {"outcome": "regression", "log": f"key={secret}"})
    assert thread is not None
    thread.join(timeout=10)
    [got] = _Receiver.received
    assert got["type"] == "application/json" and got["body"]["outcome"] == "regression"
    assert secret not in json.dumps(got["body"])
    assert notify(None, {"x": 1}) is None


def test_redirects_are_not_followed_and_a_slow_receiver_costs_at_most_the_timeout(server: str) -> None:
    assert post(f"{server}/bounce", {"x": 1}) == 307
    assert _Receiver.received == []
    started = time.monotonic()
    answer = post(f"{server}/slow", {"x": 1}, timeout_s=0.5)
    assert time.monotonic() - started < 2.5 and "timed out" in str(answer).lower()
    started = time.monotonic()
    notify(f"{server}/slow", {"x": 1}, timeout_s=0.5)
    assert time.monotonic() - started < 0.2  # the caller (a tick) never waits


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte of the answer comes well within the timeout, the whole never does: the limit is on the
    exchange, not on each read, so the sending thread does not live as long as the receiver likes."""
    monkeypatch.setenv("OPTICO_WEBHOOK_ALLOW_LOCAL", "true")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 204 No Content\r\nX-Pad: " + b"a" * 400:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.1)

    threading.Thread(target=trickle, daemon=True).start()
    took, answer = _timed_post(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", 1.0)
    stop.set()
    listener.close()
    assert took < 3.0 and answer == "timed out: no whole answer within 1 s", (took, answer)


@pytest.mark.parametrize("url, reason", [("file:///etc/passwd", "scheme 'file'"), ("ftp://x/y", "scheme 'ftp'"),
                                         ("https://", "no host"), ("hooks.example.com/x", "scheme 'none'"),
                                         ("https://hooks.example.com/\x1b]0;pwn\x07", "control character"),
                                         # urllib read the password as a port, and its error printed it
                                         ("http://alice:S3cretHookPass@10.1.2.3/hook", "user name or password"),
                                         ("https://token@hooks.example.com/x", "user name or password")])
def test_only_http_urls_with_a_host(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_webhook_url(url)
    answer = post(url, {})
    assert answer != 200 and "S3cret" not in str(answer)


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data",
                                 "http://[::1]/x", "http://[::ffff:127.0.0.1]/x", "http://0.0.0.0/x",
                                 # forms the resolver reads as loopback too: refused when saved, not only when sent
                                 "http://localhost:9/x", "http://127.1/x", "http://2130706433/x",
                                 "http://0x7f000001/x", "http://017700000001/x", "http://0/x",
                                 "http://localhost./x", "http://127.0.0.1./x", "http://127.1./x",
                                 "http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/x",
                                 "http://127\u30020\u30020\u30021/x",
                                 # cloud metadata services outside link-local (Alibaba, AWS over IPv6, Oracle)
                                 "http://100.100.100.200/latest/meta-data", "http://[fd00:ec2::254]/latest",
                                 "http://192.0.0.192/opc/v1/instance/",
                                 # 169.254.169.254 inside IPv6: 6to4, Teredo's client
                                 "http://[2002:a9fe:a9fe::]/x", "http://[2001:0:4136:e378:8000:63bf:5601:5601]/x"])
def test_loopback_and_link_local_receivers_are_refused_unless_allowed(url: str, monkeypatch: pytest.MonkeyPatch):
    # Anyone with a write token sets a schedule's URL; the server would POST from inside the network.
    monkeypatch.delenv("OPTICO_WEBHOOK_ALLOW_LOCAL", raising=False)
    with pytest.raises(ValueError, match="loopback, link-local"):
        check_webhook_url(url)
    assert "loopback, link-local" in str(post(url, {"x": 1}))
    assert check_webhook_url("http://10.1.2.3/team-hook")  # a private range: a team's own service


def test_a_name_that_resolves_to_loopback_is_refused_when_sent(server: str, monkeypatch: pytest.MonkeyPatch):
    port = server.rsplit(":", 1)[1]
    monkeypatch.delenv("OPTICO_WEBHOOK_ALLOW_LOCAL")
    # A name whose DNS answer is loopback (a rebinding name, say): this machine's resolver stands in.
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real("127.0.0.1" if host == "hooks.rebind.test"
                                                                           else host, *a, **k))
    assert check_webhook_url(f"http://hooks.rebind.test:{port}/hook")  # a name: checked when sent
    assert "loopback, link-local" in str(post(f"http://hooks.rebind.test:{port}/hook", {"x": 1}))
    assert _Receiver.received == []


def _answers(monkeypatch: pytest.MonkeyPatch, name: str, *addresses: str) -> None:
    """This machine's resolver answers `name` with each address in turn (then the last): a name
    whose DNS answer changes between two lookups, as a rebinding server's does."""
    real, left = socket.getaddrinfo, list(addresses)

    def getaddrinfo(host: str, *a: object, **k: object) -> list:
        if host != name:
            return real(host, *a, **k)
        return real(left.pop(0) if len(left) > 1 else left[0], *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_name_that_rebinds_after_the_check_is_not_followed(server: str, monkeypatch: pytest.MonkeyPatch):
    """Checked with a public answer, then loopback on the next lookup: the hook goes to the address
    that was checked (here one that answers nobody), never to the receiver on loopback."""
    port = server.rsplit(":", 1)[1]
    monkeypatch.delenv("OPTICO_WEBHOOK_ALLOW_LOCAL")
    _answers(monkeypatch, "hooks.rebind.test", "192.0.2.1", "127.0.0.1")  # TEST-NET-1, then loopback
    result = post(f"http://hooks.rebind.test:{port}/hook", {"x": 1}, timeout_s=1.0)
    assert not isinstance(result, int), result
    assert _Receiver.received == []


def test_the_request_goes_to_the_checked_address_with_the_name_as_host(server: str,
                                                                        monkeypatch: pytest.MonkeyPatch):
    """The receiver listens on 127.0.0.1 only; a second lookup would say 127.0.0.2 (refused there)."""
    port = server.rsplit(":", 1)[1]
    _answers(monkeypatch, "hooks.pinned.test", "127.0.0.1", "127.0.0.2")
    assert post(f"http://hooks.pinned.test:{port}/hook", {"x": 1}) == 204
    assert [(r["path"], r["host"]) for r in _Receiver.received] == [("/hook", f"hooks.pinned.test:{port}")]


def test_through_a_proxy_the_proxy_gets_the_request(server: str, monkeypatch: pytest.MonkeyPatch):
    """Where HTTP_PROXY applies, the hook goes to the proxy (here the receiver), which resolves the
    name itself: the request line carries the whole URL."""
    monkeypatch.delenv("OPTICO_WEBHOOK_ALLOW_LOCAL")
    monkeypatch.setenv("HTTP_PROXY", server)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    _answers(monkeypatch, "hooks.example.test", "192.0.2.1")
    assert post("http://hooks.example.test/hook", {"x": 1}, timeout_s=5.0) == 204
    assert [r["path"] for r in _Receiver.received] == ["http://hooks.example.test/hook"]
    # A name this machine cannot resolve (only the proxy can): it was looked up here first, and failed.
    assert post("http://hooks.only-the-proxy-knows.invalid/hook", {"x": 1}, timeout_s=5.0) == 204
    assert _Receiver.received[-1]["path"] == "http://hooks.only-the-proxy-knows.invalid/hook"


def test_a_name_lookup_that_hangs_is_cut_off_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The system resolver takes no timeout (a dead DNS server holds it for retries of seconds each):
    the lookup counts against the exchange's limit like the answer does."""
    real, release = socket.getaddrinfo, threading.Event()

    def getaddrinfo(host: str, *a: object, **k: object) -> list:
        if host == "hooks.dead-dns.test":
            release.wait(30)  # a DNS server that never answers
        return real("127.0.0.1" if host == "hooks.dead-dns.test" else host, *a, **k)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    took, answer = _timed_post("http://hooks.dead-dns.test/hook", 0.5)
    release.set()
    assert took < 2.0 and answer == "timed out: no whole answer within 0.5 s", (took, answer)


def test_connecting_to_several_silent_addresses_takes_the_timeout_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with three addresses whose connects all hang (a listener whose backlog is full drops the
    handshake): the addresses share the exchange's limit, not one timeout each."""
    monkeypatch.setenv("OPTICO_WEBHOOK_ALLOW_LOCAL", "true")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    held = socket.create_connection(("127.0.0.1", port), 1.0)  # fills the backlog: later handshakes hang
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: real("127.0.0.1", *a, **k) * 3
                        if host == "hooks.silent.test" else real(host, *a, **k))
    took, answer = _timed_post(f"http://hooks.silent.test:{port}/hook", 1.0)
    held.close()
    listener.close()
    assert took < 2.0 and answer == "timed out: no whole answer within 1 s", (took, answer)


def test_the_limit_reached_before_the_timer_fires_is_still_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit can pass a moment before the deadline's timer thread marks it (a loaded machine):
    the next connect gives up, urllib wraps that in a URLError, and the answer must still say it
    timed out (CI saw 'URLError: ... no connection ... in time')."""
    from optico.retune import webhook

    monkeypatch.setenv("OPTICO_WEBHOOK_ALLOW_LOCAL", "true")
    monkeypatch.setattr(webhook._Deadline, "start", lambda self: None)  # the timer never fires
    monkeypatch.setattr(webhook, "_checked_addresses", lambda url, deadline: ["127.0.0.1"])  # looked up in time
    monkeypatch.setattr(webhook._Deadline, "remaining", lambda self: 0.0)  # then the limit passes
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        answer = webhook.post(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", {"x": 1}, timeout_s=1.0)
    assert answer == "timed out: no whole answer within 1 s", answer

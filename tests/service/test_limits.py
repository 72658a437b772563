"""Clients that hold connections open: a slow request head is cut off, event streams are capped.

Against a real `optico serve` process over real sockets."""

from __future__ import annotations

import socket
import struct
import time

import httpx
from service_testkit import client, spec, wait_for


def _partial_head(port: int) -> socket.socket:
    """A connection that sends the start of a request head and never finishes it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    return sock


def _response(sock: socket.socket) -> bytes:
    """One whole response (head and Content-Length body), however the server's writes were split."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def _stream_socket(port: int, path: str, auth_header: str) -> socket.socket | None:
    """A raw connection whose GET of `path` was answered 200 (None, and closed, when refused)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth_header}\r\n\r\n".encode())
    status = b""
    while len(status) < 12 and (chunk := sock.recv(12 - len(status))):
        status += chunk
    if status == b"HTTP/1.1 200":
        return sock
    sock.close()
    return None


def _closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_request_head_sent_too_slowly_is_cut_off_while_others_are_answered(make_service, tokens: dict[str, str]):
    service = make_service(OPTICO_HEAD_TIMEOUT_S="1").start()
    slow = [_partial_head(service.port) for _ in range(50)]
    # Meanwhile an ordinary request is answered at once.
    assert httpx.get(f"{service.url}/healthz", timeout=5).status_code == 200
    started = time.monotonic()
    assert all(_closed_by_server(sock, within_s=10) for sock in slow)
    assert time.monotonic() - started < 8
    # A kept-alive connection gets the same deadline for its next request's head.
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _closed_by_server(sock, within_s=10)
    for sock in slow:
        sock.close()
    # The default leaves an ordinary client all the time it needs.
    patient = make_service().start()
    with _partial_head(patient.port) as sock:
        assert not _closed_by_server(sock, within_s=2)
        sock.sendall(b"\r\n")
        assert _response(sock).startswith(b"HTTP/1.1 200")


def test_a_request_body_sent_too_slowly_is_cut_off_quietly(make_service, tokens: dict[str, str]):
    """A head announcing a body that never comes, on the login form and on the API without a token
    (the token is read only once the request is whole): cut off after the deadline, and a client
    leaving halfway through its body leaves no traceback in the log."""
    service = make_service("--no-worker", OPTICO_HEAD_TIMEOUT_S="1").start()
    heads = [b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
             b"Content-Length: 100\r\n\r\ntoken=",
             # FastAPI reads a model's body before any dependency, the token's included.
             b"POST /api/v1/schedules HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{",
             b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Authorization: Bearer " + tokens["write"].encode() + b"\r\nContent-Length: 100\r\n\r\n{"]
    slow = []
    for head in heads:
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
        sock.sendall(head)
        slow.append(sock)
    started = time.monotonic()
    assert all(_closed_by_server(sock, within_s=10) for sock in slow)
    assert time.monotonic() - started < 8
    # A body that does arrive in time is served, and one left halfway by its client leaves quietly.
    body = b'{"name": "on time"}'
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + tokens["write"].encode() +
                     b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
        time.sleep(0.3)
        sock.sendall(body[5:])
        assert _response(sock).startswith(b"HTTP/1.1 422 ")  # the spec is incomplete: read whole, and answered
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        sock.sendall(heads[0])
        time.sleep(0.3)
    time.sleep(0.5)
    for sock in slow:
        sock.close()
    service.stop()
    log = service.log.read_text()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[-3000:]


def test_event_streams_beyond_the_cap_get_503_and_a_freed_slot_serves_the_next(make_service, tokens: dict[str, str]):
    service = make_service(OPTICO_MAX_EVENT_STREAMS="2").start()
    http = client(service, tokens["write"])
    job = http.post("/api/v1/jobs", json=spec("long", max_trials=3, trial_seconds=20)).json()
    path = f"/api/v1/jobs/{job['id']}/events"
    first = http.stream("GET", path, timeout=60)
    second = http.stream("GET", path, timeout=60)
    streams = [first.__enter__(), second.__enter__()]
    try:
        assert [s.status_code for s in streams] == [200, 200]
        refused = http.get(path)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5", refused.text
        assert "2 event streams are open" in refused.json()["detail"]
        # Reading the job is not a stream: still answered.
        assert http.get(f"/api/v1/jobs/{job['id']}").status_code == 200
    finally:
        first.__exit__(None, None, None)
    # The closed stream's slot comes back once the server sees the disconnect (its next poll).
    def third_stream_opens() -> bool:
        with http.stream("GET", path, timeout=60) as third:
            return third.status_code == 200
    wait_for(third_stream_opens, timeout=30, what="a slot freed by the closed stream")
    second.__exit__(None, None, None)
    http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_a_client_dropping_a_busy_event_stream_leaves_no_traceback_in_the_log(make_service, db_url: str,
                                                                              tokens: dict[str, str]):
    # Clients that read nothing, then reset the connection, while megabytes of events are still on their
    # way: FastAPI's teardown of each stream raised anyio.BrokenResourceError, logged as a traceback.
    from optico.events import AgentOutput
    from optico.pool.store import SqlStore
    from optico.spec import parse_spec

    with SqlStore(db_url) as store:
        job = store.create_job(parse_spec(spec("busy")))
        store.claim_job("elsewhere", 600, job_id=job)  # running, on a worker this service does not have
        for i in range(300):
            store.add_event(job, AgentOutput(iteration=i, agent="analysis", message="m", text="x" * 20_000),
                            worker="elsewhere")
    # One stream at a time: the next one opens only once the dropped one's teardown has finished.
    service = make_service("--no-worker", OPTICO_MAX_EVENT_STREAMS="1").start()
    http = client(service, tokens["read"])
    for path in (f"/api/v1/jobs/{job}/events", f"/ui/jobs/{job}/events"):
        auth = f"Authorization: Bearer {tokens['read']}" if path.startswith("/api") else \
            f"Cookie: optico_session={tokens['read']}"
        # Retried: the previous probe's slot is freed by its own teardown, a moment after it closed.
        opened = wait_for(lambda: _stream_socket(service.port, path, auth), timeout=30, what=f"a stream of {path}")
        with opened as sock:
            time.sleep(1)  # the server fills the socket and its own buffers
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close: a reset

        def next_stream_opens() -> bool:
            with http.stream("GET", f"/api/v1/jobs/{job}/events", timeout=30) as stream:
                return stream.status_code == 200
        wait_for(next_stream_opens, timeout=30, what="the dropped stream's slot")
    service.stop()
    log = service.log.read_text()
    assert "Traceback" not in log and "BrokenResourceError" not in log, log[-3000:]

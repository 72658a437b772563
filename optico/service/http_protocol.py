"""uvicorn's HTTP/1.1 protocol with a deadline on every request head and body.

uvicorn closes a keep-alive connection that stays idle, but once a client has sent the first byte of
a request it waits for the rest for ever: a client that sends a header line, or a byte of its body,
now and then (a "slowloris") holds a connection without any credentials — the token is checked only
once the request is whole — and a few thousand of them hold every file descriptor the server has,
so nobody else is answered. Here a connection has `head_timeout_s` to send a complete request head,
from when it opens and again from the end of each response, and as long again, from the end of the
head, to send the body its head announced; one that has not is closed. Responses are not timed: an
event stream is meant to stay open (the service caps how many, `ServiceSettings.max_event_streams`).

uvicorn takes the protocol class through its `http` setting (`uvicorn.run(..., http=...)`).
"""

from __future__ import annotations

import asyncio
from typing import Literal

from uvicorn.protocols.http.h11_impl import H11Protocol

Waiting = Literal["head", "body"] | None


class HeadDeadlineProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head, or body, is not complete in time."""

    head_timeout_s: float = 15.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_for: Waiting = None
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for(self) -> Waiting:
        """What of the current request the client still owes: its head (no request is being served),
        its body (the head announced one, not all of it has come, nothing answered it yet), or nothing."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return "head"
        if cycle.more_body and not cycle.response_started and not cycle.disconnected:
            return "body"
        return None

    def _follow(self) -> None:
        """A deadline for what the client owes now: a fresh one when that changed, none when it owes nothing."""
        waiting = self._waiting_for()
        if waiting == self._deadline_for and (waiting is None or self._deadline is not None):
            return
        self._disarm()
        if waiting is not None:
            self._deadline_for = waiting
            self._deadline = self.loop.call_later(self.head_timeout_s, self._too_slow, waiting)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._deadline_for = None, None

    def _too_slow(self, waited_for: Waiting) -> None:
        self._deadline, self._deadline_for = None, None
        if self._waiting_for() == waited_for and not self.transport.is_closing():
            self.transport.close()
        else:
            self._follow()


def with_head_timeout(seconds: float) -> type[HeadDeadlineProtocol]:
    """The protocol class with a deadline of `seconds` for each request head and each request body."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": float(seconds)})

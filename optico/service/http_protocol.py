"""uvicorn's HTTP/1.1 protocol with a deadline on every request head.

uvicorn closes a keep-alive connection that stays idle, but once a client has sent the first byte of
a request it waits for the rest of the head for ever: a client that sends a header line now and
then (a "slowloris") holds a connection, and a few thousand of them hold every file descriptor the
server has, so nobody else is answered. Here a connection has `head_timeout_s` to send a complete
request head, from when it opens and again from the end of each response; one that has not is
closed. Bodies and responses are not timed: an event stream is meant to stay open (the service caps
how many, `ServiceSettings.max_event_streams`), and the body limit bounds what a body may be.

uvicorn takes the protocol class through its `http` setting (`uvicorn.run(..., http=...)`).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol


class HeadDeadlineProtocol(H11Protocol):
    """`H11Protocol` that closes a connection whose request head is not complete in time."""

    head_timeout_s: float = 15.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self._waiting_for_head():
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._waiting_for_head() and not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _waiting_for_head(self) -> bool:
        """No request is being served: the next one has not sent its whole head yet."""
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_slow(self) -> None:
        self._head_deadline = None
        if self._waiting_for_head() and not self.transport.is_closing():
            self.transport.close()


def with_head_timeout(seconds: float) -> type[HeadDeadlineProtocol]:
    """The protocol class with a deadline of `seconds` for each request head."""
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": float(seconds)})

"""The HTTP client under the `openai` package, with the bounds an untrusted endpoint needs.

- A deadline per response: it must arrive whole within `total_s` of its request. The HTTP
  library's read timeout restarts with every byte, so a server dripping a byte a second, or
  sending SSE keep-alive comments for ever, held a job open with no fallback.
- A size cap per response (`MAX_RESPONSE_BYTES`, SSE framing included): a 50 MB answer was read,
  stored and sent back to the server in the re-ask.
- No redirects: a 3xx is the endpoint's answer (an error), not an instruction to send the
  prompt elsewhere.
- The same bounds through a proxy named by HTTP(S)_PROXY (the client's own proxy transport).

Both bounds raise the HTTP library's own errors (a read timeout, a read error). The client turns
the deadline into a timeout (retried, then the offline reasoner) and the size cap, marked
`ResponseTooLarge`, into an answer too long (not retried: the server would send as much again).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import openai

MAX_RESPONSE_BYTES = 32 * 2**20


class ResponseTooLarge(Exception):
    """Marks the size cap's read error: `openai` wraps it as a dropped connection, which is retried."""


def http_library() -> ModuleType:
    """The HTTP library this `openai` is built on: httpx, or httpx2 from openai 3 on."""
    base = openai.DefaultHttpxClient.__mro__[1]
    return importlib.import_module(base.__module__.split(".")[0])


def bounded_http_client(total_s: float) -> Any:
    """openai's default HTTP client (its timeouts, connection limits) with the bounds above."""
    http = http_library()

    class TooLarge(http.ReadError, ResponseTooLarge):  # type: ignore[name-defined, misc]
        pass

    class Bounded(http.SyncByteStream):  # type: ignore[name-defined, misc]
        def __init__(self, inner: Any, deadline: float, request: Any):
            self.inner, self.deadline, self.request = inner, deadline, request

        def __iter__(self) -> Iterator[bytes]:
            size = 0
            for chunk in self.inner:
                size += len(chunk)
                if time.monotonic() > self.deadline:
                    raise http.ReadTimeout(f"the response did not arrive whole within {total_s:g} s",
                                           request=self.request)
                if size > MAX_RESPONSE_BYTES:
                    raise TooLarge(f"the response passed {MAX_RESPONSE_BYTES // 2**20} MiB", request=self.request)
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class BoundedClient(openai.DefaultHttpxClient):  # type: ignore[misc, valid-type]
        # Bounded at `send`, not in a transport: httpx mounts its own transport for a proxy from
        # HTTP(S)_PROXY, and a response through it would escape a bound set on the default one.
        def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
            deadline = time.monotonic() + total_s
            response = super().send(request, stream=True, **kwargs)
            response.stream = Bounded(response.stream, deadline, request)
            if not stream:
                try:
                    response.read()
                except BaseException:
                    response.close()
                    raise
            return response

    return BoundedClient(follow_redirects=False, timeout=total_s)

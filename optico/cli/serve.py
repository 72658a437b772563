"""`optico serve` (the REST API, with embedded job workers) and `optico worker` (workers alone)."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from types import FrameType
from typing import Optional

import typer

from optico.cli.common import DatabaseOption, console, err, fail, open_store, whole_number
from optico.errors import SpecError, settings_variable

# uvicorn's levels (trace is its own, below debug).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _family(host: str, port: int) -> int:
    """The address family to listen on, as uvicorn picks it (IPv6 for a host with a colon); one line
    naming --host for a name that does not resolve or holds control characters, before a pool is
    opened or a worker started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError) as exc:
        fail(f"--host: {host[:80]!r} is not an address this machine can listen on "
             f"({getattr(exc, 'strerror', None) or exc})")
    return family


def _listen(host: str, port: int, family: int) -> socket.socket:
    """The bound socket uvicorn serves on. Bound here, before the app starts: uvicorn binds only after
    its startup, so a port in use failed once the workers had claimed a job (left interrupted)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"--port: cannot listen on {host}:{port} ({exc.strerror or exc})")
    sock.set_inheritable(True)
    return sock


def _settings(database: str | None):
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from optico.service.settings import ServiceSettings

    try:
        base = ServiceSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if not first.get("loc"):  # a check across settings: its message names them
            fail(message)
        name = str(first["loc"][0]).upper()
        fail(f"{name if name.startswith('OPTICO_') else 'OPTICO_' + name}: {message}")
    except (SettingsError, RecursionError) as exc:
        # A list setting is read as JSON before it is validated: a bare path fails there, and so does
        # a list nested past the parser's depth (a RecursionError traceback).
        name = settings_variable(exc, "OPTICO_", "OPTICO_FILE_ROOTS")  # the one setting read as JSON
        fail(f"{name}: not valid JSON, or nested past what is read; a list is written as JSON, "
             f"e.g. '[\"/data/optico\"]'")
    return base.model_copy(update={"database_url": database}) if database else base


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (a non-loopback one needs at least "
                                                         "one API token to exist)."),
    port: int = typer.Option(8000, "--port", parser=whole_number(1, 65535), help="Port to listen on."),
    workers: Optional[int] = typer.Option(None, "--workers", parser=whole_number(0, 64),
                                          help="Embedded job workers (default OPTICO_WORKERS, else 1)."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Serve the API only; `optico worker` runs jobs."),
    database: Optional[str] = DatabaseOption,
    log_level: str = typer.Option("info", "--log-level", help=f"Log level: {', '.join(LOG_LEVELS)}."),
) -> None:
    """Serve the REST API (and the job workers) over HTTP."""
    import uvicorn

    from optico.redact import redact
    from optico.service.app import create_app
    from optico.service.http_protocol import with_head_timeout

    if log_level.lower() not in LOG_LEVELS:
        fail(SpecError("--log-level", f"{log_level!r} is not one of {', '.join(LOG_LEVELS)}"))
    log_level = log_level.lower()
    family = _family(host, port)
    settings = _settings(database)
    count = 0 if no_worker else (settings.workers if workers is None else workers)
    no_token = (f"--host {host}: no API token exists, so nobody could use the API; create one first with "
                f"`optico token create NAME --scope write`")
    # Beyond loopback a pool must already hold a token, so a refusal creates no pool; on loopback the
    # first serve creates it (and migrates the schema before the first request).
    store, _ = open_store(settings.database_url, absent=None if _loopback(host) else no_token)
    try:
        no_tokens = not any(t.revoked_at is None for t in store.tokens())
    finally:
        store.close()
    if not _loopback(host) and no_tokens:
        fail(no_token)
    listening = _listen(host, port, family)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console.print(f"optico serve on http://{host}:{port} — {count} worker(s), pool {redact(store.url)}",
                  highlight=False, markup=False)
    config = uvicorn.Config(create_app(settings, workers=count), host=host, port=port, log_level=log_level,
                            proxy_headers=False, server_header=False, http=with_head_timeout(settings.head_timeout_s))
    server = _server_class()(config)
    server.run(sockets=[listening])
    if not server.started:
        raise typer.Exit(3)  # uvicorn.run's startup failure (a port in use): it logged why


def _server_class() -> type:
    """uvicorn's Server, telling the app a shutdown began before it waits for open connections.

    uvicorn stops the app (and with it the workers) only once every connection has closed, and an
    event stream stays open as long as its job runs: SIGTERM with a client following a job waited for
    the client to leave while the worker launched trial after trial. Told first, the app ends its
    streams (clients reconnect elsewhere with Last-Event-ID) and the workers are interrupted at once."""
    import uvicorn

    from optico.service.app import begin_shutdown

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            begin_shutdown(self.config.app)
            super().handle_exit(sig, frame)

    return Server


def worker(
    workers: int = typer.Option(1, "--workers", parser=whole_number(1, 64), help="Worker threads (one job each)."),
    database: Optional[str] = DatabaseOption,
) -> None:
    """Run job workers without the API: claim queued jobs and run them under a lease until stopped."""
    from optico.redact import redact
    from optico.service.worker import WorkerPool

    settings = _settings(database)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store, _ = open_store(settings.database_url)
    pool = WorkerPool(store, store.url, workers, policy=settings.lease, poll_s=settings.worker_poll_s)
    done = threading.Event()

    def shutdown(signum: int, _frame: object) -> None:
        err.print(f"{signal.Signals(signum).name}: interrupting running jobs (they resume on another worker)")
        done.set()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    console.print(f"optico worker: {workers} worker(s) on {redact(store.url)}: "
                  f"{', '.join(w.worker_id for w in pool.workers)}", highlight=False)
    pool.start()
    try:
        while not done.wait(0.5):
            pass
    finally:
        pool.stop()
        store.close()

"""The FastAPI application: a thin layer over the same spec model, store and runner the CLI uses.

`create_app(settings)` opens the pool (migrating it), starts the embedded job workers unless
`workers=0`, and mounts the routers. Errors keep one shape: `{"detail": "..."}` (422: a list of
`{loc, msg, type}`), and a database outage is a 503, never a traceback.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pathlib import Path
from urllib.parse import parse_qsl

import anyio
from fastapi import FastAPI, HTTPException, Request, Response, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from optico import __version__
from optico.input_files import DuplicateKeyError
from optico.pool.contract import StoreError
from optico.pool.store import SqlStore
from optico.redact import redact, scrub
from optico.service import dashboard
from optico.service.dashboard.session import LoginRequired, login_redirect
from optico.service.deps import bearer, current_token
from optico.service.routes import events, jobs, ops, schedules
from optico.service.scheduler import Scheduler
from optico.service.settings import ServiceSettings
from optico.service.worker import WorkerPool

log = logging.getLogger("optico.service")
STATIC = Path(__file__).resolve().parent / "dashboard" / "static"
# Pages load only what this server serves: no CDN, no inline script (data travels in JSON blocks).
# Plotly inserts <style> elements, hence 'unsafe-inline' for styles only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
# FastAPI's /docs and /redoc pages load Swagger UI / ReDoc from jsDelivr and start them with an
# inline script; they show no user data, so only they may.
DOCS_PATHS = ("/docs", "/redoc")
# Headers a request may give once: two copies are read differently by Starlette and by a proxy or a log.
SINGLE_HEADERS = ("authorization", "idempotency-key")
DOCS_CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
            "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com; "
            "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly; "
            "font-src https://fonts.gstatic.com; connect-src 'self'; worker-src blob:; frame-ancestors 'none'; "
            "base-uri 'none'")

DESCRIPTION = """Tune Megatron training configurations as a shared service.

Every `/api` endpoint needs `Authorization: Bearer <token>` (`optico token create NAME --scope read|write`);
writes need a write token. Jobs are run by workers holding a lease; follow one live with
`GET /api/v1/jobs/{id}/events` (server-sent events, resumable with `Last-Event-ID`)."""


def create_app(settings: ServiceSettings | None = None, *, workers: int | None = None) -> FastAPI:
    """The app; `workers` overrides `settings.workers` (0: API only)."""
    settings = settings or ServiceSettings()
    count = settings.workers if workers is None else workers

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Here, after uvicorn has configured its loggers: a token sent in a query string (refused, but
        # sent) must not reach the access log.
        access = logging.getLogger("uvicorn.access")
        if not any(isinstance(f, RedactedAccessLog) for f in access.filters):
            access.addFilter(RedactedAccessLog())
        store = SqlStore(settings.database_url)
        app.state.store, app.state.settings = store, settings
        pool = WorkerPool(store, store.url, count, policy=settings.lease, poll_s=settings.worker_poll_s)
        pool.start()
        app.state.workers = pool
        scheduler = Scheduler(store, poll_s=settings.scheduler_poll_s, lock_s=settings.lease_s) \
            if settings.scheduler else None
        if scheduler is not None:
            scheduler.start()
        try:
            yield
        finally:
            if scheduler is not None:
                scheduler.stop()
            pool.stop()
            store.close()

    app = OptiCoAPI(title="OptiCo", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes)
    app.state.settings = settings
    app.state.open_event_streams = 0  # counted by routes.events.event_stream_slot
    app.state.shutting_down = False  # set by begin_shutdown: event streams end
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(ops.router)
    app.include_router(schedules.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(LoginRequired)
    async def to_login(_: Request, exc: LoginRequired) -> Response:
        return login_redirect(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own handler echoes each bad value back; a non-finite number (1e400, NaN) or a
        # huge nested one cannot or should not be: it becomes its repr, cut short. A rejected value
        # may be a credential sent in the wrong place: every text is redacted.
        refused = await _unauthenticated_api_call(request)
        if refused is not None:
            return refused
        errors = jsonable_encoder([_shown_error(request, e) for e in exc.errors()])
        return JSONResponse({"detail": scrub(errors)}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)

    @app.exception_handler(StarletteHTTPException)
    async def redacted_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI answers a JSON body it could not decode (not UTF-8, nested past the interpreter's
        # limit, an integer of thousands of digits) with a bare 400 "error parsing the body": said
        # here as the 422 every other bad body gets, with the reason.
        problem = _body_problem(exc.__cause__) if exc.status_code == status.HTTP_400_BAD_REQUEST else None
        # An undecodable body, or a chunked one counted past the limit: anonymous, the 401 comes first.
        if problem is not None or exc.status_code == status.HTTP_413_CONTENT_TOO_LARGE:
            refused = await _unauthenticated_api_call(request)
            if refused is not None:
                return refused
        if problem is not None:
            return JSONResponse({"detail": [{"loc": ["body"], "msg": problem, "type": "json_invalid"}]},
                                status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
        # Details quote what was refused ("unknown GPU '...'", a schedule's cron): redacted like every text.
        return await http_exception_handler(request, StarletteHTTPException(
            exc.status_code, detail=scrub(exc.detail), headers=exc.headers))

    @app.middleware("http")
    async def refuse_ambiguous_requests(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        # Two Authorization (or Idempotency-Key) headers: Starlette reads the first, a proxy or a log
        # may read the other.
        for header in SINGLE_HEADERS:
            if len(request.headers.getlist(header)) > 1:
                return JSONResponse({"detail": f"header {header}: given more than once"},
                                    status_code=status.HTTP_400_BAD_REQUEST)
        refused = _refused_parameter(request)
        if refused is not None:
            answered = await _unauthenticated_api_call(request)  # the token first, as for every bad request
            if answered is not None:
                return answered
            where, why = refused
            return JSONResponse({"detail": [{"loc": list(where), "msg": why, "type": "value_error"}]},
                                status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
        return await call_next(request)

    @app.middleware("http")
    async def allow_every_method(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        # Starlette's 405 names the methods of the first route on the path only (GET for
        # /jobs/{id}, which also takes PATCH): a client reading Allow must see them all. Every API
        # operation, HEAD included, is in the schema.
        response = await call_next(request)
        if response.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            refused = await _unauthenticated_api_call(request)  # an API's methods are for its token holders
            if refused is not None:
                return refused
            path = request.scope["path"].removeprefix(request.scope.get("root_path", "")) or "/"
            methods = {m.strip() for m in response.headers.get("Allow", "").split(",") if m.strip()}
            methods |= {m.upper() for template, operations in app.openapi()["paths"].items()
                        if compile_path(template)[0].fullmatch(path) for m in operations}
            if methods:
                response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.middleware("http")
    async def security_headers(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if response.headers.get("content-type", "").startswith("text/html"):
            docs = request.url.path in DOCS_PATHS
            response.headers.setdefault("Content-Security-Policy", DOCS_CSP if docs else CSP)
            response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    @app.exception_handler(StoreError)
    async def database_down(_: Request, exc: StoreError) -> JSONResponse:
        return _database_down(exc)

    return app


def begin_shutdown(app: FastAPI) -> None:
    """The server was told to stop (SIGTERM, Ctrl-C): event streams end now, rather than hold the
    shutdown (and the workers' interruption) until their jobs end; clients reconnect elsewhere."""
    app.state.shutting_down = True


class OptiCoAPI(FastAPI):
    """FastAPI with the body limit's 413 in our error shape, answered before anything reads the body."""

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        stack = ContentLengthGate(stack, self.max_body_size) if self.max_body_size is not None else stack
        return QuietDisconnects(stack)


def _database_down(exc: StoreError) -> JSONResponse:
    log.warning("database error: %s", redact(str(exc)))
    return JSONResponse({"detail": "the pool's database is unavailable; retry later"},
                        status_code=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "5"})


async def _unauthenticated_api_call(request: Request) -> Response | None:
    """The 401 an API request without a valid token gets, for an error found before its token was
    checked: FastAPI decodes a JSON body before it runs any dependency, so `{bad` sent anonymously
    would be answered about its JSON, not its missing token. The API's own token check, run here;
    None when the token is good (or the path is not the API's)."""
    if not request.url.path.startswith("/api/"):
        return None
    try:  # (an error raised inside an exception handler would be a bare 500)
        await run_in_threadpool(current_token, request.app.state.store, await bearer(request))
    except HTTPException as exc:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    except StoreError as exc:
        return _database_down(exc)
    return None


class ContentLengthGate:
    """Refuses a request whose Content-Length is over the limit with a JSON 413. Starlette's own body
    limiter (inside it, still counting chunked bodies) answers that case with a text/plain response
    that replaces whatever the app started, our handlers' JSON included."""

    def __init__(self, app: ASGIApp, max_body_size: int) -> None:
        self.app, self.max_body_size = app, max_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            declared = dict(scope["headers"]).get(b"content-length", b"").strip()
            if declared.isdigit() and (len(declared) > 18 or int(declared) > self.max_body_size):
                response = JSONResponse({"detail": f"the request body is over {self.max_body_size} bytes"},
                                        status_code=status.HTTP_413_CONTENT_TOO_LARGE,
                                        headers={"X-Content-Type-Options": "nosniff", "Connection": "close"})
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class QuietDisconnects:
    """Ends a request quietly when its client has gone. FastAPI tears an event stream down after its
    response; when the client left with events still buffered, its keepalive task finds nobody reading
    and raises anyio.BrokenResourceError (fastapi/routing.py, `_keepalive_inserter`); a client that
    leaves, or is cut off (`http_protocol`), halfway through sending a body makes Starlette raise
    ClientDisconnect where the body is read. Each was a traceback in the server's log for every closed
    tab or dropped connection. Only those errors are dropped, and only once the server has said the
    client is gone (`http.disconnect`); outermost, to see the server's own word."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        gone = False

        async def watched() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        try:
            await self.app(scope, watched, send)
        except ClientDisconnect:
            if not gone:
                raise
        except BaseExceptionGroup as group:
            _, other = group.split((anyio.BrokenResourceError, ClientDisconnect))
            if other is not None or not gone:
                raise


class RedactedAccessLog(logging.Filter):
    """Redacts the request line (and every other string argument) of an access-log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def _body_problem(cause: BaseException | None) -> str | None:
    """Why a JSON body could not be decoded, from the error FastAPI's 400 was raised from (None: not
    a decoding error)."""
    if isinstance(cause, UnicodeDecodeError):
        return "the body is not UTF-8 text"
    if isinstance(cause, DuplicateKeyError):
        return f"the body gives a {cause}"
    if isinstance(cause, RecursionError):
        return "the body is nested too deep"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return "the body holds an integer with too many digits"
    if isinstance(cause, ValueError):
        return "the body is not valid JSON"
    return None


def _shown_error(request: Request, error: dict) -> dict:
    """One validation error as the 422 shows it: its rejected value echoed as `_echo` allows, a header's
    or a webhook URL's not at all (a key, a credential, a receiver's token path). FastAPI
    decodes a body as JSON only when its Content-Type says JSON; otherwise the model is given the raw
    bytes, and its error ("a valid dictionary") hides why: that one names the Content-Type instead."""
    if tuple(error.get("loc", ())) == ("body",) and isinstance(error.get("input"), bytes):
        kind = request.headers.get("content-type", "").split(";")[0].strip()[:60]
        return {"loc": ["body"], "msg": f"the body was sent as {kind!r}; send it as application/json",
                "type": "content_type"}
    if error.get("type") == "json_invalid":  # FastAPI's own: it echoes an empty object, never sent
        at = error["loc"][1] if len(error.get("loc", ())) > 1 else None
        where = f" at character {at}" if isinstance(at, int) else ""
        return {"loc": ["body"], "msg": f"the body is not valid JSON: {(error.get('ctx') or {}).get('error', '')}{where}",
                "type": "json_invalid"}
    loc = tuple(error.get("loc", ()))
    # An Idempotency-Key, and a webhook URL (its path is the receiver's secret), are never quoted.
    if loc[:1] == ("header",) or loc[-1:] == ("webhook_url",):
        return {k: v for k, v in error.items() if k not in ("input", "ctx")}
    return {**error, "input": _echo(error["input"])} if "input" in error else error


def _echo(value: object) -> object:
    """A rejected value as the 422 may show it: JSON scalars as they are, an object by its keys only (a
    missing field's error quotes the whole object around it, a webhook URL or an env value included), a
    list holding containers by its length, anything else (a non-finite float, a list of scalars) as its
    repr, at most 200 characters."""
    if value is None or isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    if isinstance(value, dict):
        return redact("an object with keys " + ", ".join(map(str, value)))[:200]
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        return f"a list of {len(value)} items"  # its objects may hold what an object's keys-only echo hides
    return redact(value if isinstance(value, str) else repr(value))[:200]  # redacted, then cut


def _refused_parameter(request: Request) -> tuple[tuple[str, ...], str] | None:
    """Where the request's path or query holds what the API refuses, and why: a NUL (in no name or key
    OptiCo stores, and PostgreSQL refuses to bind one, which read as a database outage), or an API
    query parameter given twice (FastAPI keeps the last, a proxy or a log may have read the first; no
    API parameter is a list). The dashboard's /compare takes `job` repeated, so only /api/ is checked."""
    if "\x00" in request.scope["path"]:  # percent-decoded
        return ("path",), "contains a NUL character"
    api, seen = request.url.path.startswith("/api/"), set()
    for name, value in parse_qsl(request.url.query, keep_blank_values=True):
        if "\x00" in name or "\x00" in value:
            return ("query", redact(name.replace("\x00", "\\0"))[:200]), "contains a NUL character"
        if api and name in seen:
            return ("query", redact(name)[:200]), "given more than once"
        seen.add(name)
    return None

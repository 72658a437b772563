"""The FastAPI application: a thin layer over the same spec model, store and runner the CLI uses.

`create_app(settings)` opens the pool (migrating it), starts the embedded job workers unless
`workers=0`, and mounts the routers. Errors keep one shape: `{"detail": "..."}` (422: a list of
`{loc, msg, type}`), and a database outage is a 503, never a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pathlib import Path

from fastapi import FastAPI, Request, Response, status
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from optico import __version__
from optico.pool.contract import StoreError
from optico.pool.store import SqlStore
from optico.redact import redact
from optico.service import dashboard
from optico.service.dashboard.session import LoginRequired, login_redirect
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

    app = FastAPI(title="OptiCo", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  max_body_size=settings.max_body_bytes)
    app.state.settings = settings
    app.include_router(jobs.router)
    app.include_router(events.router)
    app.include_router(ops.router)
    app.include_router(schedules.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(LoginRequired)
    async def to_login(_: Request, exc: LoginRequired) -> Response:
        return login_redirect(exc)

    @app.middleware("http")
    async def security_headers(request: Request, call_next):  # noqa: ANN001, ANN202 - Starlette's signature
        response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if response.headers.get("content-type", "").startswith("text/html"):
            response.headers.setdefault("Content-Security-Policy", CSP)
            response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    @app.exception_handler(StoreError)
    async def database_down(_: Request, exc: StoreError) -> JSONResponse:
        log.warning("database error: %s", redact(str(exc)))
        return JSONResponse({"detail": "the pool's database is unavailable; retry later"},
                            status_code=status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "5"})

    return app

"""Request dependencies: the store, the settings, and bearer tokens with read or write scope.

    StoreDep ── ReadToken (401 without a valid token) ── WriteToken (403 for a read token)
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator

from optico.pool.contract import Store
from optico.pool.records import JobRecord, TokenRecord
from optico.service.settings import ServiceSettings
from optico.sql_limits import SQL_INT_MAX

bearer = HTTPBearer(auto_error=False, description="An API token from `optico token create NAME --scope read|write`.")


def get_store(request: Request) -> Store:
    return request.app.state.store


def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def current_token(store: StoreDep,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> TokenRecord:
    if credentials is None:
        raise _unauthorized("a bearer token is required (optico token create NAME --scope read|write)")
    record = store.authenticate(credentials.credentials)
    if record is None:
        raise _unauthorized("the token is unknown or revoked")
    return record


ReadToken = Annotated[TokenRecord, Depends(current_token)]


def write_token(token: ReadToken) -> TokenRecord:
    if not token.can_write:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail=f"token {token.name!r} has read scope; this needs write")
    return token


WriteToken = Annotated[TokenRecord, Depends(write_token)]


def optional_token(request: Request, store: StoreDep,
                   credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
    """For /metrics and the health checks: a read token unless the settings open them."""
    settings: ServiceSettings = request.app.state.settings
    path = request.url.path
    open_ = settings.open_metrics if path.startswith("/metrics") else settings.open_health
    if not open_:
        current_token(store, credentials)


def _digits(value: object) -> object:
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number written in digits")
    return value


# An integer in a path or query is written in digits only: Python's int() also takes '1_0', '+1',
# ' 1' and pydantic '1.0', so /jobs/1_0 answered for job 10.
DIGITS = BeforeValidator(_digits)
# Every integer the API takes in a path or query is bounded by the pool's INTEGER columns.
JobIdPath = Annotated[int, DIGITS, Path(ge=1, le=SQL_INT_MAX, description="The job's id.")]
TrialIndexPath = Annotated[int, DIGITS, Path(ge=0, le=SQL_INT_MAX, description="The trial's index in its job.")]


def existing_job(job_id: JobIdPath, store: StoreDep) -> JobRecord:
    try:
        return store.get_job(job_id)
    except KeyError:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job {job_id}") from None


JobDep = Annotated[JobRecord, Depends(existing_job)]

"""The dashboard's login: an API token typed once, kept for the browser session.

The token goes into a session cookie (no expiry: gone when the browser closes), `HttpOnly` (page
scripts cannot read it) and `SameSite=Strict` (no other site can make the browser send it). Pages
and the dashboard's own GET endpoints authenticate with it; the `/api` endpoints accept only the
Authorization header, so a cookie can never be used to write through the API.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request
from fastapi.responses import RedirectResponse

from optico.pool.records import TokenRecord
from optico.service.deps import StoreDep

COOKIE = "optico_session"


class LoginRequired(Exception):
    """Raised by `viewer` for a visitor without a valid session; answered with a redirect to /login."""

    def __init__(self, next_path: str):
        self.next_path = next_path


def safe_next(path: str | None) -> str:
    """A local path to go back to after login (never another site: no scheme, no //host)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path


def viewer(request: Request, store: StoreDep) -> TokenRecord:
    token = request.cookies.get(COOKIE)
    record = store.authenticate(token) if token else None
    if record is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)
    return record


Viewer = Annotated[TokenRecord, Depends(viewer)]


def login_redirect(exc: LoginRequired) -> RedirectResponse:
    return RedirectResponse(f"/login?next={quote(safe_next(exc.next_path), safe='/')}", status_code=303)


async def read_form(request: Request, limit: int = 8192) -> dict[str, str]:
    """An urlencoded form body, bounded (no multipart parser needed for one field)."""
    body = (await request.body())[:limit]
    return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}


def start_session(response: RedirectResponse, token: str, *, secure: bool) -> None:
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=secure, path="/")


def end_session(response: RedirectResponse) -> None:
    response.delete_cookie(COOKIE, path="/")

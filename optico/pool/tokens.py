"""The pool's API tokens in SQL: `SqlStore` takes these methods from `TokenSql`.

Kept apart from store.py (jobs, trials, events) because tokens are their own resource: the pool keeps
a token's hash and first characters, never the token; a revoked token keeps its name, so the list
shows who had access. The contract is in `Store` (contract.py).
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optico import redact
from optico.pool.contract import StoreError
from optico.pool.models import TokenRow
from optico.pool.records import TokenRecord

TOKEN_SCOPES = ("read", "write")
# A token's last use is written at most this often: a write per request would serialise readers on SQLite.
TOKEN_TOUCH_S = 60.0


def token_name_problem(name: str) -> str | None:
    """Why `name` cannot name an API token, or None (the CLI asks before it opens the pool)."""
    if not (name and len(name) <= 128 and name.isprintable()):
        return "1 to 128 printable characters"
    if redact.redact(name) != name:
        # Stored as it is, a key pasted as a name would be listed to everyone who reads tokens; stored
        # masked, `token revoke NAME` could not find it.
        return "looks like a secret (it would be shown as ***); choose another name"
    return None


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _token(row: TokenRow) -> TokenRecord:
    return TokenRecord(id=row.id, name=row.name, scope=row.scope, prefix=row.prefix, created_at=row.created_at,
                       last_used_at=row.last_used_at, revoked_at=row.revoked_at)


class TokenSql:
    """The token half of `SqlStore` (see `Store` for the contract); uses its session helpers."""

    if TYPE_CHECKING:  # provided by SqlStore
        _touch_attempts: dict[int, float]
        def _session(self, *, read: bool = False) -> Any: ...
        def _now(self, s: Session) -> datetime: ...
        def _stamp(self, value: datetime) -> datetime: ...

    def create_token(self, name: str, scope: str) -> tuple[TokenRecord, str]:
        if scope not in TOKEN_SCOPES:
            raise ValueError(f"scope: must be read or write, got {scope!r}")
        problem = token_name_problem(name)
        if problem:
            raise ValueError(f"name: {problem}")
        token = f"optico_{scope[0]}_{_secrets.token_urlsafe(32)}"
        redact.register(token)
        try:
            with self._session() as s:
                row = TokenRow(name=name, scope=scope, token_hash=_token_hash(token), prefix=token[:12])
                s.add(row)
                s.flush()
                return _token(row), token
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                # A revoked token keeps its name (token list shows who had access): a name is used once.
                revoked = any(r.name == name and r.revoked_at is not None for r in self.tokens())
                state = "was revoked (its name stays in the record)" if revoked else "exists"
                raise ValueError(f"name: a token named {name!r} {state}; pick another name") from None
            raise

    def authenticate(self, token: str) -> TokenRecord | None:
        if not token or len(token) > 256:
            return None
        digest = _token_hash(token)
        with self._session(read=True) as s:  # every request authenticates: a read that never queues
            row = s.scalars(select(TokenRow).where(TokenRow.token_hash == digest)).first()
            if row is None or row.revoked_at is not None:
                return None
            now = self._now(s)
            record = _token(row)
        last = record.last_used_at
        if last is None or (now - last).total_seconds() > TOKEN_TOUCH_S:
            # "Last used" is written at most once a minute per token, and it is no reason to refuse a
            # request: on SQLite a writer holding the lock (a paused worker) made every authenticated
            # request, reads included, wait the busy timeout and answer 503. A failed write is tried
            # again only a minute later, so only one request a minute waits.
            attempted = self._touch_attempts.get(record.id)
            if attempted is None or time.monotonic() - attempted > TOKEN_TOUCH_S:
                self._touch_attempts[record.id] = time.monotonic()
                try:
                    with self._session() as s:
                        s.execute(update(TokenRow).where(TokenRow.id == record.id)
                                  .values(last_used_at=self._stamp(now)))
                    record = record.model_copy(update={"last_used_at": now})
                except StoreError:
                    pass
        return record

    def tokens(self) -> list[TokenRecord]:
        with self._session(read=True) as s:
            return [_token(r) for r in s.scalars(select(TokenRow).order_by(TokenRow.id))]

    def revoke_token(self, name: str) -> TokenRecord:
        with self._session() as s:
            row = s.scalars(select(TokenRow).where(TokenRow.name == name)).first()
            if row is None:
                raise KeyError(f"no token named {name!r}")
            if row.revoked_at is None:
                row.revoked_at = self._stamp(self._now(s))
                s.flush()
            return _token(row)

"""/api/v1/jobs/{id}/events: the job's event log as server-sent events.

Each event carries `id: <seq>` (1, 2, ... per job, in commit order), `event: <kind>` and the event as
JSON. A client that reconnects with `Last-Event-ID` (or `?after=`) gets exactly the events after it:
no loss, no repeats. When the job has ended and every event was sent, the stream sends one `end`
event and closes, so clients stop reconnecting. A job submitted to the queue and interrupted (its
worker shut down) has not ended: a worker takes it again, and the stream goes on. A job cancelled
while its worker looked alive ends once that worker has let go or its lease has expired: then the
stream settles it itself (its running trial lost, `job_done`), for a pool with no worker left.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from optico.pool.contract import Store
from optico.pool.lifecycle import JobStatus
from optico.pool.records import JobRecord
from optico.service.deps import DIGITS, SQL_INT_MAX, JobDep, ReadToken, SettingsDep, StoreDep, bearer
from optico.service.settings import ServiceSettings

router = APIRouter(prefix="/api/v1/jobs", tags=["events"])
BATCH = 500
# The stream's own events, besides the job's (optico/events.py): the job ended and all was sent; the
# token the stream was opened with was revoked.
END = "end"
SESSION_ENDED = "session_ended"


def may_end(job: JobRecord) -> bool:
    """Whether the job's stream may end: its status is final, except a queue job interrupted (its worker
    shut down, a rolling restart), which the next worker runs on. The API stream and the dashboard's
    pages both read this, so a page opened on an interrupted job follows it too."""
    return job.status.final and not (job.status is JobStatus.INTERRUPTED and job.origin == "queue")


def resume_point(after: int | None, last_event_id: str | None) -> int:
    """Where a (re)connecting client resumes: its Last-Event-ID when that is a seq (ASCII digits),
    else `?after=`, else the start; shared by the API and the dashboard."""
    text = (last_event_id or "").strip()
    if re.fullmatch(r"[0-9]{1,32}", text):
        return min(int(text), SQL_INT_MAX)
    return after or 0


async def event_stream_slot(request: Request, settings: SettingsDep) -> AsyncIterator[None]:
    """One of the server's `max_event_streams` open streams, held until the response ends; 503 when
    every one is taken (each stream polls the pool: a thousand of them starved every other request)."""
    state = request.app.state
    if state.open_event_streams >= settings.max_event_streams:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "5"},
                            detail=f"{settings.max_event_streams} event streams are open, the most this server "
                                   f"serves; retry later")
    state.open_event_streams += 1
    try:
        yield
    finally:
        state.open_event_streams -= 1


EventStreamSlot = Annotated[None, Depends(event_stream_slot)]


@router.get("/{job_id}/events", response_class=EventSourceResponse,
            responses={503: {"description": "Every event stream this server serves is open; retry later."}})
async def stream_events(request: Request, _: ReadToken, job: JobDep, store: StoreDep, settings: SettingsDep,
                        __: EventStreamSlot,
                        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                        after: Annotated[int | None, DIGITS, Query(ge=0, le=SQL_INT_MAX,
                                                           description="Send events after this seq.")] = None,
                        last_event_id: Annotated[str | None, Header(max_length=32)] = None,
                        ) -> AsyncIterator[ServerSentEvent]:
    """Follows the job live: state changes, trial starts and results, agent outputs, fallbacks."""
    token = credentials.credentials if credentials else ""  # ReadToken let the request in: never empty
    async for item in job_event_stream(request, store, settings, job.id, resume_point(after, last_event_id), token):
        yield item


async def job_event_stream(request: Request, store: Store, settings: ServiceSettings, job_id: int,
                           last: int, token: str) -> AsyncIterator[ServerSentEvent]:
    """The events of job `job_id` after seq `last`, then live ones, until the job has ended (see the
    module docstring); shared by the API and the dashboard. `token`: what the stream was opened with;
    once it is revoked the stream sends `session_ended` (not `end`: the job goes on) and closes, and the
    client's reconnect is refused (a stream lasts as long as its job, days on a cluster)."""
    quiet_since = checked = time.monotonic()
    yield ServerSentEvent(comment="optico event stream", retry=3000)
    # A server shutting down ends the stream without `end`: the job has not ended, and the client
    # reconnects (to another replica) with Last-Event-ID.
    while not request.app.state.shutting_down and not await request.is_disconnected():
        if time.monotonic() - checked >= settings.sse_recheck_s:
            checked = time.monotonic()
            if await run_in_threadpool(store.authenticate, token) is None:
                # Said before closing, so that a browser does not reconnect into the login page.
                yield ServerSentEvent(data={"reason": "token revoked"}, event=SESSION_ENDED)
                return
        batch = await run_in_threadpool(store.events, job_id, last, BATCH)
        for stored in batch:
            last = stored.seq
            yield ServerSentEvent(data=stored.event.model_dump(mode="json"), event=stored.kind, id=str(stored.seq))
        if len(batch) == BATCH:
            continue
        current = await run_in_threadpool(store.get_job, job_id)
        # Ended: final, no worker still writing (a cancelled job's worker records its lost trial first).
        # A lease that expired on a cancelled job belongs to a worker that is gone: the stream settles
        # the job as a claimer would (its trial lost, job_done) and sends that before it ends. A queue
        # job that was interrupted (its worker shut down, a rolling restart) has not ended: the next
        # worker runs it on.
        if may_end(current) and (
                current.lease_owner is None or not current.lease_live(await run_in_threadpool(store.db_now))):
            if current.lease_owner is not None and await run_in_threadpool(store.settle_abandoned_cancels, job_id):
                continue  # send what settling wrote
            tail = await run_in_threadpool(store.events, job_id, last, BATCH)
            if not tail:
                yield ServerSentEvent(data={"status": current.status.value}, event=END, id=str(last))
                return
            continue
        if batch:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settings.sse_keepalive_s:
            quiet_since = time.monotonic()
            yield ServerSentEvent(comment="keepalive")
        await asyncio.sleep(settings.sse_poll_s)

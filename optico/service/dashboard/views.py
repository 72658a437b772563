"""The dashboard's pages, server-rendered with Jinja2 (autoescaped), charts drawn in the browser by the
plotly.js of the installed plotly package (no CDN: it works on an air-gapped cluster).

    /                            jobs: filter, sort, paginate (in SQL)
    /jobs/{id}                   MFU and memory per trial, trial table with flag diffs, agent reasoning,
                                 the best flags (copy) and launch script; live through the event stream
    /jobs/{id}/trials/{index}    log excerpt, metrics, predicted vs measured breakdown, fingerprint
    /jobs/{id}/launch.sh         the best configuration's launch script
    /compare?job=1&job=2         best-so-far trajectories side by side; parallel coordinates of one job
    /workloads/{key}             the best MFU per framework version across the workload's jobs
    /ui/...                      what the pages fetch live (GET only, session cookie)
"""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.sse import EventSourceResponse
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.concurrency import run_in_threadpool

from optico.errors import SpecError
from optico.perfmodel.constants import Constants, load_constants
from optico.pool.contract import SORT_KEYS, Store
from optico.pool.lifecycle import JobStatus
from optico.pool.records import JobRecord, JobStats
from optico.report import job_report
from optico.service.dashboard import charts
from optico.service.dashboard.session import COOKIE, Viewer, end_session, read_form, safe_next, start_session
from optico.service.deps import DIGITS, SQL_INT_MAX, JobDep, JobIdPath, SettingsDep, StoreDep, TrialIndexPath
from optico.service.routes.events import EventStreamSlot, job_event_stream, may_end, resume_point
from optico.textsafe import terminal_text
from optico.trial import Trial, TrialStatus

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _visible(value: Any) -> Any:
    """Every text a page prints, before autoescaping: control, escape, bidi and invisible characters
    shown as visible escapes (HTML escaping leaves them, and a U+202E reorders what follows it).
    Markup (a `tojson` block, our own HTML) is ours and passes as it is."""
    return terminal_text(value, max_chars=None) if isinstance(value, str) and not isinstance(value, Markup) else value


templates.env.finalize = _visible
router = APIRouter(include_in_schema=False)
PAGE_SIZE = 50
HISTORY_JOBS = 500  # the workload page's chart and table: its latest jobs


def plotly_js() -> Path:
    """plotly.min.js as the installed plotly package ships it."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def _fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


templates.env.filters["when"] = _fmt_time
templates.env.filters["pct"] = lambda x, digits=1: "" if x is None else f"{100 * x:.{digits}f}%"


def _job_or_404(store: Store, job_id: int) -> JobRecord:
    try:
        return store.get_job(job_id)
    except KeyError:
        raise HTTPException(404, detail=f"no job {job_id}") from None


def _status_text(job: JobRecord, now: datetime) -> str:
    """A running job whose worker stopped renewing its lease says so (it is taken over on expiry)."""
    if job.status.active and not job.lease_live(now):
        return f"{job.status.value} (worker gone)"
    return job.status.value


def _job_line(job: JobRecord, stats: JobStats | None, now: datetime) -> dict[str, Any]:
    stats = stats or JobStats(job_id=job.id)
    w = job.spec.workload
    base = stats.first.mfu if stats.first and stats.first.status is TrialStatus.OK else None
    best = job.best_mfu
    return {"id": job.id, "name": job.name, "status": job.status.value, "status_text": _status_text(job, now),
            "workload": f"{w.model.name} seq {w.seq_length} GBS {w.global_batch_size}", "workload_key": job.workload_key,
            "cluster": f"{w.cluster.nodes_used}×{w.cluster.gpus_per_node} {w.cluster.gpu}",
            "best_mfu": best, "improvement": (best / base - 1) if best and base else None,
            "trials": stats.trials, "failures": stats.failed + stats.lost, "started": job.started_at,
            "finished": job.finished_at}


# -- login -------------------------------------------------------------------------------------

@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> Response:  # noqa: A002 - the query parameter's name
    return templates.TemplateResponse(request, "login.html", {"next": safe_next(next), "error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request, store: StoreDep) -> Response:
    form = await read_form(request)
    token, target = form.get("token", "").strip(), safe_next(form.get("next"))
    record = await run_in_threadpool(store.authenticate, token) if token else None
    if record is None:
        return templates.TemplateResponse(request, "login.html", {"next": target, "error": "unknown or revoked token"},
                                          status_code=401)
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https" or request.app.state.settings.secure_cookies
    start_session(response, token, secure=secure)
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    end_session(response)
    return response


# -- jobs ----------------------------------------------------------------------------------------

@router.get("/", response_class=HTMLResponse)
def jobs_page(request: Request, store: StoreDep, who: Viewer,
              status: Annotated[str | None, Query(max_length=16)] = None,
              name: Annotated[str | None, Query(max_length=255)] = None,
              workload: Annotated[str | None, Query(max_length=64)] = None,
              sort: Annotated[str, Query(max_length=16)] = "id",
              dir: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",  # noqa: A002
              page: Annotated[int, DIGITS, Query(ge=1, le=1_000_000)] = 1) -> Response:
    sort = sort if sort in SORT_KEYS else "id"
    wanted = JobStatus(status) if status in {s.value for s in JobStatus} else None
    jobs, total = store.search_jobs(status=wanted, workload_key=workload or None, name=name or None, sort=sort,
                                    descending=dir == "desc", offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    stats = store.job_stats([j.id for j in jobs])
    now = store.db_now()
    pages = max(1, -(-total // PAGE_SIZE))
    if page > pages:  # a link to page 8 of a list that now has 7: the last page, not "no job matches"
        last = request.url.include_query_params(page=pages)
        return RedirectResponse(f"{last.path}?{last.query}", status_code=303)
    query = {"status": status or "", "name": name or "", "workload": workload or "", "sort": sort, "dir": dir}
    return templates.TemplateResponse(request, "jobs.html", {
        "who": who, "jobs": [_job_line(j, stats.get(j.id), now) for j in jobs], "total": total, "page": page,
        "pages": pages, "query": query, "statuses": [s.value for s in JobStatus], "sort_keys": SORT_KEYS})


def _iterations(store: Store, job_id: int) -> list[dict[str, Any]]:
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for m in store.messages(job_id):
        content = {k: v for k, v in m.content.items() if k != "reasoning"}
        grouped[m.iteration].append({"agent": m.agent, "kind": m.kind, "text": m.text,
                                     "health": content.get("health"), "reasoner": content.get("reasoner"),
                                     "fallback": m.kind == "fallback"})
    return [{"iteration": i, "messages": msgs} for i, msgs in sorted(grouped.items())]


def _constants(job: JobRecord) -> Constants | None:
    """The model's constants for the job's predictions; None when its calibration file can no longer be
    read (moved, edited, or not on this replica): the page then shows what was measured, without them."""
    try:
        return load_constants(job.spec.calibration)
    except SpecError:
        return None


def _baseline_mfu(trials: list[Trial]) -> float | None:
    first = next((t for t in trials if t.index == 1), None)
    return first.mfu if first and first.status is TrialStatus.OK else None


def _done(trials: list[Trial]) -> list[Trial]:
    """The trials with an outcome: a running trial joins the table (live) when it has one."""
    return [t for t in trials if t.status is not TrialStatus.RUNNING]


def _measured(trials: list[Trial]) -> list[float | None]:
    """Each finished trial's MFU, None for a failure: where the MFU chart puts its failures."""
    return [t.mfu if t.status is TrialStatus.OK else None for t in _done(trials)]


def _rows(store: Store, job: JobRecord, trials: list[Trial], *, after: int = 0) -> tuple[list[dict], float | None]:
    trials = _done(trials)
    baseline = _baseline_mfu(trials)
    constants = _constants(job)
    earlier = [t for t in trials if t.index <= after]
    later = [t for t in trials if t.index > after]
    best = charts.best_so_far(earlier)[-1] if earlier else None
    rows = charts.trial_rows(later, job.spec.workload, constants, baseline_mfu=baseline,
                             previous=earlier[-1] if earlier else None, best_so_far=best)
    return rows, baseline


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: JobIdPath, store: StoreDep, who: Viewer) -> Response:
    job = _job_or_404(store, job_id)
    trials = store.trials(job_id)
    rows, baseline = _rows(store, job, trials)
    limit = job.spec.workload.cluster.spec.memory_gib
    report = job_report(store, job_id)
    finished = _done(trials)
    live = {"job_id": job.id, "last_index": finished[-1].index if finished else 0,
            "last_event": store.last_event_seq(job_id),
            "baseline_mfu": baseline, "limit_gib": limit, "final": may_end(job) and job.lease_owner is None,
            "failure_y": charts.failure_floor(_measured(trials), baseline),
            "prediction_cap": charts.PREDICTION_CAP,
            "mfu_traces": list(charts.MFU_TRACES)}
    return templates.TemplateResponse(request, "job.html", {
        "who": who, "job": job, "line": _job_line(job, store.job_stats([job_id]).get(job_id), store.db_now()),
        "rows": rows, "report": report, "iterations": _iterations(store, job_id),
        "mfu_figure": charts.mfu_figure(rows, baseline), "memory_figure": charts.memory_figure(rows, limit),
        "live": live})


@router.get("/jobs/{job_id}/launch.sh")
def launch_script(job_id: JobIdPath, store: StoreDep, who: Viewer) -> Response:
    _job_or_404(store, job_id)
    script = job_report(store, job_id)["launch_script"]
    if script is None:
        raise HTTPException(404, detail=f"job {job_id} has no successful trial yet")
    return PlainTextResponse(script, media_type="text/x-shellscript",
                             headers={"Content-Disposition": f'attachment; filename="optico-job-{job_id}.sh"'})


@router.get("/jobs/{job_id}/trials/{index}", response_class=HTMLResponse)
def trial_page(request: Request, job_id: JobIdPath, index: TrialIndexPath, store: StoreDep, who: Viewer) -> Response:
    job = _job_or_404(store, job_id)
    trial = next((t for t in store.trials(job_id, after_index=index - 1) if t.index == index), None)
    if trial is None:
        raise HTTPException(404, detail=f"job {job_id} has no trial {index}")
    constants = _constants(job)
    prediction = charts.predicted(job.spec.workload, trial, constants)
    breakdown = []
    if prediction is not None:
        t = prediction.time
        for label, value in (("compute", t.compute_s), ("recompute", t.recompute_s),
                             ("communication (TP, CP, EP, DP)", t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + t.dp_comm_s),
                             ("pipeline bubble and p2p", t.pp_bubble_s + t.p2p_s),
                             ("optimizer and overhead", t.optimizer_s + t.overhead_s)):
            breakdown.append({"label": label, "seconds": value, "share": value / t.step_time_s if t.step_time_s else 0})
    return templates.TemplateResponse(request, "trial.html", {
        "who": who, "job": job, "trial": trial, "prediction": prediction, "breakdown": breakdown,
        "calibration_unreadable": constants is None,
        "megatron_args": " ".join(trial.strategy.megatron_args())})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, store: StoreDep, who: Viewer,
                 job: Annotated[list[Annotated[int, DIGITS]], Query(max_length=20)] = [],  # noqa: B006 - FastAPI's list query
                 jobs: Annotated[str, Query(max_length=200, description="Comma-separated ids.")] = "",
                 parallel: Annotated[int | None, DIGITS, Query(ge=1, le=SQL_INT_MAX)] = None) -> Response:
    # ASCII digits only: '²' is a digit to str.isdigit but not to int().
    ids = [*job, *(int(x) for x in jobs.replace(" ", "").split(",") if re.fullmatch(r"[0-9]{1,10}", x))][:20]
    wanted = list(dict.fromkeys(ids))
    chosen = [store.get_job(i) for i in wanted if _exists(store, i)]
    missing = [i for i in wanted if i not in {j.id for j in chosen}]  # said, not silently replaced
    if not ids:
        chosen = store.list_jobs(limit=3)
    series = [(f"#{j.id} {j.name}", store.trials(j.id)) for j in chosen]
    focus = next((j for j in chosen if j.id == parallel), chosen[0] if chosen else None)
    figure_parallel = charts.parallel_figure(store.trials(focus.id)) if focus else None
    return templates.TemplateResponse(request, "compare.html", {
        "who": who, "jobs": chosen, "missing": missing, "compare_figure": charts.compare_figure(series),
        "focus": focus, "parallel_figure": figure_parallel})


def _exists(store: Store, job_id: int) -> bool:
    if not 0 < job_id <= SQL_INT_MAX:  # ids typed into the compare page's query: no such row
        return False
    try:
        store.get_job(job_id)
    except KeyError:
        return False
    return True


@router.get("/workloads/{key}", response_class=HTMLResponse)
def workload_page(request: Request, key: str, store: StoreDep, who: Viewer) -> Response:
    # The latest HISTORY_JOBS, oldest first: a workload retuned for years has more, and its history
    # must reach today (the oldest first cut the newest off).
    latest, total = store.search_jobs(workload_key=key, sort="created_at", descending=True, limit=HISTORY_JOBS)
    jobs = latest[::-1]
    if not jobs:
        raise HTTPException(404, detail=f"no jobs on workload {key[:100]}")
    stats = store.job_stats([j.id for j in jobs])
    points = []
    for j in jobs:
        best = stats[j.id].best if j.id in stats else None
        if best is None or best.mfu is None:
            continue
        points.append({"job": j.id, "name": j.name, "version": _version(best.fingerprint), "mfu": best.mfu,
                       "when": j.finished_at or j.created_at, "strategy": best.strategy.short()})
    ticks = [{"schedule": s.name, "id": t.id, "when": t.started_at, "outcome": t.outcome or t.status,
              "version": _version(t.fingerprint or {}), "before": t.mfu_before, "after": t.mfu_after,
              "regression_pct": t.regression_pct, "retune_job": t.retune_job_id, "new_best": t.new_best_mfu}
             for s in store.list_schedules() if s.workload_key == key for t in store.ticks(s.id, limit=200)]
    ticks.sort(key=lambda t: t["id"])  # in the order they ticked
    figure = _history_figure(points, ticks)
    return templates.TemplateResponse(request, "workload.html", {
        "who": who, "key": key, "description": jobs[0].spec.workload.describe(), "points": points,
        "total": total, "shown": len(jobs),
        "ticks": ticks, "history_figure": figure})


def _version(fingerprint: dict[str, Any]) -> str:
    """The framework a measurement ran under, as a short label."""
    return str(fingerprint.get("framework_version") or fingerprint.get("megatron_core") or "unknown")


def _history_figure(points: list[dict[str, Any]], ticks: list[dict[str, Any]]) -> dict[str, Any]:
    """Each job's best MFU over time, one trace per framework version; the incumbent (best so far) as a step;
    each schedule tick's re-measurement of the incumbent, and each retune's new best."""
    by_version: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_version[p["version"]].append(p)
    data = [{"type": "scatter", "mode": "markers", "name": charts.plotly_text(f"version {version}"),
             "x": [p["when"].isoformat() for p in ps], "y": [round(100 * p["mfu"], 2) for p in ps],
             "text": [charts.plotly_text(f"#{p['job']} {p['name']}: {p['strategy']}") for p in ps],
             "marker": {"size": 10}}
            for version, ps in by_version.items()]
    incumbent, best = [], None
    for p in points:
        best = p["mfu"] if best is None else max(best, p["mfu"])
        incumbent.append(round(100 * best, 2))
    data.append({"type": "scatter", "mode": "lines", "name": "incumbent", "line": {"shape": "hv", "dash": "dot"},
                 "x": [p["when"].isoformat() for p in points], "y": incumbent})
    measured = [t for t in ticks if t["after"] is not None]
    if measured:
        data.append({"type": "scatter", "mode": "markers", "name": "incumbent re-measured (tick)",
                     "x": [t["when"].isoformat() for t in measured], "y": [round(100 * t["after"], 2) for t in measured],
                     "text": [charts.plotly_text(f"{t['schedule']}: {t['outcome']} under {t['version']}")
                              for t in measured],
                     "marker": {"symbol": "diamond-open", "size": 12, "color": "#cf222e"}})
    retuned = [t for t in ticks if t["new_best"] is not None]
    if retuned:
        data.append({"type": "scatter", "mode": "markers", "name": "retune's best",
                     "x": [t["when"].isoformat() for t in retuned], "y": [round(100 * t["new_best"], 2) for t in retuned],
                     "text": [charts.plotly_text(f"{t['schedule']}: job {t['retune_job']}") for t in retuned],
                     "marker": {"symbol": "star", "size": 13, "color": "#1a7f37"}})
    return {"data": data, "layout": {"yaxis": {"title": {"text": "best MFU %"}}, "margin": {"t": 30, "r": 20, "b": 50,
                                                                                        "l": 60},
                                     "legend": {"orientation": "h", "y": 1.12}}}


# -- what the pages fetch live --------------------------------------------------------------------

@router.get("/ui/jobs/{job_id}/rows")
def new_rows(job_id: JobIdPath, store: StoreDep, who: Viewer,
             after: Annotated[int, DIGITS, Query(ge=0, le=SQL_INT_MAX)] = 0) -> dict[str, Any]:
    """Trial rows after index `after` (only what is new), the job's status line and stop reason, and what
    the MFU chart's earlier points depend on: where failures sit, the baseline's line."""
    job = _job_or_404(store, job_id)
    trials = store.trials(job_id)
    rows, baseline = _rows(store, job, trials, after=after)
    report = job_report(store, job_id)
    best = None if report["best"] is None else {
        "trial": report["best"]["trial"], "mfu": report["best"]["mfu"], "megatron_args": report["best"]["megatron_args"],
        "improvement": report["improvement_over_baseline"]}
    return {"rows": rows, "status": _status_text(job, store.db_now()), "final": may_end(job), "best": best,
            "stop_reason": job.stop_reason, "failure_y": charts.failure_floor(_measured(trials), baseline),
            "baseline_mfu": baseline, "baseline_marks": charts.baseline_marks(baseline)}


@router.get("/ui/jobs/{job_id}/events", response_class=EventSourceResponse)
async def live_events(request: Request, who: Viewer, job: JobDep, store: StoreDep, settings: SettingsDep,
                      _slot: EventStreamSlot, after: Annotated[int, DIGITS, Query(ge=0, le=SQL_INT_MAX)] = 0):
    # The job is looked up by a dependency, before the stream starts: an unknown one is a 404, not a
    # stream that breaks after its headers were sent (which a browser retries every few seconds).
    last = request.headers.get("last-event-id")
    token = request.cookies.get(COOKIE, "")  # `who` was read from it
    async for item in job_event_stream(request, store, settings, job.id, resume_point(after, last), token):
        yield item


@router.get("/favicon.ico")
def favicon() -> Response:
    return Response(status_code=204)


@router.get("/static/plotly.min.js")
def serve_plotly() -> Response:
    return FileResponse(plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

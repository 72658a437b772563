"""The dashboard in a real headless Chromium (Debian's, driven by Playwright with `executable_path`; no
browser download), against a real `optico serve` process.

The screenshots the README shows come from `python benchmarks/dashboard_screenshots.py`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_testkit import Service, client, spec, wait_for
from sqlalchemy import insert, select

from optico.pool.models import JobRow, TrialRow, WorkloadRow
from optico.pool.store import SqlStore
from optico.report import flag_changes
from optico.service.dashboard import charts
from optico.spec import parse_spec
from optico.strategy import Strategy
from optico.textsafe import terminal_text

CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/lib/chromium/chromium", "/usr/bin/chromium-browser")
                 if Path(p).exists()), None)
FLAGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def _missing(reason: str) -> None:
    if os.environ.get("OPTICO_REQUIRE_BROWSER") == "1":
        pytest.fail(f"OPTICO_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    if CHROMIUM is None:
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[str, str], SqlStore]]:
    """A service on SQLite with a read token (the dashboard only reads) and a write token."""
    directory = tmp_path_factory.mktemp("dashboard")
    db = f"sqlite:///{directory / 'pool.db'}"
    store = SqlStore(db)
    tokens = {scope: store.create_token(f"{scope}-ui", scope)[1] for scope in ("read", "write")}
    service = Service(db_url=db, home=directory / "home").start()
    try:
        yield service, tokens, store
    finally:
        service.kill()
        store.close()


class Page:
    """A logged-in page that records every request and every console error."""

    def __init__(self, browser: Any, service: Service, token: str):
        self.service = service
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.goto(f"{service.url}/")
        assert "/login" in self.page.url
        self.page.fill("#token", token)
        self.page.click("form[action='/login'] button[type=submit]")
        self.page.wait_for_url(f"{service.url}/")

    def go(self, path: str) -> Any:
        self.page.goto(f"{self.service.url}{path}")
        return self.page

    def close(self) -> None:
        assert all(url.startswith(self.service.url) for url in self.requests), \
            [u for u in self.requests if not u.startswith(self.service.url)]
        self.context.close()


def _points_js(chart: str, names: tuple[str, ...]) -> str:
    """A script expression: the points of the chart's traces named `names`."""
    return (f"document.getElementById({json.dumps(chart)}).data.filter(t => {json.dumps(list(names))}"
            f".includes(t.name)).reduce((n, t) => n + t.x.length, 0)")


def _points(page: Any, chart: str, names: tuple[str, ...]) -> int:
    return page.evaluate(f"() => {_points_js(chart, names)}")


def _rows_and_points(page: Any, chart: str, names: tuple[str, ...]) -> tuple[int, int]:
    """The table's rows and the chart's points read in one script, so a live update cannot land
    between the two readings (the page's JavaScript appends a row and extends the chart together)."""
    return tuple(page.evaluate(f"""() => [document.querySelectorAll("#trials-table tbody tr").length,
        {_points_js(chart, names)}]"""))


MARKERS = ("above baseline", "below baseline", "failed")


def test_login_is_required_and_refuses_bad_tokens(browser: Any, site):
    service, tokens, _ = site
    anonymous = httpx.get(f"{service.url}/jobs/1", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=/jobs/1"
    assert httpx.get(f"{service.url}/ui/jobs/1/rows", follow_redirects=False).status_code == 303
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{service.url}/login?next=//evil.example/x")
    page.fill("#token", "optico_r_not-a-real-token")
    page.click("form[action='/login'] button[type=submit]")
    assert page.locator("p.error").inner_text() == "unknown or revoked token"
    page.fill("#token", tokens["read"])
    page.click("form[action='/login'] button[type=submit]")
    page.wait_for_url(f"{service.url}/")  # not to another site, whatever `next` said
    cookie = next(c for c in context.cookies() if c["name"] == "optico_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] == -1  # a session cookie
    # The cookie is for the pages only: the API still wants the Authorization header.
    assert page.evaluate("async () => (await fetch('/api/v1/jobs')).status") == 401
    page.click("header form.logout button")
    page.wait_for_url(f"{service.url}/login")
    context.close()


def test_a_job_page_follows_a_running_job_live(browser: Any, site):
    service, tokens, store = site
    http = client(service, tokens["write"])
    body = spec("live-ui", max_trials=8, trial_seconds=1.5, seed=5)
    body["baseline"] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "micro_batch_size": 8}
    job = http.post("/api/v1/jobs", json=body).json()  # the baseline runs out of memory: a failure to show
    wait_for(lambda: len(store.trials(job["id"])) >= 2 and store.trials(job["id"])[0].failure is not None
             and store.trials(job["id"])[0].failure.summary != "awaiting diagnosis", what="a diagnosed trial")
    ui = Page(browser, service, tokens["read"])
    page = ui.go(f"/jobs/{job['id']}")
    page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
    page.evaluate("() => { window.__sameDocument = true; }")
    shown, points = _rows_and_points(page, "chart-mfu", MARKERS)
    assert points == shown  # one point per trial
    final = wait_for(lambda: (j := http.get(f"/api/v1/jobs/{job['id']}").json())["status"] == "succeeded" and j,
                     timeout=120, what="the job to finish")
    page.wait_for_function(f"() => document.querySelectorAll('#trials-table tbody tr').length === {final['trials']}",
                           timeout=30_000)
    assert page.evaluate("() => window.__sameDocument") is True  # the new trials came without a reload
    assert final["trials"] > shown
    assert _points(page, "chart-mfu", MARKERS) == final["trials"]
    assert _points(page, "chart-memory", ("measured peak",)) == final["trials"]
    page.wait_for_function("() => document.getElementById('job-status').textContent === 'succeeded'")
    assert page.locator("#trials-table tbody tr.status-running").count() == 0
    statuses = [t["status"] for t in http.get(f"/api/v1/jobs/{job['id']}/trials").json()]
    assert [r.get_attribute("class").split("status-")[1] for r in page.locator("#trials-table tbody tr").all()] \
        == statuses

    trials = http.get(f"/api/v1/jobs/{job['id']}/trials").json()
    first = page.locator("#trials-table tbody tr").first
    assert trials[0]["status"] == "failed" and trials[0]["failure"]["summary"] in first.inner_text()
    assert first.inner_text().lower().count("confidence") == 1  # the diagnosis's own "(Confidence: N)"
    for row, (before, after) in zip(page.locator("#trials-table tbody tr").all()[1:], zip(trials, trials[1:])):
        expected = flag_changes(Strategy.model_validate(before["strategy"]), Strategy.model_validate(after["strategy"]))
        assert row.locator("td.diff code").all_inner_texts() == expected
    assert page.locator("#best-flags").inner_text() == " ".join(final["best"]["megatron_args"])
    page.reload()  # as a person opening the finished job sees it
    page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
    assert _points(page, "chart-mfu", MARKERS) == final["trials"]
    page.locator("details.iteration").first.click()
    assert page.locator("details.iteration").first.locator(".message").count() >= 1
    # The live rows' hover text as the server writes it: a diagnosis or a rationale is not ours.
    assert page.evaluate("() => plotlyText('a\\u202e<b>\\x1b[31m\\nz')") == charts.plotly_text("a\u202e<b>\x1b[31m\nz")
    # And a table cell as the server renders one: '\x1b' (not '\u001b'), a bare CR a line break.
    assert page.evaluate("() => visible('a\\x1b[1mB\\rC\\udb40\\udc41')") == terminal_text("a\x1b[1mB\rC\U000e0041")
    script = httpx.get(f"{service.url}/jobs/{job['id']}/launch.sh", cookies={"optico_session": tokens["read"]})
    assert script.status_code == 200 and "torchrun" in script.text and final["best"]["megatron_args"][1] in script.text
    assert ui.errors == [] and ui.dialogs == []
    ui.close()


def _mfu_chart(page: Any) -> dict[str, Any]:
    """The MFU chart as drawn (points rounded as the server rounds them), and the stop reason shown."""
    return page.evaluate("""() => {
        const chart = document.getElementById('chart-mfu');
        const round = (v) => v === null ? null : Math.round(v * 1000) / 1000;
        return {traces: chart.data.map(t => [t.name, Array.from(t.x), Array.from(t.y).map(round)]),
                baseline: (chart.layout.shapes || []).map(s => round(s.y0)),
                stop: document.getElementById('stop-box').hidden ? null
                      : document.getElementById('stop-reason').textContent};
    }""")


def test_a_page_opened_before_the_first_trial_ends_draws_what_a_reload_draws(browser: Any, site):
    # The live chart kept what the page had at load: no baseline line (its trial had not run), failures
    # at a floor of 0, no stop reason, until the page was reloaded.
    service, tokens, store = site
    http = client(service, tokens["write"])
    ui = Page(browser, service, tokens["read"])
    job = http.post("/api/v1/jobs", json=spec("live-from-start", max_trials=6, trial_seconds=2.5, seed=3,
                                              infra_rate=0.3)).json()
    page = ui.go(f"/jobs/{job['id']}")
    page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
    opened = page.evaluate("() => readJson('live-data')")
    assert opened["last_index"] == 0 and opened["baseline_mfu"] is None, opened
    final = wait_for(lambda: (j := http.get(f"/api/v1/jobs/{job['id']}").json())["status"] == "succeeded" and j,
                     timeout=120, what="the job to finish")
    page.wait_for_function(f"() => document.querySelectorAll('#trials-table tbody tr').length === {final['trials']}"
                           " && !document.getElementById('stop-box').hidden", timeout=30_000)
    live = _mfu_chart(page)
    page.reload()
    page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
    assert live == _mfu_chart(page)
    trials = http.get(f"/api/v1/jobs/{job['id']}/trials").json()
    assert live["stop"] and live["stop"] == store.get_job(job["id"]).stop_reason
    assert live["baseline"] == ([round(100 * trials[0]["metrics"]["mfu"], 3)] if trials[0]["status"] == "ok" else [])
    failed = dict((name, y) for name, _, y in live["traces"])["failed"]
    assert any(t["status"] != "ok" for t in trials) == bool(failed)  # infra faults: failures to place
    assert ui.errors == [] and ui.dialogs == []
    ui.close()


def test_a_diagnosis_shows_its_confidence_once(browser: Any, site):
    # The diagnosis ends "(Confidence: N)"; the job row, the trial page and the report added it again.
    service, tokens, store = site
    http = client(service, tokens["write"])
    body = spec("oom-once", max_trials=2, trial_seconds=0)
    body["baseline"] = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "micro_batch_size": 8}
    job = http.post("/api/v1/jobs", json=body).json()  # the baseline runs out of memory
    wait_for(lambda: http.get(f"/api/v1/jobs/{job['id']}").json()["status"] in ("succeeded", "failed"),
             what="the job to finish")
    summary = store.trials(job["id"])[0].failure.summary
    assert re.search(r"\(Confidence: \d+\)$", summary), summary
    ui = Page(browser, service, tokens["read"])
    row = ui.go(f"/jobs/{job['id']}").locator("#trials-table tbody tr").first.inner_text()
    trial = ui.go(f"/jobs/{job['id']}/trials/1").locator("section").first.inner_text()
    report = http.get(f"/api/v1/jobs/{job['id']}/report", params={"format": "markdown"}).text
    failures = report.split("## Failures")[1].split("##")[0]
    for shown in (row, trial, failures):
        assert shown.lower().count("confidence") == 1, shown
    assert ui.errors == []
    ui.close()


def test_the_jobs_page_filters_sorts_pages_and_escapes(browser: Any, site):
    service, tokens, store = site
    hostile = "<img src=x onerror=alert(1)><script>alert(2)</script>[/x]"  # control characters: refused at load
    http = client(service, tokens["write"])
    created = http.post("/api/v1/jobs", json={**spec("quick", max_trials=1, trial_seconds=0), "name": hostile})
    assert created.status_code == 201
    wait_for(lambda: http.get(f"/api/v1/jobs/{created.json()['id']}").json()["status"] == "succeeded",
             what="the hostile job to finish")
    ui = Page(browser, service, tokens["read"])
    page = ui.go("/?sort=best_mfu&dir=desc")
    assert page.locator("img[src=x]").count() == 0 and ui.dialogs == []
    assert page.get_by_text("<img src=x onerror=alert(1)>", exact=False).count() == 1  # shown as text
    mfus = [t for t in page.locator("#jobs-table tbody td.num:nth-child(6)").all_inner_texts() if t]
    assert mfus == sorted(mfus, key=lambda t: -float(t.rstrip("%")))
    page = ui.go("/?status=succeeded&name=live-ui")
    assert page.locator("#jobs-table tbody tr").count() == 1
    page = ui.go(f"/jobs/{created.json()['id']}")
    assert page.locator("h1").inner_text().endswith(hostile)
    assert ui.dialogs == [] and page.locator("script:not([src]):not([type='application/json'])").count() == 0
    assert ui.errors == []
    ui.close()


def test_trial_compare_and_workload_pages(browser: Any, site):
    service, tokens, store = site
    jobs = [j for j in store.list_jobs(limit=10) if j.status.value == "succeeded"]
    job = next(j for j in jobs if len(store.trials(j.id)) >= 2)
    ui = Page(browser, service, tokens["read"])
    page = ui.go(f"/jobs/{job.id}/trials/2")
    assert page.locator("#breakdown tbody tr").count() == 5
    assert "launcher" in page.locator("#fingerprint").inner_text()
    page = ui.go(f"/compare?jobs={','.join(str(j.id) for j in jobs[:2])}&parallel={job.id}")
    page.wait_for_function("() => document.getElementById('chart-parallel').data !== undefined")
    assert page.evaluate("() => document.getElementById('chart-compare').data.length") == len(jobs[:2])
    dims = page.evaluate("() => document.getElementById('chart-parallel').data[0].dimensions.length")
    assert dims >= 2 and page.evaluate("() => document.getElementById('chart-parallel').data[0]"
                                       ".dimensions.slice(-1)[0].values.length") == len(store.trials(job.id))
    page = ui.go(f"/workloads/{job.workload_key}")
    page.wait_for_function("() => document.getElementById('chart-history').data !== undefined")
    assert page.locator("table.jobs tbody tr").count() >= 1
    assert ui.errors == []
    ui.close()


def _bulk(store: SqlStore, jobs: int, trials_of_first: int) -> int:
    """Writes many jobs (and many trials for one of them) straight into the tables, as years of use would."""
    spec_obj = parse_spec(spec("bulk", max_trials=trials_of_first))
    stored = spec_obj.model_dump(mode="json")
    key = spec_obj.workload.key()
    base = Strategy()
    with store.engine.begin() as conn:
        conn.execute(insert(WorkloadRow).prefix_with("OR IGNORE"),
                     [{"key": key, "description": "bulk", "workload": spec_obj.workload.model_dump(mode="json")}])
        conn.execute(insert(JobRow), [{"name": f"bulk-{i}", "status": "succeeded", "workload_key": key, "spec": stored,
                                       "origin": "queue", "max_trials": 20, "best_mfu": (i % 97) / 100,
                                       "spec_hash": ""} for i in range(jobs)])
        first = conn.execute(JobRow.__table__.select().order_by(JobRow.id.desc()).limit(1)).first().id
        metrics = {"step_time_s": 1.0, "tflops_per_gpu": 150.0, "mfu": 0.5, "tokens_per_s_per_gpu": 3000.0,
                   "mem_max_gib": 50.0, "mem_limit_gib": 79.35}
        conn.execute(insert(TrialRow), [{"job_id": first, "index": i + 1, "signature": f"s{i}",
                                         "strategy": base.model_dump(mode="json"), "status": "ok",
                                         "metrics": {**metrics, "mfu": 0.4 + (i % 50) / 500},
                                         "rationale": f"step {i}", "gpu_seconds": 1.0, "fingerprint": {},
                                         "log_excerpt": "", "attempts": 1} for i in range(trials_of_first)])
    return first


def test_ten_thousand_jobs_and_a_thousand_trials_stay_fast(browser: Any, tmp_path: Path):
    db = f"sqlite:///{tmp_path / 'big.db'}"
    with SqlStore(db) as store:
        token = store.create_token("reader", "read")[1]
        big = _bulk(store, 10_000, 1_000)
    service = Service(db_url=db, home=tmp_path / "home", extra_env={"OPTICO_WORKERS": "0"}).start()
    try:
        cookies = {"optico_session": token}
        timings = {}
        for path in ("/", "/?sort=best_mfu&dir=desc&page=150", "/?name=bulk-99&sort=name&dir=asc", f"/jobs/{big}"):
            httpx.get(f"{service.url}{path}", cookies=cookies)  # warm
            t0 = time.perf_counter()
            response = httpx.get(f"{service.url}{path}", cookies=cookies, timeout=60)
            timings[path] = time.perf_counter() - t0
            assert response.status_code == 200, path
        assert "page 150 of 200" in httpx.get(f"{service.url}/?sort=best_mfu&dir=desc&page=150", cookies=cookies).text
        print("page times (s):", {k: round(v, 3) for k, v in timings.items()})
        assert max(timings[p] for p in list(timings)[:3]) < 2.0, timings  # the jobs page, 10,000 jobs
        assert timings[f"/jobs/{big}"] < 5.0, timings  # a job of 1,000 trials, predictions included
        ui = Page(browser, service, token)
        page = ui.go(f"/jobs/{big}")
        page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined", timeout=30_000)
        assert _points(page, "chart-mfu", MARKERS) == 1_000
        ui.close()
    finally:
        service.kill()


def test_plotly_is_served_locally():
    from optico.service.dashboard.views import plotly_js

    assert plotly_js().is_file() and plotly_js().stat().st_size > 1_000_000
    assert shutil.which("chromium") or CHROMIUM or os.environ.get("OPTICO_REQUIRE_BROWSER") != "1"


def test_the_workload_history_shows_retuning_ticks(browser: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A schedule's first tune, then an upgraded cluster: the workload page shows both ticks, the
    incumbent's re-measurement and the retune's new best."""
    from optico.retune.cron import next_fire
    from optico.retune.fire import run_now

    db = f"sqlite:///{tmp_path / 'history.db'}"
    body = spec("nightly", max_trials=4, trial_seconds=0)
    body["launcher"]["framework_version"] = "24.10"
    with SqlStore(db) as store:
        token = store.create_token("reader", "read")[1]
        store.create_schedule("nightly", parse_spec(body), cron="0 2 * * *",
                              next_fire_at=next_fire("0 2 * * *", store.db_now()), max_trials=4)
        # Playwright's sync API holds an event loop in this thread: the ticks run in another one.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(run_now, store, "nightly", database_url=db).result()
            monkeypatch.setenv("OPTICO_SIM_FRAMEWORK_VERSION", "25.01")
            second = pool.submit(run_now, store, "nightly", database_url=db).result()
        key = store.get_schedule("nightly").workload_key
    assert first.outcome == "first-tune" and second.fingerprint_changed
    service = Service(db_url=db, home=tmp_path / "home", extra_env={"OPTICO_WORKERS": "0",
                                                                    "OPTICO_SCHEDULER": "false"}).start()
    try:
        ui = Page(browser, service, token)
        page = ui.go(f"/workloads/{key}")
        page.wait_for_function("() => document.getElementById('chart-history').data !== undefined")
        rows = page.locator("#ticks tbody tr").all_inner_texts()
        assert len(rows) == 2 and "first-tune" in rows[0]  # in the order they ticked
        assert second.outcome in rows[1] and "25.01" in rows[1]
        names = page.evaluate("() => document.getElementById('chart-history').data.map(t => t.name)")
        assert "incumbent re-measured (tick)" in names and "version 24.10" in names
        assert ("retune's best" in names) == (second.new_best_mfu is not None)
        assert ui.errors == []
        ui.close()
    finally:
        service.kill()


def test_chart_labels_show_untrusted_text_literally():
    # Plotly renders <a href>, <b> and <span style> in trace names and hover text: a job name or a
    # diagnosis is escaped for it, so it reads as typed and links nowhere.
    from optico.service.dashboard import charts

    hostile = '#3 <a href="https://evil.example">click</a> & <b>bold</b>'
    name = charts.compare_figure([(hostile, [])])["data"][0]["name"]
    assert "<" not in name and ">" not in name and name.startswith("#3 &lt;a href=")
    assert "&amp; &lt;b&gt;bold&lt;/b&gt;" in name
    # Control, escape and bidi characters are shown as escapes, as on the pages (the hover of a trial's
    # diagnosis; a U+202E reorders what follows it).
    assert charts.plotly_text("a\u202e<b>\x1b[31m\nz") == "a\\u202e&lt;b&gt;\\x1b[31m\\nz"

    # The workload history page: a job's name, its framework version and a schedule's name alike.
    from datetime import datetime, timezone

    from optico.service.dashboard.views import _history_figure

    when = datetime(2026, 11, 26, tzinfo=timezone.utc)
    point = {"job": 3, "name": hostile, "version": '<a href="https://evil.example/v">v</a>', "mfu": 0.5,
             "when": when, "strategy": "TP1"}
    tick = {"when": when, "after": 0.5, "new_best": 0.55, "schedule": hostile, "outcome": "regression",
            "version": "<b>25</b>", "retune_job": 4}
    figure = _history_figure([point], [tick])
    labels = [t["name"] for t in figure["data"]] + [x for t in figure["data"] for x in t.get("text", [])]
    assert labels and not [label for label in labels if "<" in label or ">" in label], labels


def test_a_job_whose_calibration_file_is_gone_still_shows(browser: Any, tmp_path: Path):
    """The calibration a job was tuned with was moved (or is not on this replica): its pages show what
    was measured, without the model's predictions, instead of a 500."""
    from optico.perfmodel.constants import DEFAULT_CALIBRATION

    roots = tmp_path / "calibrations"
    roots.mkdir()
    calibration = roots / "ours.json"
    shutil.copy(DEFAULT_CALIBRATION, calibration)
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(db) as store:
        tokens = {scope: store.create_token(f"{scope}-cal", scope)[1] for scope in ("read", "write")}
    service = Service(db_url=db, home=tmp_path / "home",
                      extra_env={"OPTICO_FILE_ROOTS": json.dumps([str(roots)])}).start()
    try:
        http = client(service, tokens["write"])
        job = http.post("/api/v1/jobs", json={**spec("calibrated", max_trials=2, trial_seconds=0),
                                              "calibration": str(calibration)}).json()["id"]
        wait_for(lambda: http.get(f"/api/v1/jobs/{job}").json()["status"] == "succeeded", what="the job to finish")
        calibration.unlink()
        service.kill()
        service.start()  # a fresh process: nothing of the file is cached
        ui = Page(browser, service, tokens["read"])
        page = ui.go(f"/jobs/{job}")
        page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
        assert page.locator("#trials-table tbody tr").count() == 2
        page = ui.go(f"/jobs/{job}/trials/1")
        assert "cannot be read here" in page.locator("#no-prediction").inner_text()
        assert "MFU" in page.locator("table.kv").first.inner_text()  # what was measured
        assert ui.errors == []
        ui.close()
    finally:
        service.kill()


def test_a_live_page_refused_a_stream_follows_once_one_is_free(browser: Any, tmp_path: Path):
    """Every event stream taken (503): the page's EventSource is closed for good by the browser, and the
    page reopens it later (a proxy's 502 while the server restarts is the same)."""
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(db) as store:
        tokens = {scope: store.create_token(f"{scope}-slot", scope)[1] for scope in ("read", "write")}
        service = Service(db_url=db, home=tmp_path / "home", extra_env={"OPTICO_MAX_EVENT_STREAMS": "1"}).start()
        try:
            http = client(service, tokens["write"])
            job = http.post("/api/v1/jobs", json=spec("one-slot", max_trials=6, trial_seconds=1.5, seed=3)).json()
            wait_for(lambda: any(t.status.value != "running" for t in store.trials(job["id"])), what="a trial")
            first = Page(browser, service, tokens["read"])
            first.go(f"/jobs/{job['id']}").wait_for_timeout(1000)  # holds the only stream
            second = Page(browser, service, tokens["read"])
            page = second.go(f"/jobs/{job['id']}")
            page.wait_for_timeout(1500)  # refused
            first.close()
            final = wait_for(lambda: (j := http.get(f"/api/v1/jobs/{job['id']}").json())["status"] == "succeeded"
                             and j, timeout=120, what="the job to finish")
            page.wait_for_function(f"() => document.querySelectorAll('#trials-table tbody tr').length === "
                                   f"{final['trials']}", timeout=30_000)
            page.wait_for_function("() => document.getElementById('job-status').textContent === 'succeeded'")
            assert _points(page, "chart-mfu", MARKERS) == final["trials"]
            second.close()
        finally:
            service.kill()


def test_the_workload_history_reaches_the_latest_jobs(browser: Any, tmp_path: Path):
    """A workload with more jobs than the page shows (years of nightly retunes): the latest ones, not the first."""
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(db) as store:
        token = store.create_token("reader", "read")[1]
        _bulk(store, 520, 1)  # the last job with a trial
        with store.engine.begin() as conn:  # and every other: the history plots jobs that measured
            ids = [r.id for r in conn.execute(JobRow.__table__.select().order_by(JobRow.id))]
            conn.execute(insert(TrialRow), [{"job_id": i, "index": 1, "signature": "s", "strategy":
                                             Strategy().model_dump(mode="json"), "status": "ok", "metrics": {
                                                 "step_time_s": 1.0, "tflops_per_gpu": 150.0, "mfu": 0.5,
                                                 "tokens_per_s_per_gpu": 3000.0, "mem_max_gib": 50.0,
                                                 "mem_limit_gib": 79.35},
                                             "rationale": "", "gpu_seconds": 1.0, "fingerprint": {},
                                             "log_excerpt": "", "attempts": 1} for i in ids[:-1]])
            conn.execute(JobRow.__table__.update().values(best_trial_id=select(TrialRow.id).where(
                TrialRow.job_id == JobRow.id).scalar_subquery()))
        key = store.get_job(ids[0]).workload_key
    service = Service(db_url=db, home=tmp_path / "home", extra_env={"OPTICO_WORKERS": "0"}).start()
    try:
        ui = Page(browser, service, token)
        page = ui.go(f"/workloads/{key}")
        links = page.locator("table.jobs tbody tr td:first-child a").all_inner_texts()
        assert links[-1].startswith(f"#{ids[-1]} ") and len(links) == 500, links[-3:]
        assert page.locator("#history-cut").inner_text() == "The latest 500 of 520 jobs."
        assert ui.errors == []
        ui.close()
    finally:
        service.kill()


def test_a_page_opened_on_an_interrupted_queue_job_follows_it_when_a_worker_takes_it(browser: Any, tmp_path: Path):
    """A rolling restart interrupts a queue job: the page treated `interrupted` as the end (no event
    stream opened) and stayed frozen while the next worker ran the job to its end."""
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(db) as store:
        tokens = {scope: store.create_token(f"{scope}-int", scope)[1] for scope in ("read", "write")}
        old = Service(db_url=db, home=tmp_path / "old").start()
        api = next_worker = None
        try:
            job = client(old, tokens["write"]).post(
                "/api/v1/jobs", json=spec("interrupted-ui", max_trials=5, trial_seconds=1.0, seed=4)).json()
            wait_for(lambda: len(store.trials(job["id"])) >= 2, what="trial 2")
            old.stop()
            assert store.get_job(job["id"]).status.value == "interrupted"
            api = Service(db_url=db, home=tmp_path / "api", args=("--no-worker",)).start()
            ui = Page(browser, api, tokens["read"])
            page = ui.go(f"/jobs/{job['id']}")
            page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
            assert page.evaluate("() => JSON.parse(document.getElementById('live-data').textContent).final") is False
            next_worker = Service(db_url=db, home=tmp_path / "worker").start()
            final = wait_for(lambda: (j := client(api, tokens["read"]).get(f"/api/v1/jobs/{job['id']}").json())
                             ["status"] == "succeeded" and j, timeout=120, what="the job to finish")
            page.wait_for_function(f"() => document.querySelectorAll('#trials-table tbody tr').length === "
                                   f"{final['trials']}", timeout=30_000)
            page.wait_for_function("() => document.getElementById('job-status').textContent === 'succeeded'")
            assert any("/events" in url for url in ui.requests) and ui.errors == []
            ui.close()
        finally:
            for service in (old, api, next_worker):
                if service:
                    service.kill()


def test_a_live_page_whose_session_ends_says_so_and_a_long_name_keeps_the_page_width(browser: Any, tmp_path: Path):
    """Token revoked while its page followed a job: the stream went on (it was checked once), then each
    refresh was redirected to the login page and failed to parse it ('Unexpected token <', every event),
    and the page froze without a word. And a 200-character name without a space made a 1,400-pixel
    page 2,928 pixels wide (48,626 with a long rationale)."""
    db = f"sqlite:///{tmp_path / 'pool.db'}"
    with SqlStore(db) as store:
        write = store.create_token("write-end", "write")[1]
        read = store.create_token("read-end", "read")[1]
        service = Service(db_url=db, home=tmp_path / "home").start()
        try:
            http = client(service, write)
            job = http.post("/api/v1/jobs", json=spec("A" * 200, max_trials=20, trial_seconds=1.0, seed=6)).json()
            wait_for(lambda: len(store.trials(job["id"])) >= 1, what="a trial")
            ui = Page(browser, service, read)
            for path in ("/", f"/jobs/{job['id']}"):
                page = ui.go(path)
                assert page.evaluate("() => document.documentElement.scrollWidth") <= 1400, path
            page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
            store.revoke_token("read-end")
            page.wait_for_selector("#session-ended", timeout=30_000)
            assert "/login?next=" in page.locator("#session-ended a").get_attribute("href")
            assert ui.errors == []  # no JSON parse error of the login page
            http.post(f"/api/v1/jobs/{job['id']}/cancel")
            ui.close()
        finally:
            service.kill()


def test_unknown_jobs_to_compare_are_named_and_a_page_past_the_last_goes_to_the_last(site):
    """`/compare?jobs=999999` silently showed the latest three jobs; `/?page=8` of 7 said "No job matches"."""
    service, tokens, store = site
    cookies = {"optico_session": tokens["read"]}
    known = store.list_jobs(limit=1)
    shown = httpx.get(f"{service.url}/compare", params={"jobs": "999999"}, cookies=cookies)
    assert shown.status_code == 200 and "No job #999999 in the pool." in shown.text
    if known:
        both = httpx.get(f"{service.url}/compare", params={"jobs": f"{known[0].id},999998"}, cookies=cookies)
        assert "No job #999998 in the pool." in both.text and f"/jobs/{known[0].id}" in both.text
    past = httpx.get(f"{service.url}/", params={"page": "999", "dir": "asc"}, cookies=cookies, follow_redirects=False)
    assert past.status_code == 303 and past.headers["location"].startswith("/?") and "page=1" in past.headers["location"]
    assert "dir=asc" in past.headers["location"]

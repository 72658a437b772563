"""/api/v1/schedules over real HTTP against real `optico serve` processes, on SQLite and PostgreSQL:
the API's conventions, and two replicas ticking one schedule after a cluster upgrade."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from retune_testkit import UPGRADE_ENV, add_schedule, sim_spec
from service_testkit import Service, client, wait_for

from optico.pool.store import SqlStore
from optico.retune.fire import run_now


@pytest.fixture
def tokens(db_url: str) -> dict[str, str]:
    with SqlStore(db_url) as store:
        return {scope: store.create_token(f"{scope}-{uuid.uuid4().hex[:6]}", scope)[1] for scope in ("write", "read")}


@pytest.fixture
def make_service(db_url: str, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def make(**env: str) -> Service:
        service = Service(db_url=db_url, home=tmp_path / f"home{len(started)}", extra_env=env)
        started.append(service)
        return service.start()

    yield make
    for service in started:
        service.kill()


def body(name: str = "nightly", **fields) -> dict:
    return {"name": name, "spec": sim_spec(name), **fields}


BAD = [
    ({"cron": "61 * * * *"}, ["body", "cron"]),
    ({"cron": "0 2 * *"}, ["body", "cron"]),
    ({"name": "no spaces"}, ["body", "name"]),
    ({"name": ""}, ["body", "name"]),
    ({"name": "ghp_" + "a1B2" * 9}, ["body", "name"]),  # a credential: it would be kept and listed in clear
    ({"max_trials": 0}, ["body", "max_trials"]),
    ({"always_retune": "sometimes"}, ["body", "always_retune"]),
    ({"always_retune": "yes"}, ["body", "always_retune"]),
    ({"max_trials": "5"}, ["body", "max_trials"]),
    ({"max_trials": 5.0}, ["body", "max_trials"]),
    ({"webhook_url": "file:///etc/passwd"}, ["body", "webhook_url"]),
    ({"webhook_url": "http://169.254.169.254/services/T0123/B0456/q8Zr2LmX9vTy7KpW"}, ["body", "webhook_url"]),
    ({"colour": "blue"}, ["body", "colour"]),
    ({"spec": {"name": "x"}}, ["body", "spec", "workload", "model"]),
    ({"spec": {**sim_spec(), "launcher": {"kind": "sim", "framework_version": ""}}},
     ["body", "spec", "launcher", "framework_version"]),
    ({"spec": "workload: [unclosed"}, ["body", "spec"]),
]


def test_schedules_follow_the_api_conventions(make_service, tokens: dict[str, str]) -> None:
    service = make_service(OPTICO_WORKERS="0", OPTICO_SCHEDULER="false")
    anonymous, reader, writer = client(service, None), client(service, tokens["read"]), client(service, tokens["write"])
    calls = [("POST", "/api/v1/schedules", body()), ("GET", "/api/v1/schedules", None),
             ("GET", "/api/v1/schedules/nightly", None), ("DELETE", "/api/v1/schedules/nightly", None),
             ("POST", "/api/v1/schedules/nightly/run", None), ("GET", "/api/v1/schedules/nightly/events", None)]
    for method, path, payload in calls:
        assert anonymous.request(method, path, json=payload).status_code == 401, (method, path)
        if method in ("POST", "DELETE"):
            assert reader.request(method, path, json=payload).status_code == 403, (method, path)

    for change, loc in BAD:
        answer = writer.post("/api/v1/schedules", json={**body(), **change})
        assert answer.status_code == 422, (change, answer.text)
        assert [e["loc"] for e in answer.json()["detail"]][0][:len(loc)] == loc, (change, answer.json())
        assert "q8Zr2LmX9vTy7KpW" not in answer.text  # a webhook's path is its receiver's secret: never quoted
    # A missing field's error quoted the whole body around it, the webhook URL included.
    missing = writer.post("/api/v1/schedules", json={"name": "x", "webhook_url": "https://hooks.example.com/T0/q8Zr2LmX9vTy7KpW"})
    assert missing.status_code == 422 and "q8Zr2LmX9vTy7KpW" not in missing.text, missing.text
    assert "webhook_url" in missing.text  # the body is named by its keys
    for listed in ([{"webhook_url": "https://hooks.example.com/T0/q8Zr2LmX9vTy7KpW"}],
                   {"name": "x", "spec": [{"webhook_url": "https://hooks.example.com/T0/q8Zr2LmX9vTy7KpW"}]}):
        answer = writer.post("/api/v1/schedules", json=listed)  # the object inside a list was echoed whole
        assert answer.status_code == 422 and "q8Zr2LmX9vTy7KpW" not in answer.text, answer.text

    created = writer.post("/api/v1/schedules", json=body(webhook_url="https://hooks.example.com/T0/B0/tok123456"))
    assert created.status_code == 201, created.text
    view = created.json()
    assert created.headers["location"] == "/api/v1/schedules/nightly"
    assert (view["cron"], view["max_trials"], view["incumbent"], view["webhook"]) == (
        "0 2 * * *", 5, None, "https://hooks.example.com/…")
    assert "tok123456" not in created.text
    from_yaml = writer.post("/api/v1/schedules", json={"name": "yaml", "spec": yaml.safe_dump(sim_spec("yaml")),
                                                       "cron": "30 3 * * 1", "max_trials": 7})
    assert from_yaml.status_code == 201 and from_yaml.json()["max_trials"] == 7, from_yaml.text
    assert writer.post("/api/v1/schedules", json=body()).status_code == 409

    assert [s["name"] for s in reader.get("/api/v1/schedules").json()] == ["nightly", "yaml"]
    one = reader.get("/api/v1/schedules/nightly").json()
    assert one["history"] == [] and one["workload_key"] == view["workload_key"]
    assert reader.get("/api/v1/schedules/nope").status_code == 404
    assert writer.post("/api/v1/schedules/nope/run").status_code == 404
    long_name = reader.get("/api/v1/schedules/" + "n" * 5000)
    assert long_name.status_code == 404 and len(long_name.json()["detail"]) < 200  # not echoed whole
    due = writer.post("/api/v1/schedules/yaml/run")
    assert due.status_code == 202 and due.json()["next_fire_at"] < one["next_fire_at"]
    assert reader.get("/api/v1/schedules/yaml/events").json() == []
    assert writer.delete("/api/v1/schedules/yaml").status_code == 204
    assert writer.delete("/api/v1/schedules/yaml").status_code == 404
    assert [s["name"] for s in reader.get("/api/v1/schedules").json()] == ["nightly"]
    assert "/api/v1/schedules/{name}/run" in reader.get("/openapi.json").json()["paths"]


def test_two_replicas_tick_an_upgraded_cluster_once(make_service, tokens: dict[str, str], db_url: str,
                                                    upgrade) -> None:
    with SqlStore(db_url) as store:  # the incumbent, tuned before the upgrade
        # A cron that cannot come round while the test runs (Feb 29): only the test's own /run fires it.
        add_schedule(store, "nightly", max_trials=4, cron="0 0 29 2 *")
        first = run_now(store, "nightly", database_url=db_url)
        jobs_before = len(store.list_jobs(100))
    replicas = [make_service(**{UPGRADE_ENV: "25.01", "OPTICO_SCHEDULER_POLL_S": "0.2"}) for _ in range(2)]
    http = client(replicas[0], tokens["write"])
    assert http.post("/api/v1/schedules/nightly/run").status_code == 202

    def settled() -> dict | None:
        view = client(replicas[1], tokens["read"]).get("/api/v1/schedules/nightly").json()
        return view if view["history"][0]["id"] != first.id and view["history"][0]["status"] == "done" else None

    view = wait_for(settled, timeout=120, what="the tick and its retune to end")
    tick = view["history"][0]
    assert [t["id"] for t in view["history"]] == [tick["id"], first.id], "one tick for the slot, not two"
    assert tick["trigger"] == "manual" and tick["outcome"] in ("regression", "improvement")  # fired by /run
    assert tick["fingerprint"] == {"framework_version": "25.01"} and tick["fingerprint_changed"] is True
    assert tick["mfu_before"] == first.new_best_mfu and tick["new_best_mfu"] is not None
    assert view["incumbent"]["mfu"] == tick["new_best_mfu"]
    assert view["incumbent"]["fingerprint"] == {"framework_version": "25.01"}
    with SqlStore(db_url) as store:
        jobs = store.list_jobs(100)
        assert len(jobs) == jobs_before + 1 and jobs[0].id == tick["retune_job_id"]
    events = http.get("/api/v1/schedules/nightly/events", params={"after": 2}).json()
    assert [(e["seq"], e["kind"]) for e in events] == [(3, "tick"), (4, "retune_done")]
    assert events[1]["data"]["flag_changes"] == tick["report"]["flag_changes"]

    assert http.post("/api/v1/schedules/nightly/run").status_code == 202
    again = wait_for(lambda: (v := http.get("/api/v1/schedules/nightly").json())["history"][0]["id"] != tick["id"]
                     and v["history"][0]["status"] == "done" and v, timeout=60, what="the second tick")
    assert again["history"][0]["outcome"] == "no-change" and again["history"][0]["retune_job_id"] is None
    assert len(again["history"]) == 3
    with SqlStore(db_url) as store:
        assert len(store.list_jobs(100)) == jobs_before + 1

"""The REST API over real HTTP against a real `optico serve` process, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import socket
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from sqlalchemy import text

from optico.pool.store import SqlStore
from service_testkit import Service, client, spec, sse_events, wait_for


def submit(http: httpx.Client, body: dict, **headers: str) -> httpx.Response:
    return http.post("/api/v1/jobs", json=body, headers=headers)


def test_submit_follow_the_stream_to_the_end_and_read_the_report(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    created = submit(http, spec("live", max_trials=4))
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["status"] in ("queued", "running") and job["max_trials"] == 4 and created.headers["location"].endswith(
        f"/api/v1/jobs/{job['id']}")

    seen: list[tuple[int, str]] = []
    with http.stream("GET", f"/api/v1/jobs/{job['id']}/events", timeout=120) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        for event_id, kind, data in sse_events(stream):
            seen.append((int(event_id), kind))
            if kind == "end":
                assert data == {"status": "succeeded"}
                break
    ids = [i for i, kind in seen if kind != "end"]
    assert ids == list(range(1, len(ids) + 1)), "every event once, in order"
    kinds = [k for _, k in seen]
    assert kinds.count("trial_started") == 4 and kinds.count("trial_done") == 4
    assert kinds[-2:] == ["job_done", "end"] and "lease" in kinds and "agent" in kinds

    final = http.get(f"/api/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded" and final["trials"] == 4 and final["lease"] is None
    assert final["best"]["megatron_args"][0] == "--tensor-model-parallel-size"
    trials = http.get(f"/api/v1/jobs/{job['id']}/trials").json()
    assert [t["index"] for t in trials] == [1, 2, 3, 4]
    assert [t["index"] for t in http.get(f"/api/v1/jobs/{job['id']}/trials", params={"after": 2}).json()] == [3, 4]
    messages = http.get(f"/api/v1/jobs/{job['id']}/messages").json()
    assert {m["agent"] for m in messages} >= {"seed", "validation", "analysis", "generation", "guard"}
    later = http.get(f"/api/v1/jobs/{job['id']}/messages", params={"after": messages[2]["id"]}).json()
    assert [m["id"] for m in later] == [m["id"] for m in messages if m["id"] > messages[2]["id"]]

    report = http.get(f"/api/v1/jobs/{job['id']}/report", params={"tokens": 1e12}).json()
    assert report["best"]["flags"][0].startswith("--tensor-model-parallel-size")
    assert report["path"][0]["trial"] == 1 and report["gpu_hours_spent"] > 0
    assert report["savings"]["gpu_hours_saved"] == pytest.approx(
        report["savings"]["gpu_hours_baseline"] - report["savings"]["gpu_hours_best"])
    assert "torchrun" in report["launch_script"]
    markdown = http.get(f"/api/v1/jobs/{job['id']}/report", params={"format": "markdown"})
    assert markdown.headers["content-type"].startswith("text/markdown")
    assert markdown.text.startswith(f"# OptiCo job {job['id']}: live") and "## Launch script" in markdown.text


def test_a_dropped_stream_resumes_with_last_event_id(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    job = submit(http, spec("resume-stream", max_trials=3)).json()
    first: list[int] = []
    with http.stream("GET", f"/api/v1/jobs/{job['id']}/events") as stream:
        for event_id, kind, _ in sse_events(stream):
            first.append(int(event_id))
            if kind == "trial_done":
                break  # the connection drops here
    rest: list[int] = []
    with http.stream("GET", f"/api/v1/jobs/{job['id']}/events",
                     headers={"Last-Event-ID": str(first[-1])}, timeout=120) as stream:
        for event_id, kind, _ in sse_events(stream):
            if kind == "end":
                break
            rest.append(int(event_id))
    assert first + rest == list(range(1, len(first) + len(rest) + 1))
    replay = []
    with http.stream("GET", f"/api/v1/jobs/{job['id']}/events", params={"after": 0}) as stream:
        replay = [int(i) for i, kind, _ in sse_events(stream) if kind != "end"]
    assert replay == first + rest


def test_a_cancel_during_a_short_trial_kills_it_releases_the_job_and_ends_the_stream(
        served: tuple[Service, dict[str, str]]):
    # Trials shorter than a lease renewal (15 s): the cancel must still be seen while the trial runs
    # (it was not, the trial finished ok), and the job must not keep its lease once the run has ended
    # (it did, for good: the event stream never sent `end`).
    service, tokens = served
    http = client(service, tokens["write"])
    job = submit(http, spec("short-cancel", max_trials=3, trial_seconds=4)).json()
    wait_for(lambda: http.get(f"/api/v1/jobs/{job['id']}/trials").json(), what="a running trial")
    assert http.post(f"/api/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    kinds = []
    with http.stream("GET", f"/api/v1/jobs/{job['id']}/events", timeout=30) as stream:
        for _, kind, data in sse_events(stream):
            kinds.append(kind)
            if kind == "end":
                assert data == {"status": "cancelled"}
                break
    assert "job_done" in kinds and kinds[-2:] == ["lease", "end"]  # the worker let go last
    # Every trial result is an event, a lost one too (the stream had only trial_started for it).
    assert kinds.count("trial_started") == 1 and kinds.index("trial_lost") < kinds.index("job_done"), kinds
    assert http.get(f"/api/v1/jobs/{job['id']}").json()["lease"] is None
    trials = http.get(f"/api/v1/jobs/{job['id']}/trials").json()
    assert [t["status"] for t in trials] == ["lost"], trials


def test_a_revoked_token_ends_the_streams_it_opened(served: tuple[Service, dict[str, str]]):
    """The token was checked once, when the stream opened: after `optico token revoke` a stream went on
    sending every trial of its job, for as long as the job ran (days on a cluster)."""
    import time
    import uuid

    service, tokens = served
    http = client(service, tokens["write"])
    with SqlStore(service.db_url) as store:
        name = f"streamer-{uuid.uuid4().hex[:6]}"
        follower = client(service, store.create_token(name, "read")[1])
        job = submit(http, spec("revoked-stream", max_trials=30, trial_seconds=1.0)).json()
        try:
            with follower.stream("GET", f"/api/v1/jobs/{job['id']}/events", timeout=60) as stream:
                events = sse_events(stream)
                next(kind for _, kind, _ in events if kind == "trial_done")
                store.revoke_token(name)
                revoked_at = time.monotonic()
                after = [kind for _, kind, _ in events]  # what comes until the server closes the stream
            ended_in = time.monotonic() - revoked_at
            assert ended_in < 10 and after[-1:] == ["session_ended"] and "end" not in after, (ended_in, after)
            assert follower.get(f"/api/v1/jobs/{job['id']}/events").status_code == 401  # its reconnect too
            assert http.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "running"  # the job goes on
        finally:
            http.post(f"/api/v1/jobs/{job['id']}/cancel")


def test_yaml_bodies_idempotency_and_listing(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    body = yaml.safe_dump(spec("from-yaml", max_trials=1))
    made = http.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/yaml",
                                                            "Idempotency-Key": "same-key"})
    assert made.status_code == 201, made.text
    again = http.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/yaml",
                                                             "Idempotency-Key": "same-key"})
    assert again.status_code == 200 and again.json()["id"] == made.json()["id"]
    other = submit(http, spec("different", max_trials=1), **{"Idempotency-Key": "same-key"})
    assert other.status_code == 409 and "different spec" in other.json()["detail"]
    ids = [made.json()["id"]]
    for i in range(4):
        response = submit(http, spec(f"page-{i}", max_trials=1))
        assert response.status_code == 201
        ids.append(response.json()["id"])
    page = http.get("/api/v1/jobs", params={"limit": 2, "name": "page-"}).json()
    assert [j["name"] for j in page["items"]] == ["page-3", "page-2"] and page["next_cursor"]
    page2 = http.get("/api/v1/jobs", params={"limit": 2, "name": "page-", "cursor": page["next_cursor"]}).json()
    assert [j["name"] for j in page2["items"]] == ["page-1", "page-0"] and page2["next_cursor"] is None
    wait_for(lambda: all(http.get(f"/api/v1/jobs/{i}").json()["status"] == "succeeded" for i in ids),
             what="the five jobs succeeded")
    succeeded = {j["id"] for j in http.get("/api/v1/jobs", params={"status": "succeeded", "limit": 500}).json()["items"]}
    assert set(ids) <= succeeded
    assert not {j["id"] for j in http.get("/api/v1/jobs", params={"status": "queued"}).json()["items"]} & set(ids)


def test_stop_cancel_resume_and_budget_over_http(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    # A long trial: cancel kills it through the launcher, records it lost, and the job ends cancelled.
    slow = submit(http, spec("slow", max_trials=5, trial_seconds=60)).json()
    wait_for(lambda: http.get(f"/api/v1/jobs/{slow['id']}/trials").json(), what="a running trial")
    cancelled = http.post(f"/api/v1/jobs/{slow['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    trials = wait_for(lambda: [t for t in http.get(f"/api/v1/jobs/{slow['id']}/trials").json()
                               if t["status"] == "lost"], timeout=30, what="the killed trial recorded lost")
    assert trials[0]["failure"]["summary"].startswith("lost: the job was cancelled")
    wait_for(lambda: http.get(f"/api/v1/jobs/{slow['id']}").json()["lease"] is None, timeout=30,
             what="the worker released the job")
    again = http.post(f"/api/v1/jobs/{slow['id']}/stop")
    assert again.status_code == 409 and "is cancelled" in again.json()["detail"]

    # Stop: the running trial finishes, no new one starts; the budget is raised while it runs.
    job = submit(http, spec("stoppable", max_trials=3, trial_seconds=1.5)).json()
    wait_for(lambda: http.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "running", what="running")
    patched = http.patch(f"/api/v1/jobs/{job['id']}", json={"max_trials": 6})
    assert patched.status_code == 200 and patched.json()["max_trials"] == 6
    assert http.patch(f"/api/v1/jobs/{job['id']}", json={"max_trials": 0}).status_code == 422
    assert http.patch(f"/api/v1/jobs/{job['id']}", json={"max_trails": 3}).status_code == 422
    assert http.patch(f"/api/v1/jobs/{job['id']}", json={}).status_code == 422  # a change that changes nothing
    wait_for(lambda: len(http.get(f"/api/v1/jobs/{job['id']}/trials").json()) >= 2, what="trial 2")
    assert http.post(f"/api/v1/jobs/{job['id']}/stop").json()["status"] == "stopping"
    final = wait_for(lambda: (j := http.get(f"/api/v1/jobs/{job['id']}").json())["status"] == "succeeded" and j,
                     what="stopped job succeeded")
    assert final["stop_reason"].startswith("stopped on request") and 2 <= final["trials"] <= 3
    assert all(t["status"] == "ok" for t in http.get(f"/api/v1/jobs/{job['id']}/trials").json())
    assert http.post(f"/api/v1/jobs/{job['id']}/resume").status_code == 409
    assert http.patch(f"/api/v1/jobs/{job['id']}", json={"max_trials": 9}).status_code == 409


def _api_routes(service: Service) -> list[tuple[str, str]]:
    schema = httpx.get(f"{service.url}/openapi.json").json()
    return [(method.upper(), path.replace("{job_id}", "1")) for path, item in schema["paths"].items()
            if path.startswith("/api/") for method in item]


def test_every_api_endpoint_needs_a_token_and_writes_need_write_scope(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    client(service, tokens["write"]).post("/api/v1/jobs", json=spec("target", max_trials=1))
    routes = _api_routes(service)
    assert len(routes) >= 10
    anonymous, forged, reader = client(service, None), client(service, "optico_w_forged"), client(service, tokens["read"])
    for method, path in routes:
        for http in (anonymous, forged):
            # A body FastAPI cannot decode is read before any dependency runs: still 401, not 422.
            for body in (b"{}", b"{bad", b"\xff"):
                response = http.request(method, path, content=body, headers={"Content-Type": "application/json"})
                assert response.status_code == 401, (method, path, body, response.status_code)
                assert response.headers["www-authenticate"] == "Bearer"
        response = reader.request(method, path, json={}, params={"format": "json"})
        if method == "GET":
            assert response.status_code in (200, 404), (method, path, response.text)
        else:
            assert response.status_code == 403, (method, path, response.status_code)
    assert anonymous.get("/healthz").status_code == 200 and anonymous.get("/metrics").status_code == 200
    assert anonymous.head("/healthz").status_code == 200 and anonymous.head("/readyz").status_code == 200


def test_health_and_metrics_can_require_a_token(make_service, tokens: dict[str, str]):
    closed = make_service(OPTICO_OPEN_HEALTH="false", OPTICO_OPEN_METRICS="false", OPTICO_WORKERS="0").start
    service = closed()
    assert httpx.get(f"{service.url}/metrics").status_code == 401
    assert httpx.get(f"{service.url}/readyz").status_code == 401
    reader = client(service, tokens["read"])
    assert reader.get("/readyz").json() == {"status": "ready"}
    text = reader.get("/metrics").text
    for name in ("optico_jobs{", "optico_trials_total{", "optico_trials_running ",
                 "optico_trial_duration_seconds_bucket", "optico_llm_tokens_total{", "optico_llm_cost_usd_total",
                 "optico_lease_takeovers_total"):
        assert name in text, name
    # running trials come and go: a gauge, never a counter that falls (rate() would read it as a reset)
    assert "# TYPE optico_trials_running gauge" in text and 'optico_trials_total{status="running"}' not in text


BAD_BODIES = [
    ({}, "workload"),
    ([], "body"),
    ({"name": "x", "workload": {"model": "llama3-8b"}}, "workload.cluster"),
    ({**spec(), "nme": "typo"}, "nme"),
    ({**spec(), "workload": {**spec()["workload"], "model": "llama-99b"}}, "workload.model"),
    ({**spec(), "workload": {**spec()["workload"], "cluster": {"gpu": "tpu-v9", "gpus_per_node": 8}}},
     "workload.cluster"),
    ({**spec(), "workload": {**spec()["workload"], "cluster": {"gpu": "a100-80gb", "gpus_per_node": 0}}},
     "workload.cluster"),
    ({**spec(), "workload": {**spec()["workload"], "seq_length": "long"}}, "workload.seq_length"),
    ({**spec(), "workload": {**spec()["workload"], "global_batch_size": 0}}, "workload.global_batch_size"),
    ({**spec(), "workload": {**spec()["workload"], "precision": "fp64"}}, "workload.precision"),
    ({**spec(), "search_space": {"tunables": ["warp_speed"]}}, "search_space"),
    ({**spec(), "search_space": {"fixed": {"warp_speed": 1}}}, "search_space"),
    ({**spec(), "search_space": {"tunables": ["tp"], "frozen": {}}}, "search_space.frozen"),
    ({**spec(), "baseline": {"tensor_model_parallel_size": 3}}, "baseline"),
    ({**spec(), "budget": {"max_trials": 0}}, "budget.max_trials"),
    ({**spec(), "budget": {"target_mfu": 2}}, "budget.target_mfu"),
    ({**spec(), "budget": {"gpu_hours": -1}}, "budget.gpu_hours"),
    ({**spec(), "launcher": {"kind": "slurm"}}, "launcher.kind"),
    ({**spec(), "launcher": {"kind": "sim", "noise": 5}}, "launcher.noise"),
    ({**spec(), "launcher": {"kind": "sim", "pass_env": ["OPTICO_LLM_API_KEY"]}}, "launcher.pass_env"),
    ({**spec(), "launcher": {"kind": "replay", "data": "/etc/passwd"}}, "launcher.data"),
    ({**spec(), "launcher": {"kind": "replay", "data": "../../etc/passwd"}}, "launcher.data"),
    ({**spec(), "calibration": "/etc/shadow"}, "calibration"),
    ({**spec(), "launcher": {"kind": "local", "program": {"kind": "megatron-lm", "command": ["rm", "-rf", "/"]}}},
     "launcher.program"),
    ({**spec(), "launcher": {"kind": "ray", "address": "ray://127.0.0.1:18999"}}, "launcher.address"),
    ({**spec(), "launcher": {"kind": "local", "env": {"NCCL_NET_PLUGIN": "evil"}}}, "launcher.env.NCCL_NET_PLUGIN"),
    ({**spec(), "launcher": {"kind": "local", "env": {"CUDA_INJECTION64_PATH": "x.so"}}},
     "launcher.env.CUDA_INJECTION64_PATH"),
    ({**spec(), "launcher": {"kind": "local", "env": {"CUDA_HOME": "x"}}}, "launcher.env.CUDA_HOME"),
    ({**spec(), "launcher": {"kind": "local", "env": {"TORCHINDUCTOR_CACHE_DIR": "x"}}},
     "launcher.env.TORCHINDUCTOR_CACHE_DIR"),
    ({**spec(), "launcher": {"kind": "local", "env": {"NCCL_TOPO": "/tmp/evil"}}}, "launcher.env.NCCL_TOPO"),
    ({**spec(), "launcher": {"kind": "local", "env": {"GLIBC_TUNABLES": "glibc.malloc.mxfast=0"}}},
     "launcher.env.GLIBC_TUNABLES"),
    ({**spec(), "launcher": {"kind": "local", "env": {"MALLOC_CONF": "prof:true"}}}, "launcher.env.MALLOC_CONF"),
    ({**spec(), "launcher": {"kind": "local", "env": {"OMPI_MCA_plm_rsh_agent": "sh -c evil"}}},
     "launcher.env.OMPI_MCA_plm_rsh_agent"),
    ({**spec(), "launcher": {"kind": "local", "env": {"KINETO_CONFIG": "evil.cfg"}}}, "launcher.env.KINETO_CONFIG"),
    ({**spec(), "launcher": {"kind": "local", "env": {"NCCL_TOPO_FILE": "topo.xml"}}}, "launcher.env.NCCL_TOPO_FILE"),
    ({**spec(), "reasoner": "magic"}, "reasoner"),
    ({**spec(), "seed": "x"}, "seed"),
]


def test_bad_bodies_get_422_naming_the_field(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    before = [j["id"] for j in http.get("/api/v1/jobs").json()["items"]]
    for body, field in BAD_BODIES:
        response = submit(http, body)
        assert response.status_code == 422, (field, response.status_code, response.text)
        detail = response.json()["detail"][0]
        assert detail["loc"][0] == "body" and field in ".".join(map(str, detail["loc"])), (field, detail)
        assert detail["msg"], field
    raw = [(b"{", "application/json"), (b"\xff\xfe\x00", "application/json"), (b"name: [unclosed", "application/yaml"),
           (("[" * 200 + "]" * 200).encode(), "application/json"),
           (("[" * 5000 + "]" * 5000).encode(), "application/json"), (b'{"a": ' + b"9" * 5000 + b"}", "application/json"),
           (b"<html></html>", "text/html")]
    for content, kind in raw:
        response = http.post("/api/v1/jobs", content=content, headers={"Content-Type": kind})
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body"], response.text
        assert not any(word in response.text for word in ("sys.", "recursion")), response.text  # our words
    assert len(BAD_BODIES) + len(raw) >= 20
    for hidden in ("\u0085", "\u2028"):  # raw in a JSON string: a name with a line break, not with a space
        body = json.dumps(spec(f"two{hidden}lines"), ensure_ascii=False).encode()
        response = http.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][:2] == ["body", "name"], response.text
    assert [j["id"] for j in http.get("/api/v1/jobs").json()["items"]] == before  # nothing was written
    # A secret's value (a token may hold '/') is not a path: it is taken from the worker's environment.
    secret = submit(http, {**spec("secret-env", max_trials=1), "launcher": {"kind": "sim", "env": {"HF_TOKEN": "ab/cd"}}})
    assert secret.status_code == 201, secret.text


def test_a_credential_sent_anywhere_is_neither_echoed_nor_kept_and_a_spec_secret_stays_its_own(
        served: tuple[Service, dict[str, str]]):
    """A key in the wrong field, query or header comes back masked, an Idempotency-Key is kept only as
    a hash, and a secret written into one spec's `launcher.env` masks nothing in another job."""
    service, tokens = served
    http = client(service, tokens["write"])
    key = "sk-" + "q7Zx" * 6
    body = spec("leaky")
    body["workload"]["cluster"]["gpu"] = key
    for response in (submit(http, body), http.get("/api/v1/jobs", params={"status": key}),
                     http.get(f"/api/v1/jobs/{key}"), http.patch("/api/v1/jobs/1", json={"max_trials": key})):
        assert response.status_code == 422 and key not in response.text and "***" in response.text, response.text
    for refused in (f"optico-{key}", f"idem-{key}" + "x" * 255):  # a reserved prefix; too long
        response = submit(http, spec("idem", max_trials=1), **{"Idempotency-Key": refused})
        assert response.status_code == 422 and key[3:] not in response.text, response.text
        assert response.json()["detail"][0]["loc"] == ["header", "idempotency-key"]
    made = submit(http, spec("idem", max_trials=1), **{"Idempotency-Key": f"idem-{key}"})
    assert made.status_code == 201, made.text
    clash = submit(http, spec("idem-other", max_trials=1), **{"Idempotency-Key": f"idem-{key}"})
    assert clash.status_code == 409 and key not in clash.text and f"job {made.json()['id']}" in clash.text
    again = submit(http, spec("idem", max_trials=1), **{"Idempotency-Key": f"idem-{key}"})
    assert again.status_code == 200 and again.json()["id"] == made.json()["id"]
    with SqlStore(service.db_url) as store, store.engine.connect() as db:
        kept = db.execute(text("SELECT idempotency_key FROM optico_jobs WHERE id = :i"), {"i": made.json()["id"]}).scalar()
    assert kept.startswith("sha256:") and key not in kept
    # One writer's short "secret" must not become a mask over everyone's names.
    assert submit(http, {**spec("env", max_trials=1), "launcher": {"kind": "sim", "env": {"MY_TOKEN": "nightly"}}}
                  ).status_code == 201
    named = submit(http, spec("llama-nightly-2026-11-24", max_trials=1))
    assert named.status_code == 201 and named.json()["name"] == "llama-nightly-2026-11-24"
    assert http.get(f"/api/v1/jobs/{named.json()['id']}").json()["name"] == "llama-nightly-2026-11-24"
    assert [j["id"] for j in http.get("/api/v1/jobs", params={"name": "nightly"}).json()["items"]] == [named.json()["id"]]


def test_undecodable_json_bodies_get_422_with_the_reason_on_every_endpoint(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    bodies = [(b'{"max_trials": "\xff"}', "not UTF-8"), (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
              (b'{"max_trials": ' + b"9" * 5000 + b"}", "too many digits"),
              # json.loads guessed UTF-16 from a byte-order mark; the last of two keys won (max_trials 4).
              (b'\xff\xfe{"max_trials": 3}', "not UTF-8"), (b'{"max_trials": 3, "max_trials": 4}', "duplicate key 'max_trials'"),
              (b'{"spec": {"a": 1, "a": 2}}', "duplicate key 'a'"),
              (b"not json", "not valid JSON: Expecting value at character 0")]
    for method, path in (("PATCH", "/api/v1/jobs/1"), ("POST", "/api/v1/schedules")):
        for content, reason in bodies:
            response = http.request(method, path, content=content, headers={"Content-Type": "application/json"})
            assert response.status_code == 422, (path, response.status_code, response.text)
            [detail] = response.json()["detail"]
            assert detail["loc"] == ["body"] and reason in detail["msg"] and detail["type"] == "json_invalid", detail


def test_a_json_body_sent_as_another_content_type_gets_422_naming_the_content_type(
        served: tuple[Service, dict[str, str]]):
    """`curl -X PATCH -d '{"max_trials": 30}'` without `-H Content-Type` sends a form type: FastAPI then
    hands the model the raw bytes, and the 422 said "Input should be a valid dictionary" with the
    bytes' repr, not why."""
    service, tokens = served
    http = client(service, tokens["write"])
    job = submit(http, spec("form-body", max_trials=1)).json()["id"]
    for method, path in (("PATCH", f"/api/v1/jobs/{job}"), ("POST", "/api/v1/schedules")):
        for kind in ("application/x-www-form-urlencoded", "text/plain"):
            response = http.request(method, path, content=b'{"max_trials": 30}', headers={"Content-Type": kind})
            assert response.status_code == 422, (path, response.status_code, response.text)
            [detail] = response.json()["detail"]
            assert detail["loc"] == ["body"] and detail["type"] == "content_type", detail
            assert kind in detail["msg"] and "application/json" in detail["msg"], detail


def test_large_bodies_get_413(make_service, tokens: dict[str, str]):
    service = make_service(OPTICO_MAX_BODY_BYTES="4096", OPTICO_WORKERS="0").start()
    http = client(service, tokens["write"])
    big = {**spec(), "name": "x" * 10_000}
    refused = submit(http, big)  # Content-Length says so: refused before the body is read
    assert refused.status_code == 413 and "4096 bytes" in refused.json()["detail"], refused.text
    chunked = http.post("/api/v1/jobs", content=iter([json.dumps(big).encode()]),
                        headers={"Content-Type": "application/json"})  # no Content-Length: counted as it comes
    assert chunked.status_code == 413 and chunked.json()["detail"], chunked.text
    anonymous = client(service, None)  # without a token: the 401 first (PATCH read the body first: 413)
    for method, path in (("PATCH", "/api/v1/jobs/1"), ("POST", "/api/v1/schedules"), ("POST", "/api/v1/jobs")):
        response = anonymous.request(method, path, content=iter([json.dumps(big).encode()]),
                                     headers={"Content-Type": "application/json"})
        assert response.status_code == 401, (method, path, response.status_code)
    # A Content-Length past any integer a server reads (httpx will not send one: a raw request).
    address = urlsplit(service.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as raw:
        raw.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Authorization: Bearer " + tokens["write"].encode() + b"\r\nContent-Length: " + b"9" * 40
                    + b"\r\n\r\n{}")
        answer = raw.recv(4096).decode("latin-1")
    assert answer.split()[1] in ("400", "413"), answer  # refused by uvicorn or the gate, never a 500
    assert submit(http, spec("small", max_trials=1)).status_code == 201


def test_unknown_jobs_are_404(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["read"])
    for path in ("/api/v1/jobs/999", "/api/v1/jobs/999/trials", "/api/v1/jobs/999/report",
                 "/api/v1/jobs/999/events", "/api/v1/jobs/999/messages"):
        response = http.get(path)
        assert response.status_code == 404 and response.json()["detail"] == "no job 999", path


def test_a_405_names_every_method_the_path_takes(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    for method, path, allowed in (("PUT", "/api/v1/jobs/1", "GET, PATCH"), ("DELETE", "/api/v1/jobs", "GET, POST"),
                                  ("PUT", "/api/v1/schedules/nightly", "DELETE, GET"),
                                  ("POST", "/healthz", "GET, HEAD")):
        response = http.request(method, path)
        assert response.status_code == 405 and response.headers["allow"] == allowed, (method, path, response.headers)
    probes = http.get("/openapi.json").json()["paths"]["/readyz"]
    assert set(probes) == {"get", "head"} and probes["get"]["operationId"] != probes["head"]["operationId"]


def test_racing_submissions_with_one_key_get_one_201_and_an_empty_key_is_refused(served: tuple[Service, dict[str, str]]):
    """Whether a submission created its job is decided where the job is written: of ten racing
    requests with one Idempotency-Key exactly one is told 201."""
    from concurrent.futures import ThreadPoolExecutor

    service, tokens = served
    body = spec("raced", max_trials=1)

    def send(_: int) -> httpx.Response:
        with client(service, tokens["write"]) as http:
            return submit(http, body, **{"Idempotency-Key": f"race-{service.url}"})

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(send, range(10)))
    assert sorted(a.status_code for a in answers) == [200] * 9 + [201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    empty = submit(client(service, tokens["write"]), body, **{"Idempotency-Key": ""})
    assert empty.status_code == 422 and "idempotency-key" in str(empty.json()["detail"][0]["loc"]).lower(), empty.text
    # The schedules' retune jobs have keys of their own: a user's key there could block or hijack one.
    reserved = submit(client(service, tokens["write"]), body, **{"Idempotency-Key": "Optico-retune-tick-4"})
    assert reserved.status_code == 422 and "reserved" in reserved.json()["detail"][0]["msg"], reserved.text


def test_without_a_token_every_job_is_401_whether_it_exists_or_not(served: tuple[Service, dict[str, str]]):
    """The token is checked before the job is looked up: an anonymous caller cannot tell which ids exist."""
    service, tokens = served
    existing = client(service, tokens["write"]).post("/api/v1/jobs", json=spec("exists", max_trials=1)).json()["id"]
    anonymous = client(service, None)
    for job_id in (existing, 999_999):
        for method, path in (("GET", ""), ("GET", "/trials"), ("GET", "/messages"), ("GET", "/report"),
                             ("GET", "/events"), ("POST", "/stop"), ("POST", "/cancel"), ("POST", "/resume"),
                             ("PATCH", "")):
            response = anonymous.request(method, f"/api/v1/jobs/{job_id}{path}", json={} if method == "PATCH" else None)
            assert response.status_code == 401, (job_id, method, path, response.status_code, response.text)
    for method, path in (("PUT", f"/api/v1/jobs/{existing}"), ("DELETE", "/api/v1/jobs")):  # a 405 named the methods
        response = anonymous.request(method, path)
        assert response.status_code == 401 and "allow" not in response.headers, (method, path, response.status_code)
    assert client(service, tokens["read"]).request("DELETE", "/api/v1/jobs").status_code == 405  # with a token


def test_integers_in_paths_and_queries_are_digits_only(served: tuple[Service, dict[str, str]]):
    """Python reads '1_0' as 10 and pydantic '1.0' as 1: /jobs/1_0 answered for job 10."""
    service, tokens = served
    http = client(service, tokens["read"])
    for path in ("/api/v1/jobs/1_0", "/api/v1/jobs/+1", "/api/v1/jobs/1.0", "/api/v1/jobs/%201",
                 "/api/v1/jobs?limit=1_0", "/api/v1/jobs?cursor=0x1", "/api/v1/jobs?cursor=%EF%BC%91"):
        response = http.get(path)
        assert response.status_code == 422 and "digits" in response.text, (path, response.text)


HUGE = "9" * 25  # beyond SQL's BIGINT: the drivers refuse to bind it
# Beyond the pool's INTEGER columns (32-bit on PostgreSQL, where binding it is a DataError), within BIGINT.
INT32_OVER = str(2**31)


def test_numbers_beyond_sql_integers_are_refused_not_500(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["read"])
    if http.get("/api/v1/jobs/1").status_code == 404:  # run alone: job 1's sub-paths need a job 1
        assert submit(client(service, tokens["write"]), spec("job-one", max_trials=1)).json()["id"] == 1
    for path in (f"/api/v1/jobs/{INT32_OVER}", f"/api/v1/jobs?cursor={INT32_OVER}",
                 f"/api/v1/jobs/1/trials?after={INT32_OVER}", f"/api/v1/jobs/1/messages?after={INT32_OVER}",
                 f"/api/v1/jobs/1/events?after={INT32_OVER}",f"/api/v1/jobs/{HUGE}", f"/api/v1/jobs/{HUGE}/trials", f"/api/v1/jobs/{HUGE}/report",
                 f"/api/v1/jobs/{HUGE}/messages", f"/api/v1/jobs?cursor={HUGE}",
                 f"/api/v1/jobs/1/trials?after={HUGE}", f"/api/v1/jobs/1/messages?iteration={HUGE}",
                 f"/api/v1/jobs/{HUGE}/events", f"/api/v1/jobs/1/events?after={HUGE}"):
        response = http.get(path)
        assert response.status_code == 422, (path, response.status_code, response.text[:300])
        assert response.json()["detail"][0]["type"] == "less_than_equal", path
    # The dashboard's pages behind a session: the same bound, and typed-in compare ids name no job.
    with httpx.Client(base_url=service.url, timeout=30) as browser:
        assert browser.post("/login", data={"token": tokens["read"], "next": "/"}).status_code in (200, 303)
        for path in (f"/jobs/{HUGE}", f"/jobs/1/trials/{HUGE}", f"/ui/jobs/{HUGE}/rows", f"/ui/jobs/1/rows?after={HUGE}"):
            assert browser.get(path).status_code == 422, path
        assert browser.get(f"/compare?jobs={HUGE}&job={HUGE}").status_code == 200


def test_a_non_loopback_host_needs_a_token_to_exist(tmp_path):
    import subprocess
    import sys

    env = {"OPTICO_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}", "OPTICO_HOME": str(tmp_path), "PATH": "/usr/bin"}
    done = subprocess.run([sys.executable, "-m", "optico.cli", "serve", "--host", "0.0.0.0", "--port", "1"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no API token exists" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "empty.db").exists()  # refused: no pool created (it was, migrated)


def test_odd_but_well_formed_requests_get_4xx_not_500(served: tuple[Service, dict[str, str]]):
    service, tokens = served
    http = client(service, tokens["write"])
    # A NUL in a query or path parameter: PostgreSQL refuses to bind it (that read as a database outage, 503).
    for path in ("/api/v1/jobs?name=%00", "/api/v1/jobs?workload=a%00b", "/api/v1/schedules/%00"):
        response = http.get(path)
        assert response.status_code == 422, (path, response.status_code, response.text[:200])
        assert response.json()["detail"][0]["msg"] == "contains a NUL character"
        # Without a token, the token is what is wrong first (it answered the NUL, to anyone).
        anonymous = httpx.get(f"{service.url}{path}")
        assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"] == "Bearer", path
    # An API query parameter given twice: FastAPI kept the last (limit=1&limit=2 listed two jobs).
    response = http.get("/api/v1/jobs?limit=1&name=x&limit=2")
    assert response.status_code == 422, response.text[:200]
    assert response.json()["detail"] == [{"loc": ["query", "limit"], "msg": "given more than once", "type": "value_error"}]
    assert httpx.get(f"{service.url}/api/v1/jobs?limit=1&limit=2").status_code == 401  # the token first
    # No API parameter is a list, so the rule refuses nothing a client may mean (the dashboard's
    # /compare?job=1&job=2 is one, and is not under /api/).
    schema = http.get("/openapi.json").json()
    lists = [(path, p["name"]) for path, item in schema["paths"].items() if path.startswith("/api/")
             for operation in item.values() for p in operation.get("parameters", [])
             if p["in"] == "query" and "array" in json.dumps(p["schema"])]
    assert lists == []
    assert http.get("/compare?job=1&job=2").status_code != 422
    # Two Authorization headers: Starlette read the first, a proxy in front may read the other.
    twice = httpx.get(f"{service.url}/api/v1/jobs", headers=[("Authorization", f"Bearer {tokens['write']}"),
                                                             ("Authorization", "Bearer optico_w_forged")])
    assert twice.status_code == 400 and twice.json()["detail"] == "header authorization: given more than once"
    # Two Idempotency-Keys: the first was kept, and the second made a new job on its own later.
    twice = http.post("/api/v1/jobs", json=spec("two-keys", max_trials=1),
                      headers=[("Idempotency-Key", "a"), ("Idempotency-Key", "b")])
    assert twice.status_code == 400 and twice.json()["detail"] == "header idempotency-key: given more than once"
    # Non-finite numbers in a body: FastAPI's 422 echoed them, and JSON cannot carry them (a 500).
    job = submit(http, spec("odd-requests", max_trials=1)).json()
    for body in ('{"gpu_hours": 1e400}', '{"gpu_hours": NaN}', '{"max_trials": true}', '{"max_trials": "5"}'):
        response = http.patch(f"/api/v1/jobs/{job['id']}", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, (body, response.status_code, response.text[:200])
        assert response.json()["detail"][0]["loc"][-1] in ("gpu_hours", "max_trials"), body
    # A non-finite number in a query says so (it said "less than or equal to 1e16").
    for value in ("nan", "inf"):
        response = http.get(f"/api/v1/jobs/{job['id']}/report", params={"tokens": value})
        assert response.status_code == 422 and response.json()["detail"][0]["msg"] == "Input should be a finite number"
    # A JSON body as json.dumps writes small floats ("1e-05") is a number, not a string.
    small = spec("exponent", max_trials=1, noise=0.00001)
    made = http.post("/api/v1/jobs", content=json.dumps(small), headers={"Content-Type": "application/json"})
    assert made.status_code == 201, made.text
    # Digits that str.isdigit takes and int() does not.
    events = http.get(f"/api/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": b"\xb2"}, timeout=60)
    assert events.status_code == 200 and "event: end" in events.text
    with httpx.Client(base_url=service.url, timeout=30) as browser:
        assert browser.post("/login", data={"token": tokens["read"], "next": "/"}).status_code in (200, 303)
        assert browser.get("/compare", params={"jobs": "\u00b2,1"}).status_code == 200
        for odd in ("1_0", "+1", " 1", "\u00b2"):  # int() reads all but the last as a job id
            assert browser.get("/compare", params={"job": odd}).status_code == 422, odd
            assert browser.get("/compare", params={"parallel": odd}).status_code == 422, odd
        assert browser.get("/compare", params={"jobs": "1", "parallel": str(2**31)}).status_code == 422  # no job
        # An unknown job's live stream is a 404 before the stream starts (a browser would retry forever).
        assert browser.get("/ui/jobs/99999/events").status_code == 404
    # /docs loads Swagger UI from its CDN with an inline script: its page's policy must allow both.
    policy = http.get("/docs").headers["content-security-policy"]
    assert "https://cdn.jsdelivr.net" in policy and "'unsafe-inline'" in policy.split("script-src")[1].split(";")[0]
    assert "cdn.jsdelivr.net" not in http.get("/", follow_redirects=False).headers.get("content-security-policy", "")


def test_the_access_log_keeps_a_token_sent_in_a_query_string_out(make_service, tokens: dict[str, str]):
    service = make_service("--log-level", "info").start()
    refused = httpx.get(f"{service.url}/api/v1/jobs", params={"token": tokens["write"]})
    assert refused.status_code == 401  # tokens are taken from the Authorization header only
    service.stop()
    log = service.log.read_text()
    assert "GET /api/v1/jobs?token=" in log and tokens["write"] not in log, log[-1500:]


def test_readyz_answers_at_once_while_a_worker_holds_sqlites_write_lock(tmp_path):
    import sqlite3
    import time

    db = tmp_path / "pool.db"
    service = Service(db_url=f"sqlite:///{db}", home=tmp_path / "home",
                      extra_env={"OPTICO_OPEN_HEALTH": "true", "OPTICO_WORKERS": "0"})
    service.start()
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # what a worker's transaction holds while it writes
        start = time.monotonic()
        ready = httpx.get(f"{service.url}/readyz", timeout=30)
        assert ready.json() == {"status": "ready"} and time.monotonic() - start < 3  # it waited 12-22 s
    finally:
        writer.rollback()
        writer.close()
        service.kill()


@pytest.mark.postgres
def test_readyz_during_an_outage_names_no_host_or_port(tmp_path, postgres_server_url: str):
    # A private server, stopped while the service runs (the session's server is shared by other tests).
    if os.environ.get("OPTICO_TEST_POSTGRES_URL"):
        pytest.skip("needs a PostgreSQL server of its own to stop")
    from pg_server import start_postgres

    url, stop_postgres = start_postgres()
    service = Service(db_url=url, home=tmp_path / "home", extra_env={"OPTICO_OPEN_HEALTH": "true"})
    try:
        service.start()
        assert httpx.get(f"{service.url}/readyz").json() == {"status": "ready"}
        stop_postgres()
        down = httpx.get(f"{service.url}/readyz", timeout=60)
        assert down.status_code == 503 and down.json()["status"] == "unavailable"
        port = url.rsplit(":", 1)[1].split("/")[0]
        assert port not in down.text and "127.0.0.1" not in down.text and "connection" not in down.text.lower()
    finally:
        service.kill()
        stop_postgres()


def test_the_session_cookie_is_secure_behind_a_tls_proxy_when_told(make_service, tokens: dict[str, str]):
    plain = make_service().start()
    cookie = httpx.post(f"{plain.url}/login", data={"token": tokens["read"], "next": "/"}).headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie  # plain http, no proxy
    plain.stop()
    proxied = make_service(OPTICO_SECURE_COOKIES="true").start()
    cookie = httpx.post(f"{proxied.url}/login", data={"token": tokens["read"], "next": "/"}).headers["set-cookie"]
    assert "Secure" in cookie


@pytest.mark.parametrize(("variables", "says"), [
    # a check across two settings had no field to name: a traceback (IndexError), exit 1
    ({"OPTICO_LEASE_S": "60", "OPTICO_LEASE_RENEW_S": "100"}, "OPTICO_LEASE_RENEW_S: must be shorter than OPTICO_LEASE_S"),
    ({"OPTICO_SCHEDULER": "maybe"}, "OPTICO_SCHEDULER: "),  # was named OPTICO_OPTICO_SCHEDULER
    ({"OPTICO_WEBHOOK_ALLOW_LOCAL": "maybe"}, "OPTICO_WEBHOOK_ALLOW_LOCAL: "),  # was read as false
    ({"OPTICO_FILE_ROOTS": "[" * 100_000}, "OPTICO_FILE_ROOTS: not valid JSON"),  # a RecursionError traceback
])
def test_a_bad_service_variable_is_one_line_and_exit_2(tmp_path, variables: dict[str, str], says: str):
    import subprocess
    import sys

    env = {"OPTICO_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}", "OPTICO_HOME": str(tmp_path), "PATH": "/usr/bin",
           **variables}
    for command in (["serve", "--port", "1"], ["worker"]):
        done = subprocess.run([sys.executable, "-m", "optico.cli", *command], env=env, capture_output=True, text=True,
                              timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {says}"), done.stderr
        assert "OPTICO_OPTICO" not in done.stderr and not (tmp_path / "empty.db").exists()

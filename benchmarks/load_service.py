"""Load on a real `optico serve`: 50 concurrent submissions plus sustained reads for 30 s.

    python benchmarks/load_service.py                                   # SQLite (a temp file)
    python benchmarks/load_service.py --database postgresql://...       # PostgreSQL

Prints p50/p99 latency per request kind and overall, and the count of errors (5xx, other non-2xx,
connection errors). A load script, not a test: its numbers depend on the machine. Only loopback is
ever contacted, and every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

SPEC = {
    "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "bf16",
                 "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
    "search_space": {"tunables": ["tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
                                  "recompute_granularity"]},
    "budget": {"max_trials": 3, "converge_tol": None},
    "launcher": {"kind": "sim", "trial_seconds": 0.2, "hang_rate": 0.0},
}


def start(database: str, home: Path, port: int, workers: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
    env.update(OPTICO_DATABASE_URL=database, OPTICO_HOME=str(home), OPTICO_WORKER_POLL_S="0.2")
    proc = subprocess.Popen([sys.executable, "-m", "optico.cli", "serve", "--port", str(port), "--workers",
                             str(workers), "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("optico serve did not start")


def token(database: str) -> str:
    from optico.pool.store import SqlStore

    with SqlStore(database) as store:
        return store.create_token(f"load-{time.time_ns()}", "write")[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", help="Pool URL (default: a temporary SQLite file).")
    parser.add_argument("--submissions", type=int, default=50)
    parser.add_argument("--readers", type=int, default=8, help="Threads reading for the whole run.")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=2, help="Job workers in the service.")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--json", type=Path, help="Write the figures here.")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="optico-load-"))
    database = args.database or f"sqlite:///{home / 'pool.db'}"
    secret = token(database)
    proc = start(database, home, args.port, args.workers)
    base = f"http://127.0.0.1:{args.port}"
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    lock = threading.Lock()
    job_ids: list[int] = []

    def timed(http: httpx.Client, kind: str, method: str, url: str, **kw) -> httpx.Response | None:
        t0 = time.perf_counter()
        try:
            response = http.request(method, url, **kw)
        except httpx.HTTPError:
            with lock:
                errors["connection"] += 1
            return None
        with lock:
            latencies[kind].append(time.perf_counter() - t0)
            if response.status_code >= 500:
                errors["5xx"] += 1
            elif response.status_code >= 400:
                errors["4xx"] += 1
        return response

    def submitter(i: int) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as http:
            response = timed(http, "submit", "POST", "/api/v1/jobs", json={**SPEC, "name": f"load-{i}"})
            if response is not None and response.status_code == 201:
                with lock:
                    job_ids.append(response.json()["id"])

    stop_at = time.monotonic() + args.seconds

    def reader(n: int) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {secret}"}, timeout=60) as http:
            i = 0
            while time.monotonic() < stop_at:
                i += 1
                ids = list(job_ids) or [1]
                job = ids[(n + i) % len(ids)]
                kind = ("list", "job", "trials", "messages", "report")[i % 5]
                url = {"list": "/api/v1/jobs?limit=50", "job": f"/api/v1/jobs/{job}",
                       "trials": f"/api/v1/jobs/{job}/trials", "messages": f"/api/v1/jobs/{job}/messages",
                       "report": f"/api/v1/jobs/{job}/report"}[kind]
                timed(http, kind, "GET", url)

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(args.submissions)]
    threads += [threading.Thread(target=reader, args=(n,)) for n in range(args.readers)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.seconds + 120)
    wall = time.monotonic() - t0
    proc.terminate()
    proc.wait(timeout=60)

    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[q - 1] * 1000 if len(values) > 1 else values[0] * 1000

    rows = {kind: {"n": len(v), "p50_ms": pct(v, 50), "p99_ms": pct(v, 99)} for kind, v in sorted(latencies.items())}
    everything = [x for v in latencies.values() for x in v]
    rows["all"] = {"n": len(everything), "p50_ms": pct(everything, 50), "p99_ms": pct(everything, 99)}
    backend = database.split(":", 1)[0]
    print(f"{backend}: {args.submissions} submissions + {args.readers} readers for {args.seconds:.0f} s "
          f"(wall {wall:.1f} s), {args.workers} workers, {len(job_ids)} jobs created")
    print(f"{'request':<10} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for kind, row in rows.items():
        print(f"{kind:<10} {row['n']:>6} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}")
    print("errors:", dict(errors) or "none")
    if args.json:
        args.json.write_text(json.dumps({"backend": backend, "rows": rows, "errors": dict(errors),
                                         "jobs_created": len(job_ids)}, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""Takes the dashboard screenshots the README and docs/dashboard.md show (docs/img/*.png).

    python benchmarks/dashboard_screenshots.py [--out docs/img]

Starts a real `optico serve` on a temporary pool, runs a few simulated jobs through it (different
workloads, one whose baseline runs out of memory), then photographs the jobs page and a job page in
Debian's Chromium (Playwright with `executable_path`). Only loopback is contacted.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/lib/chromium/chromium") if Path(p).exists()), None)
WORKLOAD = {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "bf16",
            "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}}


def job(name: str, *, seq: int = 8192, gpu: str = "a100-80gb", nodes: int = 1, seed: int = 0,
        baseline: dict | None = None) -> dict:
    body = {"name": name, "seed": seed,
            "workload": {**WORKLOAD, "seq_length": seq, "cluster": {"gpu": gpu, "gpus_per_node": 8, "nodes": nodes}},
            "search_space": {"tunables": ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                                          "virtual_pipeline_model_parallel_size", "micro_batch_size",
                                          "recompute_granularity", "sequence_parallel", "overlap_grad_reduce",
                                          "cross_entropy_loss_fusion"],
                             "fixed": {"use_distributed_optimizer": True}},
            "budget": {"max_trials": 12, "converge_tol": None},
            "launcher": {"kind": "sim", "trial_seconds": 0.05}}
    if baseline:
        body["baseline"] = baseline
    return body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    if CHROMIUM is None:
        raise SystemExit("Debian's chromium is not installed (apt-get install chromium)")
    home = Path(tempfile.mkdtemp(prefix="optico-shots-"))
    db = f"sqlite:///{home / 'pool.db'}"
    from optico.pool.store import SqlStore

    with SqlStore(db) as store:
        token = store.create_token("screenshots", "write")[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
    env.update(OPTICO_DATABASE_URL=db, OPTICO_HOME=str(home), OPTICO_WORKERS="2", OPTICO_WORKER_POLL_S="0.2")
    server = subprocess.Popen([sys.executable, "-m", "optico.cli", "serve", "--port", str(port), "--log-level",
                               "warning"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        bodies = [job("llama3-8b-a100-nightly", seed=1), job("llama3-8b-a100-32k", seq=32768, seed=2),
                  job("llama3-8b-h100x16", gpu="h100-sxm", nodes=2, seed=3),
                  job("llama3-8b-a100-mbs8-baseline", seed=4,
                      baseline={"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
                                "micro_batch_size": 8, "use_distributed_optimizer": True})]
        ids = [http.post("/api/v1/jobs", json=b).raise_for_status().json()["id"] for b in bodies]
        deadline = time.monotonic() + 600
        while any(http.get(f"/api/v1/jobs/{i}").json()["status"] not in ("succeeded", "failed") for i in ids):
            if time.monotonic() > deadline:
                raise SystemExit("the jobs did not finish in 10 minutes")
            time.sleep(0.5)
        from playwright.sync_api import sync_playwright

        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{base}/login")
            page.fill("#token", token)
            page.click("form[action='/login'] button[type=submit]")
            page.wait_for_url(f"{base}/")
            page.screenshot(path=str(args.out / "dashboard-jobs.png"))
            page.goto(f"{base}/jobs/{ids[-1]}")
            page.wait_for_function("() => document.getElementById('chart-mfu').data !== undefined")
            page.screenshot(path=str(args.out / "dashboard-job.png"))
            browser.close()
        print(f"wrote {args.out / 'dashboard-jobs.png'} and {args.out / 'dashboard-job.png'}")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()

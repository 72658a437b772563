"""A real `optico serve` (or `optico worker`) process on a free port, for the service tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

# Short leases and fast polls so that takeovers and live views happen within seconds.
FAST = {"OPTICO_LEASE_S": "3", "OPTICO_LEASE_RENEW_S": "0.5", "OPTICO_WORKER_POLL_S": "0.2",
        "OPTICO_SSE_POLL_S": "0.1", "OPTICO_SSE_RECHECK_S": "0.5", "OPTICO_SCHEDULER_POLL_S": "0.5"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spec(name: str = "svc", *, max_trials: int = 4, trial_seconds: float = 0.3, seed: int = 0,
         **launcher: Any) -> dict[str, Any]:
    """A small sim job: exact trial count (no convergence stop, no hangs that RETRY)."""
    return {
        "name": name, "seed": seed,
        "workload": {"model": "llama3-8b", "seq_length": 8192, "global_batch_size": 512, "precision": "bf16",
                     "cluster": {"gpu": "a100-80gb", "gpus_per_node": 8, "nodes": 1}},
        "search_space": {"tunables": ["tensor_model_parallel_size", "pipeline_model_parallel_size",
                                      "micro_batch_size", "recompute_granularity"]},
        "budget": {"max_trials": max_trials, "converge_tol": None},
        "launcher": {"kind": "sim", "trial_seconds": trial_seconds, "hang_rate": 0.0, **launcher},
    }


@dataclass
class Service:
    """One `optico serve` process; `url` is its base URL."""

    db_url: str
    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPTICO_")}
        env.update(FAST)
        env.update({"OPTICO_DATABASE_URL": self.db_url, "OPTICO_HOME": str(self.home), "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        return env

    def start(self, *, wait: bool = True, **extra_env: str) -> Service:
        """Starts the process; with `wait` (default) returns once it answers /healthz."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.log = self.home / f"serve-{time.monotonic_ns()}.log"
        env = {**self.env(), **extra_env}
        self.proc = subprocess.Popen([sys.executable, "-m", "optico.cli", "serve", "--port", str(self.port),
                                      "--log-level", "warning", *self.args], env=env,
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        if not wait:
            return self
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"optico serve exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code in (200, 401):
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"optico serve did not answer: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def wait_dead(self, timeout: float = 120) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as a deployment's rolling restart sends it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()


def client(service: Service, token: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=service.url, headers=headers, timeout=30)


def wait_for(predicate, timeout: float = 90, every: float = 0.2, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def sse_events(response: httpx.Response) -> Iterator[tuple[str, str, Any]]:
    """(id, event, data) of each server-sent event of a streaming response."""
    event_id, kind, data = "", "message", []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield event_id, kind, json.loads("\n".join(data))
            event_id, kind, data = "", "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                event_id = value
            elif name == "event":
                kind = value
            elif name == "data":
                data.append(value)

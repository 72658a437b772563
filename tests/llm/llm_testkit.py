"""Helpers for the LLM reasoner tests: a launcher that fails chosen trials, the job spec,
running a job, reading its messages."""

from __future__ import annotations

from pathlib import Path

from optico.launchers.base import Launcher, ProgressCallback
from optico.launchers.sim import SimLauncher
from optico.pool.store import SqlStore
from optico.report import job_result
from optico.runner import run_job
from optico.spec import JobSpec, ReasonerSpec, load_spec
from optico.strategy import Strategy
from optico.trial import LaunchResult
from optico.workload import Workload

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "llama3-8b-a100.yaml"
API_KEY = "sk-test-DO-NOT-STORE-1234567890abcdef"

OOM_LOG = """[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 291, in <module>
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB
E1122 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0"""

# Short everything: three attempts, 50 ms backoff, no breaker unless a test wants one.
FAST = {"OPTICO_LLM_MAX_ATTEMPTS": "3", "OPTICO_LLM_BACKOFF_BASE_S": "0.05", "OPTICO_LLM_BACKOFF_MAX_S": "0.2",
        "OPTICO_LLM_TIMEOUT_S": "10", "OPTICO_LLM_BREAKER_FAILURES": "1000"}


class FailingAt(Launcher):
    """The simulator, except that the trials named in `logs` fail with the given log."""

    kind = "sim"

    def __init__(self, logs: dict[int, str], seed: int = 0):
        self.logs, self.inner = logs, SimLauncher(seed=seed, hang_rate=0.0)

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        index = int(trial_key.rsplit("trial", 1)[1])
        if index in self.logs:
            return LaunchResult(ok=False, log=self.logs[index], exit_code=1, duration_s=90.0, gpu_seconds=720.0)
        return await self.inner.launch(workload, strategy, trial_key=trial_key, progress=progress)


def llm_spec(max_trials: int = 5, reasoner: str | ReasonerSpec = "openai") -> JobSpec:
    spec = load_spec(EXAMPLE)
    chosen = reasoner if isinstance(reasoner, ReasonerSpec) else ReasonerSpec(
        analysis=reasoner, generation=reasoner, failure=reasoner)
    return spec.model_copy(update={"reasoner": chosen,
                                   "budget": spec.budget.model_copy(update={"max_trials": max_trials}),
                                   "launcher": spec.launcher.model_copy(update={"hang_rate": 0.0})})


def run_llm_job(db_url: str, spec: JobSpec, launcher: Launcher | None = None) -> tuple[dict, SqlStore]:
    store = SqlStore(db_url)
    job_id = store.create_job(spec)
    run_job(store, db_url, job_id, launcher=launcher)
    return job_result(store, job_id), store


def messages_of(store: SqlStore, job_id: int, agent: str | None = None, kind: str | None = None) -> list:
    return [m for m in store.messages(job_id) if (agent is None or m.agent == agent)
            and (kind is None or m.kind == kind)]

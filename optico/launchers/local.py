"""The local launcher: torchrun on this machine, one trial at a time.

Each trial gets a run directory (`<run_dir>/<trial_key>`, by default under the data
directory: ``~/.local/share/optico/runs/job1-trial3``) holding the driver's spec file,
``stdout.log``, ``stderr.log`` and ``command.txt``. torchrun starts in a session of its own;
the run is stopped whole (`optico.launchers.proc`) when it passes the wall-clock limit
(`timeout_s`), when it prints nothing for `hang_s`, or when `launch` is cancelled. The exit
status and the log tail go to failure analysis (`optico.launchers.results`).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from optico.launchers.base import Launcher, ProgressCallback
from optico.launchers.proc import ProcessRun
from optico.launchers.program import MegatronCoreProgram, MegatronLMProgram, PreparedRun, prepare
from optico.launchers.trial_env import trial_env
from optico.launchers.results import OutputCollector, RunEnd, driver_result, megatron_lm_result
from optico.plausible import checked_result
from optico.private_files import private_dir, write_private_text
from optico.strategy import Strategy
from optico.trial import LaunchResult
from optico.workload import Workload

KILL_GRACE_S = 10.0  # SIGTERM, then this long for torchrun to stop its workers, then SIGKILL
POLL_S = 0.25


def default_runs_dir() -> Path:
    from optico.paths import default_data_dir

    return default_data_dir() / "runs"


def trial_dir(root: str | os.PathLike | None, trial_key: str) -> Path:
    """A fresh directory for this trial: `<root>/<trial_key>`, or `<trial_key>.2`, ... when a
    resumed job runs the key again (the earlier attempt's logs are kept)."""
    base = private_dir(Path(root).expanduser() if root else default_runs_dir())
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in trial_key) or "trial"
    path, n = base / safe, 1
    while True:
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)  # the run's command line and logs are the owner's only
            return path
        except FileExistsError:
            n += 1
            path = base / f"{safe}.{n}"


def package_root() -> str:
    """The directory holding the `optico` package (put on PYTHONPATH of the training processes)."""
    import optico

    return str(Path(optico.__file__).resolve().parent.parent)


def child_env(extra: dict[str, str], pass_env: Iterable[str] = ()) -> dict[str, str]:
    """The allowlisted environment (`trial_env`: never our secrets), the spec's `env` and `pass_env`,
    optico importable."""
    env = trial_env(extra, pass_env)
    root = package_root()
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        env["PYTHONPATH"] = os.pathsep.join([root, *paths])
    return env


def write_files(run: PreparedRun, run_dir: Path) -> None:
    for name, content in run.files.items():
        write_private_text(run_dir / name, content)


def to_result(run: PreparedRun, collector: OutputCollector, end: RunEnd, workload: Workload, strategy: Strategy,
              *, fingerprint: dict[str, Any], log_path: str | None) -> LaunchResult:
    gpu_seconds = end.duration_s * workload.world_size
    if run.kind == "megatron-core":
        result = driver_result(collector, end, workload, gpu_seconds=gpu_seconds, fingerprint=fingerprint,
                               log_path=log_path)
    else:
        result = megatron_lm_result(collector, end, workload, warmup_iters=run.warmup_iters, tp=strategy.tp,
                                    gpu_seconds=gpu_seconds, fingerprint=fingerprint, log_path=log_path)
    return checked_result(result, workload)  # numbers the declared GPU cannot produce are no measurement


class LocalLauncher(Launcher):
    """torchrun on this machine; see the module docstring."""

    kind = "local"

    def __init__(self, program: MegatronCoreProgram | MegatronLMProgram | None = None, *, timeout_s: float = 3600,
                 hang_s: float = 600, env: dict[str, str] | None = None, run_dir: str | os.PathLike | None = None,
                 kill_grace_s: float = KILL_GRACE_S, pass_env: Iterable[str] = ()):
        self.program = program or MegatronCoreProgram()
        self.timeout_s, self.hang_s, self.kill_grace_s = timeout_s, hang_s, kill_grace_s
        self.env = dict(env or {})
        self.pass_env = tuple(pass_env)
        self.run_dir = run_dir

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "program": self.program.model_dump(mode="json"), "timeout_s": self.timeout_s,
                "hang_s": self.hang_s, "run_dir": str(self.run_dir or default_runs_dir())}

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        run = prepare(self.program, workload, strategy)
        if run.nnodes > 1:
            raise ValueError(f"launcher.kind: local runs on this machine, but the workload needs {run.nnodes} nodes "
                             f"of {run.nproc_per_node} GPUs; use kind: ray")
        directory = trial_dir(self.run_dir, trial_key)
        write_files(run, directory)
        argv = run.command(str(directory), trial_key=trial_key)
        write_private_text(directory / "command.txt", shlex.join(argv) + "\n")
        collector = OutputCollector()

        def sink(stream: str, line: str) -> None:
            collector.add(line)
            if progress:
                progress(line)

        token = uuid.uuid4().hex
        proc = ProcessRun(argv, env=child_env(self.env, self.pass_env), cwd=run.cwd, run_dir=directory, token=token, sink=sink)
        fingerprint = {"launcher": self.kind, "host": socket.gethostname(), "run_dir": str(directory),
                       "program": run.kind, "nproc_per_node": run.nproc_per_node, "python": sys.version.split()[0]}
        t0 = time.monotonic()
        await proc.start()
        end = None
        try:
            end = await supervise(proc, self.timeout_s, self.hang_s, self.kill_grace_s, lambda: collector.lines)
        finally:
            # cancelled, or anything else: nothing of the run may outlive launch()
            if end is None or proc.alive():
                await asyncio.shield(proc.kill(self.kill_grace_s))
        end.duration_s = time.monotonic() - t0
        return to_result(run, collector, end, workload, strategy, fingerprint=fingerprint,
                         log_path=str(directory / "stdout.log"))


async def supervise(proc: ProcessRun, timeout_s: float, hang_s: float, grace_s: float,
                    lines: Callable[[], int] = lambda: 0) -> RunEnd:
    """Waits for `proc`; kills it past `timeout_s` of wall clock or `hang_s` without output.
    `lines` counts the lines seen so far (to tell the run's output from its reaction to the kill)."""
    while True:
        code = await proc.wait(timeout=POLL_S)
        if code is not None:
            return RunEnd(exit_code=code, duration_s=0.0)
        now = time.monotonic()
        for reason, limit, since in (("timeout", timeout_s, proc.started), ("hang", hang_s, proc.last_output)):
            if now - since > limit:
                mark = lines()
                code = await proc.kill(grace_s)
                return RunEnd(exit_code=code, duration_s=0.0, killed=reason, detail=f"{limit:g} s",
                              lines_before_kill=mark)

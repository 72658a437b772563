"""The framework fingerprint of a schedule's target, read the way each launcher kind can read it.

One function per launcher kind, each returning `optico.fingerprint.framework_of(...)` of what it
found, so a probe and a trial's fingerprint compare key for key:
- sim: the simulator's own (its `framework_version`, or the OPTICO_SIM_FRAMEWORK_VERSION override);
- replay: the table's digest (another table is another cluster);
- local: a short launch of the training interpreter, with the trial environment, that prints the
  versions of megatron-core, torch, CUDA, NCCL, Transformer Engine and the image;
- ray: the same script as a Ray task on a GPU node of the cluster (where the training runs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optico.fingerprint import framework_of
from optico.spec import JobSpec

PROBE_TIMEOUT_S = 300.0  # a cold container may take minutes to import torch; never longer

# Run by the training interpreter: versions only, nothing initialised (no process group, no GPU
# memory). NGC containers name their image in NVIDIA_PYTORCH_VERSION / NVIDIA_BUILD_ID.
PROBE_SCRIPT = r"""
import json, os
from importlib import metadata

def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None

fp = {"megatron_core": version("megatron-core", "megatron_core"),
      "transformer_engine": version("transformer-engine", "transformer_engine", "transformer-engine-cu12"),
      "image": os.environ.get("NVIDIA_PYTORCH_VERSION") or os.environ.get("NVIDIA_BUILD_ID")}
try:
    import torch
    fp["torch"] = torch.__version__
    fp["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()
        fp["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
except ImportError:
    pass
print("OPTICO_PROBE " + json.dumps(fp))
"""
MARK = "OPTICO_PROBE "


class ProbeError(RuntimeError):
    """The probe could not read the target's framework (the message says why, in one line)."""


def _parse(output: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise ProbeError(f"the probe printed no fingerprint: {output.strip()[-300:] or '(no output)'}")


def _workload_framework(spec: JobSpec) -> dict[str, Any]:
    """What the spec says about the framework (used where a launcher cannot tell more)."""
    return {"megatron_core": spec.workload.framework.megatron_core, "image": spec.workload.framework.image}


def probe_sim(spec: JobSpec) -> dict[str, str]:
    from optico.launchers.sim import SimLauncher

    sim = SimLauncher(seed=0, framework_version=spec.launcher.framework_version)
    return framework_of(sim.framework_fingerprint(spec.workload))


def probe_replay(spec: JobSpec) -> dict[str, str]:
    if not spec.launcher.data:
        raise ProbeError("launcher.data: the replay launcher needs its CSV")
    from optico.launchers.replay import table_digest

    digest = table_digest(spec.launcher.data)
    if digest is None:
        raise ProbeError(f"launcher.data: {Path(spec.launcher.data).name} cannot be read")
    return framework_of({**_workload_framework(spec), "replay_data": digest})


def _python(spec: JobSpec) -> str:
    program = spec.launcher.program
    return (program.python if program is not None and program.python else None) or sys.executable


def probe_local(spec: JobSpec, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    from optico.launchers.local import child_env

    env = child_env(dict(spec.launcher.env), spec.launcher.pass_env)
    cwd = getattr(spec.launcher.program, "cwd", None)  # a Megatron-LM checkout may pin its own packages
    try:
        done = subprocess.run([_python(spec), "-c", PROBE_SCRIPT], env=env, capture_output=True, text=True,
                              timeout=timeout_s, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"the probe launch failed: {exc}") from None
    if done.returncode != 0:
        raise ProbeError(f"the probe launch exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return framework_of({**_workload_framework(spec), **{k: v for k, v in _parse(done.stdout).items() if v}})


def probe_ray(spec: JobSpec, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    import ray

    from optico.launchers.trial_env import trial_env

    launcher = spec.launcher
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"log_to_driver": False, "namespace": "optico", **launcher.ray_init}
        if launcher.address is not None:
            kwargs["address"] = launcher.address
        ray.init(**kwargs)
    gpus = ray.cluster_resources().get("GPU", 0)
    env = {**trial_env(dict(launcher.env), launcher.pass_env, base={}), **launcher.runtime_env.get("env_vars", {})}
    runtime_env = {**launcher.runtime_env, "env_vars": env}

    def run(script: str, python: str) -> str:
        done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=timeout_s)
        return done.stdout + done.stderr

    # On a GPU node when the cluster has any: CUDA and NCCL are read where the training runs.
    task = ray.remote(num_gpus=1 if gpus else 0, num_cpus=0.1, runtime_env=runtime_env)(run)
    python = launcher.program.python if launcher.program is not None and launcher.program.python else "python"
    try:
        output = ray.get(task.remote(PROBE_SCRIPT, python), timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - Ray raises many kinds; all mean "no probe"
        raise ProbeError(f"the probe task failed on the Ray cluster: {str(exc).splitlines()[0][:300]}") from None
    return framework_of({**_workload_framework(spec), **{k: v for k, v in _parse(output).items() if v}})


PROBES: dict[str, Callable[[JobSpec], dict[str, str]]] = {
    "sim": probe_sim, "replay": probe_replay, "local": probe_local, "ray": probe_ray,
}


def probe_framework(spec: JobSpec) -> dict[str, str]:
    """The framework fingerprint the spec's launcher would run under now; ProbeError if unreadable."""
    try:
        probe = PROBES[spec.launcher.kind]
    except KeyError:
        raise ProbeError(f"launcher.kind: no framework probe for {spec.launcher.kind!r}") from None
    return probe(spec)

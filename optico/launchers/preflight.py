"""Before a real run: does this machine (or the local Ray cluster) have what the spec needs?

A GPU spec started on a machine without CUDA used to spend minutes per trial before failing
as a hang; a missing torch, as an "unrecognised failure". `check_launch` finds these at once,
before a job exists, and says what is missing: GPUs (counted with nvidia-smi, else
/dev/nvidia*, within CUDA_VISIBLE_DEVICES), a CUDA build of torch, megatron-core, Ray, a
writable run directory. Only what can be known locally is checked: a remote Ray cluster's GPUs
are its own (a trial that cannot be placed fails after `placement_timeout_s`).
"""

from __future__ import annotations

import glob
import importlib.util
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from optico.errors import SpecError

NVIDIA_SMI_TIMEOUT_S = 20.0
RAY_CLIENT_PORT = 10001  # ray://host without a port
RAY_CONNECT_TIMEOUT_S = 5.0


def visible_gpus(env: Mapping[str, str]) -> tuple[int, str]:
    """(CUDA GPUs a process started with `env` would see, how that was found)."""
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is not None and mask.strip() in ("", "-1", "none", "NoDevFiles"):
        return 0, f"CUDA_VISIBLE_DEVICES={mask!r} hides every GPU"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 0, f"nvidia-smi did not answer: {exc}"
        if out.returncode != 0:
            first = (out.stderr or out.stdout).strip().splitlines()
            return 0, f"nvidia-smi failed: {first[0] if first else f'exit status {out.returncode}'}"
        count, how = sum(line.startswith("GPU ") for line in out.stdout.splitlines()), "nvidia-smi -L"
    else:
        devices = [d for d in glob.glob("/dev/nvidia[0-9]*") if re.fullmatch(r"/dev/nvidia\d+", d)]
        if not devices:
            return 0, "no NVIDIA driver on this machine (no nvidia-smi, no /dev/nvidia*)"
        count, how = len(devices), "/dev/nvidia*"
    if mask:
        listed = [d for d in mask.split(",") if d.strip()]
        if len(listed) < count:
            return len(listed), f"{how}: {count}, of which CUDA_VISIBLE_DEVICES={mask!r} shows {len(listed)}"
    return count, f"{how}: {count}"


def torch_build() -> str | None:
    """Why this interpreter's torch cannot drive CUDA, or None when it is a CUDA build.
    Read from torch/version.py, without importing torch (seconds, and gigabytes with CUDA)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return f"torch is not installed in {sys.executable} (pip install 'optico[megatron]')"
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        text = version_file.read_text()
    except OSError:
        return None  # an unusual install: let the run tell
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
    version = re.search(r"^__version__\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)", text, re.MULTILINE)
    if found and found.group(1).strip() == "None":
        return f"torch {version.group(1) if version else ''} in {sys.executable} is a CPU-only build"
    return None


def _program_needs(spec) -> list[str]:
    """What our own interpreter lacks to run the spec's program (nothing when it names another python)."""
    program = spec.launcher.program
    if program is not None and program.python:
        return []
    missing = []
    if importlib.util.find_spec("torch") is None:
        missing.append(f"torch is not installed in {sys.executable} (pip install 'optico[megatron]')")
    elif (program is None or program.kind == "megatron-core") and importlib.util.find_spec("megatron") is None:
        missing.append(f"megatron-core is not installed in {sys.executable} (pip install 'optico[megatron]')")
    return missing


def _check_run_dir(run_dir: str | None) -> None:
    if run_dir is None:
        from optico.launchers.local import default_runs_dir

        try:
            default_runs_dir()
        except OSError as exc:
            raise SpecError("launcher.run_dir", f"cannot create the data directory: {exc}") from None
        return
    try:
        folder = Path(run_dir).expanduser()
    except RuntimeError:  # "~nosuchuser/runs"
        raise SpecError("launcher.run_dir", f"cannot create {run_dir}: no such user's home directory") from None
    while not folder.exists() and folder != folder.parent:
        if folder.is_symlink():  # dangling, or a loop: nothing can be created through it
            raise SpecError("launcher.run_dir", f"cannot create {run_dir}: {folder} is a broken symbolic link")
        folder = folder.parent
    if not folder.is_dir():
        raise SpecError("launcher.run_dir", f"cannot create {run_dir}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SpecError("launcher.run_dir", f"cannot create {run_dir}: {folder} is not writable")


def _check_ray_address(address: str | None) -> None:
    """A named Ray cluster (ray://host:port, host:port) answers on its port: a dead head node is one
    line before a job exists, not a job failed after Ray's 30 s client timeout."""
    if address in (None, "auto", "local"):
        return
    client = address.startswith("ray://")
    parsed = urlsplit(address if client else f"tcp://{address}")
    try:
        host, port = parsed.hostname, parsed.port or (RAY_CLIENT_PORT if client else None)
    except ValueError:
        host = port = None
    if not host or not port:
        raise SpecError("launcher.address", f"{address!r} is not auto, local, ray://host[:port] or host:port")
    try:
        socket.create_connection((host, port), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SpecError("launcher.address", f"no Ray cluster answers at {address}: "
                                            f"{exc.strerror or type(exc).__name__}") from None


def _ray_starts_here(launcher) -> bool:
    """Whether ray.init() will start a new Ray cluster on this machine (`address: local`, or none given
    and none running), so this machine's checks apply. `auto`, or none given, with a cluster recorded
    on this machine (RAY_ADDRESS, the last `ray start`): that cluster must answer, or no job is made."""
    if launcher.address == "local":
        return True
    if launcher.address not in (None, "auto"):
        return False
    try:
        from ray._private.services import get_ray_address_from_environment  # what ray.init() reads
        found = get_ray_address_from_environment(launcher.address, launcher.ray_init.get("_temp_dir"))
    except ConnectionError:
        raise SpecError("launcher.address", "auto, and no Ray cluster runs on this machine (start one with "
                                            "`ray start --head`, set RAY_ADDRESS, or use address: local for a "
                                            "new one per job)") from None
    except Exception:  # noqa: BLE001 - a private API that moved, a temp dir it cannot read: ray.init() decides
        return False
    if found in (None, "local"):  # RAY_ADDRESS=local starts one too
        return True
    if found != "auto":
        _check_ray_address(found)
    return False


# ray.init() keywords that describe a cluster it starts; connecting to a running one, ray.init() refuses
# them, and the job failed after it had been written ("When connecting to an existing cluster, num_cpus
# and num_gpus must not be provided").
STARTING_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config",
                 "_enable_object_reconstruction", "_node_name")


def _check_ray_init_for_a_running_cluster(ray_init: dict) -> None:
    for key in STARTING_ONLY:
        if ray_init.get(key) is not None:
            raise SpecError(f"launcher.ray_init.{key}", "describes a cluster that optico starts (address: local); "
                                                        "this spec connects to a running one, which ray.init() "
                                                        "refuses it for: remove it")


def _check_ray(spec, world: int) -> int | None:
    """Ray importable, its cluster reachable, ray_init's keywords real; the logical GPUs ray_init
    declares, if any."""
    if importlib.util.find_spec("ray") is None:
        raise SpecError("launcher.kind", "ray is not installed (pip install 'optico[ray]')")
    launcher = spec.launcher
    _check_ray_address(launcher.address)
    if launcher.ray_init:
        import ray

        known = set(inspect.signature(ray.init).parameters)
        for key in launcher.ray_init:
            if key not in known and not key.startswith("_"):  # ray.init's **kwargs take private keys
                raise SpecError(f"launcher.ray_init.{key}", "not a ray.init() keyword")
    declared = launcher.ray_init.get("num_gpus")
    if declared is None:
        return None
    if not isinstance(declared, (int, float)) or isinstance(declared, bool) or declared < 0:
        raise SpecError("launcher.ray_init.num_gpus", f"must be a number of GPUs, got {declared!r}")
    if declared < world:
        raise SpecError("launcher.ray_init.num_gpus", f"{declared:g} logical GPUs; the workload needs {world}")
    return int(declared)


def check_launch(spec) -> None:
    """Raises SpecError naming what this machine lacks to run `spec` with its launcher."""
    from optico.launchers.program import node_layout

    launcher, w = spec.launcher, spec.workload
    if launcher.kind not in ("local", "ray"):
        return
    try:
        nnodes, per_node = node_layout(w)
    except ValueError as exc:
        field, _, reason = str(exc).partition(": ")
        raise SpecError(field, reason) from None
    if launcher.kind == "local" and nnodes > 1:
        raise SpecError("launcher.kind", f"local runs on this machine, but the workload needs {nnodes} nodes of "
                                         f"{per_node} GPUs; use kind: ray")
    _check_run_dir(launcher.run_dir)
    on_this_machine = launcher.kind == "local"
    logical = None
    if launcher.kind == "ray":
        logical = _check_ray(spec, w.world_size)
        on_this_machine = _ray_starts_here(launcher)  # a new Ray cluster on this machine
        if not on_this_machine:
            _check_ray_init_for_a_running_cluster(launcher.ray_init)
    if not on_this_machine:
        return
    for problem in _program_needs(spec):
        raise SpecError("launcher.program", problem)
    if w.cluster.gpu == "cpu":
        if launcher.kind == "ray" and logical is None:
            raise SpecError("launcher.ray_init.num_gpus", "a local Ray cluster has no GPUs to place CPU ranks on; "
                                                          f"declare logical ones: ray_init: {{num_gpus: {per_node}}}")
        return  # torchrun over gloo: processes stand for GPUs
    if logical is not None:
        return  # logical GPUs declared on purpose (tests, CPU stand-ins)
    env = {**os.environ, **launcher.env}
    count, how = visible_gpus(env)
    if count < per_node:
        raise SpecError("workload.cluster.gpu", f"the {launcher.kind} launcher needs {per_node} CUDA GPU(s) "
                                                f"({w.cluster.gpu}) on this machine; found {count} ({how}). "
                                                "For a run without GPUs use gpu: cpu, or launcher kind sim")
    problem = torch_build()
    if problem and (launcher.program is None or not launcher.program.python):
        raise SpecError("workload.cluster.gpu", f"{problem}: it cannot use the {w.cluster.gpu} GPUs")

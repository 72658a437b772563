"""The environment a training process gets: an allowlist, never our secrets.

A trial runs the user's program (or our driver) with whatever it prints captured into the pool
and shown to an LLM, so it must not inherit the worker's environment wholesale: that holds the
LLM key, the database URL with its password, API tokens. It gets
1. the variables torchrun, NCCL, CUDA/ROCm, Transformer Engine and the Python runtime need
   (names and prefixes below), minus any whose value is a known secret or whose name looks secret;
2. the spec's `launcher.env` on top (a value stored as `***` because its name looks secret is
   filled from the worker's variable of the same name, or left out);
3. the variables named in `launcher.pass_env`, copied from the worker's environment.
`OPTICO_*` never passes, except `OPTICO_BENCH_*` (the driver's own switches), nor `OPENAI_API_KEY`
(the LLM key's fallback), whichever of the three ways asks for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from optico.redact import MASK, is_optico_own, is_secret_name, known_secrets, register

ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "HOSTNAME",
    "TMPDIR", "TMP", "TEMP", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "VIRTUAL_ENV", "CONDA_PREFIX", "LD_LIBRARY_PATH", "LIBRARY_PATH",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "KMP_AFFINITY",
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
})
ALLOWED_PREFIXES = (
    "LC_", "CUDA_", "NCCL_", "NVTE_", "NVIDIA_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "TORCH_", "TORCHELASTIC_",
    "TORCHINDUCTOR_", "PYTORCH_", "TRITON_", "GLOO_", "UCX_", "FI_", "OMPI_", "PMIX_", "SLURM_", "HIP_", "ROCM_",
    "HSA_", "MIOPEN_", "RCCL_", "MEGATRON_", "OPTICO_BENCH_",
)


def allowed(name: str) -> bool:
    """True when a worker variable of this name may reach a training process on its own. A
    secret-looking name does not, whatever its prefix (`NCCL_PASSWORD`, `TORCH_API_KEY`): a trial
    that needs it asks by name (`pass_env`, or `env` with `***`), and its value is then redacted."""
    if is_optico_own(name) or is_secret_name(name):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def trial_env(spec_env: Mapping[str, str] | None = None, pass_env: Iterable[str] = (),
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a training process (see the module docstring). `base`: the worker's
    environment (default: this process's)."""
    base = os.environ if base is None else base
    secrets = set(known_secrets())
    env = {k: v for k, v in base.items() if allowed(k) and v not in secrets}
    for name, value in (spec_env or {}).items():
        if is_optico_own(name):
            continue  # refused at spec load too (a job stored before that is still held to it)
        if value == MASK:
            if name in base:
                env[name] = base[name]
            continue
        env[name] = value
    for name in pass_env:
        if is_optico_own(name):
            continue  # refused at spec load too; never ours
        if name in base:
            env[name] = base[name]
    # A secret the trial legitimately needs is still never stored or shown: redact it from its logs.
    register(*(value for name, value in env.items() if is_secret_name(name) and not allowed(name)))
    return env

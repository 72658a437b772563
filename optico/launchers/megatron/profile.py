"""Where a step's time goes: a few steps under torch.profiler, kernels grouped by kind.

Kinds: GEMM (cuBLAS / CUTLASS / nvjet matmul kernels), attention (flash / memory-efficient
SDPA kernels), communication (NCCL), memory-bound (everything else on the GPU: elementwise,
norms, softmax, reductions, copies, optimizer), and idle (the step's wall time the GPU spent
in none of them). Written as JSON by the caller's rank.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

_KINDS = [
    ("communication", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|efficient_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm90_|sm80_|ampere_.*(h|s)\d+|wgmma", re.I)),
]


def kind_of(kernel: str) -> str:
    for kind, pattern in _KINDS:
        if pattern.search(kernel):
            return kind
    return "memory-bound"


def profile_steps(step: Callable[[], tuple[float, bool, Any]], n: int, out: str | None, *, cuda: bool) -> None:
    """Runs `step` n times under the profiler; writes the breakdown to `out` (rank 0 passes a path)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    wall = 0.0
    with profile(activities=activities) as prof:
        for _ in range(n):
            dt, _, _ = step()
            wall += dt
    if out is None:
        return
    by_kind: dict[str, float] = {}
    top: list[tuple[str, float]] = []
    for evt in prof.key_averages():
        device_us = getattr(evt, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(evt, "self_cuda_time_total", 0.0)
        if not device_us or (cuda and getattr(evt, "device_type", None) is not None
                             and str(evt.device_type).endswith("CPU")):
            continue
        kind = kind_of(evt.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + device_us / 1e6
        top.append((evt.key, device_us / 1e6))
    busy = sum(by_kind.values())
    shares = {k: v / wall for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
    shares["idle"] = max(0.0, 1.0 - busy / wall)
    top.sort(key=lambda kv: -kv[1])
    result = {"steps": n, "wall_s": wall, "gpu_busy_s": busy, "share_of_step": shares,
              "top_kernels": [{"kernel": k[:160], "kind": kind_of(k), "s": s} for k, s in top[:25]],
              "torch": torch.__version__}
    Path(out).write_text(json.dumps(result, indent=2))

"""The simulator launcher: the performance model as a cluster.

A run is answered by the model (with its own constants — benchmarks give it hidden
deviations the tuner's model does not see) plus seeded measurement noise, and fails
the way real runs fail: Megatron's assertion text for a configuration Megatron
refuses, a CUDA out-of-memory error when the (noisy) memory exceeds the GPU, a
hang, an NCCL watchdog timeout, a dead node. The same seed and trial give the
same answer, so a resumed job sees what the interrupted one would have seen.

`framework_version` stands for a release of the whole stack (megatron-core, torch, CUDA, NCCL,
Transformer Engine, the image). Another version is another cluster: its constants are moved by a
perturbation seeded by the version (compute faster or slower, collectives and memory overheads
shifted), so the best configuration can move, deterministically; the trials' fingerprint names the
version. OPTICO_SIM_FRAMEWORK_VERSION overrides the spec's value at every launch, so a test can
"upgrade the cluster" under a running schedule.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from functools import lru_cache

import numpy as np

from optico.launchers.base import Launcher, ProgressCallback
from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.model import predict
from optico.rules import violations
from optico.strategy import Strategy
from optico.trial import FailureCategory, LaunchResult, Metrics
from optico.workload import Workload

ENV_FRAMEWORK_VERSION = "OPTICO_SIM_FRAMEWORK_VERSION"
STARTUP_S = 90.0  # model build, NCCL init, data loader: paid by every real launch
WARMUP_STEPS, TIMED_STEPS = 3, 10
NCCL_WATCHDOG_S = 600.0  # NCCL's default collective timeout: what ends a hung run nobody else kills


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _traceback(rank: int, error: str) -> str:
    return "\n".join([
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 291, in <module>',
        f"[rank{rank}]:     pretrain(",
        f'[rank{rank}]:   File "/workspace/Megatron-LM/megatron/training/training.py", line 612, in pretrain',
        f"[rank{rank}]:     iteration, num_floating_point_operations_so_far = train(",
        f"[rank{rank}]: {error}",
        "E1122 12:00:00.000000 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) "
        f"local_rank: {rank}",
    ])


# How far a framework version moves the cluster: the whole step faster or slower by 8-20 % (a release
# changes kernels everywhere; either way), collectives and exposed communication by ~15-30 %,
# activation memory by ~6 % and fixed memory overheads by -1 to +2 GiB (so which configurations
# fit, and which is best, can change), and each configuration by its own ~4 % (a release's kernels
# help some layouts more than others). Each version is shifted against the base like that; two
# versions may still land close to each other, as a minor upgrade does.
SPEED_SHIFT = (0.08, 0.20)
CONFIG_SIGMA = 0.04
COMM_SIGMA, EXPOSED_SIGMA, ACTIVATION_SIGMA = 0.15, 0.30, 0.06
MEM_OVERHEAD_SHIFT_GIB = (-1.0, 2.0)


@lru_cache(maxsize=64)
def framework_effects(base: Constants, version: str | None) -> tuple[Constants, float]:
    """(the constants, a step-time factor) of the cluster under framework `version`; the base
    cluster (`base`, 1.0) when None. Seeded by the version: the same version, the same cluster."""
    if version is None:
        return base, 1.0
    rng = _rng("framework", version)
    speed = 1 + float(rng.choice([-1.0, 1.0])) * float(rng.uniform(*SPEED_SHIFT))
    factors = {
        "nvlink_efficiency": np.exp(COMM_SIGMA * rng.standard_normal()),
        "network_efficiency": np.exp(COMM_SIGMA * rng.standard_normal()),
        "tp_exposed": np.exp(EXPOSED_SIGMA * rng.standard_normal()),
        "dp_overlap_exposed": np.exp(EXPOSED_SIGMA * rng.standard_normal()),
        "p2p_exposed": np.exp(EXPOSED_SIGMA * rng.standard_normal()),
        "activation_scale": np.exp(ACTIVATION_SIGMA * rng.standard_normal()),
    }
    values = base.model_dump()
    for name, factor in factors.items():
        values[name] *= float(factor)
    values["mem_overhead_gib"] += float(rng.uniform(*MEM_OVERHEAD_SHIFT_GIB))
    bounds = Constants.free_fields()  # every constant moved here has its physical range there
    for name in [*factors, "mem_overhead_gib"]:
        lo, hi = bounds[name]
        values[name] = min(max(values[name], lo), hi)
    return Constants.model_validate(values), 1 / speed


def tail_line(step_time_s: float) -> str:
    """The last iteration line a run that stopped progressing printed."""
    return f" iteration        2/      13 | elapsed time per iteration (ms): {step_time_s * 1e3:.1f}\n"


class SimLauncher(Launcher):
    """Answers from the performance model; see the module docstring."""

    kind = "sim"

    def __init__(self, seed: int = 0, noise: float = 0.01, hang_rate: float = 0.02, infra_rate: float = 0.0,
                 constants: Constants | None = None, mem_noise: float = 0.015, trial_seconds: float = 0.0,
                 framework_version: str | None = None, timeout_s: float = math.inf, hang_s: float = math.inf):
        self.seed, self.noise, self.hang_rate, self.infra_rate = seed, noise, hang_rate, infra_rate
        self.mem_noise, self.trial_seconds = mem_noise, trial_seconds
        # The spec's limits hold here too: a simulated trial longer than them is killed at the first,
        # as a real one would be (it prints nothing while it sleeps, so `hang_s` counts from its start).
        self.timeout_s, self.hang_s = timeout_s, hang_s
        self.base_constants = constants or load_constants()
        self.framework_version = framework_version

    @property
    def version(self) -> str | None:
        """The framework version the cluster runs now: the environment's override, else the spec's."""
        return os.environ.get(ENV_FRAMEWORK_VERSION, "").strip() or self.framework_version

    @property
    def constants(self) -> Constants:
        """The performance model's constants of the cluster as it runs now (see `framework_effects`)."""
        return framework_effects(self.base_constants, self.version)[0]

    def framework_fingerprint(self, workload: Workload) -> dict:
        """The framework part of every run's fingerprint (what a retuning probe reads)."""
        fp = {"megatron_core": workload.framework.megatron_core, "image": workload.framework.image}
        if self.version is not None:
            fp["framework_version"] = self.version
        return {k: v for k, v in fp.items() if v is not None}

    def describe(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "noise": self.noise, "hang_rate": self.hang_rate,
                "infra_rate": self.infra_rate, "framework_version": self.version}

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        world = workload.world_size
        fingerprint = {"launcher": "sim", "seed": self.seed, "megatron_core": None,
                       **self.framework_fingerprint(workload)}
        limit, reason = min((self.timeout_s, "wall-clock limit"), (self.hang_s, "no output"))
        if self.trial_seconds > limit:
            await asyncio.sleep(limit)
            log = f"run killed: {reason} of {limit:g} s reached before the run's {self.trial_seconds:g} s (hang)"
            return LaunchResult(ok=False, log=log, exit_code=-9, duration_s=limit, gpu_seconds=limit * world,
                                fingerprint=fingerprint, category_hint=FailureCategory.HANG)
        if self.trial_seconds:
            await asyncio.sleep(self.trial_seconds)
        constants, slowdown = framework_effects(self.base_constants, self.version)
        broken = violations(workload, strategy)
        if broken:
            log = _traceback(0, f"AssertionError: {broken[0].message}")
            return LaunchResult(ok=False, log=log, exit_code=1, duration_s=30.0, gpu_seconds=30.0 * world,
                                fingerprint=fingerprint)
        pred = predict(workload, strategy, constants)
        config_rng = _rng(self.seed, "config", strategy.signature())  # systematic, per configuration
        run_rng = _rng(self.seed, "run", trial_key)  # varies per attempt
        limit = workload.cluster.spec.memory_gib
        mem = pred.mem_gib * (1 + self.mem_noise * config_rng.standard_normal())
        if progress:
            progress(f"sim: {strategy.short()} predicted {pred.step_time_s:.2f} s/step, {mem:.1f} GiB")
        if mem > limit:
            want = max(0.25, mem - limit + 0.5)
            error = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a "
                     f"total capacity of {limit:.2f} GiB of which {max(0.05, limit - mem + want):.2f} GiB is free. "
                     f"Including non-PyTorch memory, this process has {limit - 0.3:.2f} GiB memory in use.")
            return LaunchResult(ok=False, log=_traceback(0, error), exit_code=1, duration_s=STARTUP_S,
                                gpu_seconds=STARTUP_S * world, fingerprint=fingerprint)
        draw = run_rng.random()
        if draw < self.infra_rate:
            node = int(run_rng.integers(0, workload.cluster.nodes_used))
            log = (f"RuntimeError: NCCL error: unhandled system error, NCCL version 2.21.5\n"
                   f"Xid 79: GPU has fallen off the bus on node {node}")
            return LaunchResult(ok=False, log=log, exit_code=1, duration_s=STARTUP_S, gpu_seconds=STARTUP_S * world,
                                fingerprint=fingerprint)
        if draw < self.infra_rate + self.hang_rate:
            # A hung run prints nothing more: NCCL's watchdog ends it, or the spec's own limits first (no
            # output for `hang_s`, `timeout_s` of wall clock), as they would a real run (they were ignored:
            # every hang cost 600 s of the GPU-hour budget whatever the spec said).
            wall_left = max(0.0, self.timeout_s - STARTUP_S)
            hang_s = min(NCCL_WATCHDOG_S, self.hang_s, wall_left)
            tail = tail_line(pred.step_time_s)
            if run_rng.random() < 0.5 and hang_s == NCCL_WATCHDOG_S:
                log = (f"[rank{world - 1}]:[E1122 12:00:00 ProcessGroupNCCL.cpp:616] [Rank {world - 1}] Watchdog "
                       f"caught collective operation timeout: WorkNCCL(SeqNum=4211, OpType=ALLREDUCE, "
                       f"Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")
                hint = None
            elif wall_left < min(NCCL_WATCHDOG_S, self.hang_s):
                log = tail + f"run killed: wall-clock limit of {self.timeout_s:g} s reached (hang)"
                hint = FailureCategory.HANG
            else:
                log = tail + f"no output for {hang_s:.0f} s: run killed (hang)"
                hint = FailureCategory.HANG
            return LaunchResult(ok=False, log=log, exit_code=-9, duration_s=STARTUP_S + hang_s,
                                gpu_seconds=(STARTUP_S + hang_s) * world, fingerprint=fingerprint,
                                category_hint=hint)
        if self.version is not None:  # this configuration's own share of the release's effect
            slowdown *= float(np.exp(CONFIG_SIGMA * _rng("framework", self.version, strategy.signature())
                                     .standard_normal()))
        step = pred.step_time_s * slowdown * float(np.exp(self.noise * run_rng.standard_normal()))
        scale = pred.step_time_s / step
        busy = 1.0 - (pred.time.pp_bubble_s + pred.time.overhead_s) / pred.step_time_s
        util = float(np.clip(busy + 0.02 * run_rng.standard_normal(), 0.05, 1.0))
        metrics = Metrics(
            step_time_s=step, tflops_per_gpu=pred.tflops_per_gpu * scale, mfu=pred.mfu * scale,
            tokens_per_s_per_gpu=pred.tokens_per_s_per_gpu * scale, mem_avg_gib=mem * 0.93, mem_max_gib=mem,
            mem_limit_gib=limit, gpu_util_avg=util, gpu_util_max=min(1.0, util + 0.05))
        duration = STARTUP_S + (WARMUP_STEPS + TIMED_STEPS) * step
        if duration > self.timeout_s:  # slow, not hung: killed at the wall clock as a real run is
            log = (f"{tail_line(step)}run killed: wall-clock limit of {self.timeout_s:g} s reached "
                   f"(timeout) before its {WARMUP_STEPS + TIMED_STEPS} steps of {step:.1f} s")
            return LaunchResult(ok=False, log=log, exit_code=-9, duration_s=self.timeout_s,
                                gpu_seconds=self.timeout_s * world, fingerprint=fingerprint,
                                category_hint=FailureCategory.HANG)
        return LaunchResult(ok=True, metrics=metrics, log=f"sim: {TIMED_STEPS} steps at {step:.3f} s", exit_code=0,
                            duration_s=duration, gpu_seconds=duration * world, fingerprint=fingerprint)

"""Landscapes from an analytical simulator OptiCo did not write: llm-analysis (Cheng Li, Apache-2.0,
PyPI `llm-analysis` 0.2.2), wrapped as a launcher that fails the way the sim launcher does.

What llm-analysis gives, per configuration (its own formulas and GPU table, untouched):
- peak memory per GPU: weights, gradients and Adam states (optimizer states sharded over DP with
  the distributed optimizer = its ZeRO stage 1), activations after Korthikanti et al. with flash
  attention, sequence parallel and selective/full recompute;
- the forward time of one micro-batch through a pipeline stage: per module the larger of compute
  (FLOPs / (peak x flops efficiency)) and memory traffic (weights + activations / HBM bandwidth),
  layer norms at HBM bandwidth, two TP all-reduces per layer at NVLink bandwidth with a latency floor;
- FLOPs of forward, backward (2x forward) and recompute.

What it leaves out, checked in its source before use: its training step time is
FLOPs / (TP x PP x achieved TFLOP/s) x accumulation steps — no communication, no pipeline bubble,
no DP gradient traffic — so every layout with the same recompute would have the same MFU. Its MLP
FLOPs are 16·b·s·h² whatever the FFN width (a 4h, non-gated MLP), its parameter count a 2-matrix MLP
(we pass a SwiGLU model's FFN as 1.5x wider so weights and memory come out right; the FLOPs stay
its own), and the input embedding is tied. The wrapper composes a step from its per-micro-batch
pieces with the textbook schedule (Narayanan et al. 2021), which is the only code here that is ours:

    t_mb     = compute_fwd · (3 + recompute FLOPs / forward FLOPs) + tp_comm_fwd · (2 + [full recompute])
    pipeline = (m + (p - 1) / v) · t_mb + 2·v·m · p2p(b·s·h·2 bytes, / TP with SP)
    DP       = reduce-scatter (fp32 grads) + all-gather (bf16 params) over DP, a ring; with the
               overlap flags only what exceeds the last micro-batch's backward (grads) or forward
               (params) stays exposed
    step     = pipeline + DP + Adam (24 bytes per owned parameter at HBM bandwidth)

MFU counts llm-analysis's own model FLOPs (forward + backward, recompute excluded) over the step at
its table's peak: with its 4h MLP a SwiGLU model would otherwise reach implausible MFUs (Megatron's
count is up to 2x larger for Qwen2.5-7B's FFN); OptiCo's model counts Megatron's, a constant factor
per workload that its residual model's offset absorbs.
Hidden per landscape: llm-analysis's FLOP and HBM efficiencies and the link efficiencies; run
noise, per-configuration memory noise and hangs as in the simulated family. Context parallelism and
MoE are outside what llm-analysis models: these landscapes are dense and CP 1.
"""

from __future__ import annotations

import asyncio
import io
import logging
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from optico.bench.landscapes import LandscapeDef
from optico.launchers.base import Launcher, ProgressCallback
from optico.rules import violations
from optico.strategy import Strategy
from optico.trial import FailureCategory, LaunchResult, Metrics
from optico.workload import Workload

STARTUP_S = 90.0  # as the sim launcher: model build, NCCL init, data loader
WARMUP_STEPS, TIMED_STEPS = 3, 10
INSTALL_HINT = "pip install --no-deps llm-analysis==0.2.2 'fire>=0.5,<0.6'"
# llm-analysis's GPU table names for the catalog's GPUs.
GPU_NAMES = {"a100-80gb": "a100-sxm-80gb", "h100-sxm": "h100-sxm-80gb"}


def available() -> str | None:
    """None when llm-analysis can be imported, else why not (with the install command)."""
    try:
        _import()
    except ImportError as exc:
        return f"llm-analysis is not installed ({exc.name}): {INSTALL_HINT}"
    return None


@lru_cache(maxsize=1)
def _import() -> Any:
    # llm-analysis logs on import and on every call (to stdout): keep the benchmark's output clean.
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        from llm_analysis import analysis, config
    logging.getLogger("__name__").setLevel(logging.ERROR)  # the name llm-analysis gives its logger
    return analysis, config


@dataclass(frozen=True)
class Hidden:
    """What the tuner never sees: llm-analysis's efficiencies for this landscape."""

    flops_efficiency: float
    hbm_efficiency: float
    nvlink_efficiency: float
    network_efficiency: float


@dataclass(frozen=True)
class Answer:
    """One configuration, noise-free: step time and peak memory (GiB), and the bubble's share."""

    step_time_s: float
    mem_gib: float
    idle_share: float
    mfu: float  # by llm-analysis's FLOP count, at the GPU's peak in its table


def _rng(*parts: object) -> np.random.Generator:
    import hashlib

    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _ring(bytes_: float, n: int, gbps: float) -> float:
    """Reduce-scatter or all-gather of `bytes_` over a ring of n."""
    return 0.0 if n <= 1 else (n - 1) / n * bytes_ / (gbps * 1e9) + 5e-6 * n


def answer(w: Workload, s: Strategy, hidden: Hidden) -> Answer:
    """llm-analysis's memory and per-micro-batch forward time, composed into a training step."""
    analysis, config = _import()
    m = w.model
    gpu = config.GPUConfig(**_gpu_table()[GPU_NAMES[w.cluster.gpu]])
    ffn = int(m.ffn_hidden_size * (1.5 if m.swiglu else 1.0))
    model = config.ModelConfig(name=m.name, num_layers=m.num_layers, n_head=m.num_attention_heads,
                               hidden_dim=m.hidden_size, vocab_size=m.vocab_size, max_seq_len=w.seq_length,
                               num_key_value_heads=m.groups, ffn_embed_dim=ffn, expansion_ratio=ffn / m.hidden_size)
    tp, pp, world = s.tp, s.pp, w.world_size
    dp = world // (tp * pp)
    par = config.ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=tp if s.sequence_parallel else 1)
    la = analysis.LLMAnalysis(model, gpu, config.DtypeConfig(), par, flops_efficiency=hidden.flops_efficiency,
                              hbm_memory_efficiency=hidden.hbm_efficiency,
                              intra_node_memory_efficiency=hidden.nvlink_efficiency,
                              inter_node_memory_efficiency=hidden.network_efficiency)
    recompute = {None: analysis.ActivationRecomputation.NONE, "selective": analysis.ActivationRecomputation.SELECTIVE,
                 "full": analysis.ActivationRecomputation.FULL}[s.recompute_granularity]
    zero = analysis.DSZeRO.STAGE_1 if s.use_distributed_optimizer else analysis.DSZeRO.NONE
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
        out = la.training(batch_size_per_gpu=s.mbs, global_batch_size=w.global_batch_size, seq_len=w.seq_length,
                          activation_recomputation=recompute, ds_zero=zero, flash_attn=True,
                          mlp_gated_linear_units=m.swiglu)
    micro = out["gradient_accumulation_steps"]
    fwd_flops = la.get_num_flops_fwd_total(s.mbs, w.seq_length)
    recompute_ratio = out["num_flops_total_per_micro_batch"] / fwd_flops - 3.0
    tp_fwd = out["latency_fwd_tp_comm"]
    compute_fwd = out["latency_fwd"] - tp_fwd
    t_mb = compute_fwd * (3.0 + recompute_ratio) + tp_fwd * (2.0 + (1.0 if s.recompute == "full" else 0.0))
    v = s.vpp
    per_node = w.cluster.gpus_per_node
    intra, inter = la.get_intra_node_bandwidth(), la.get_inter_node_bandwidth()
    p2p = 0.0
    if pp > 1:
        p2p_bytes = 2.0 * s.mbs * w.seq_length * m.hidden_size / (tp if s.sequence_parallel else 1)
        p2p = 2 * v * micro * (p2p_bytes / ((intra if world // pp < per_node else inter) * 1e9) + 2e-5)
    bubble = (pp - 1) / v * t_mb
    pipeline = micro * t_mb + bubble + p2p
    params = la.total_num_params / (tp * pp)
    dp_bw = intra if tp * dp <= per_node else inter
    reduce = _ring(4.0 * params, dp, dp_bw) * (1 if s.use_distributed_optimizer else 2)
    gather = _ring(2.0 * params, dp, dp_bw) if s.use_distributed_optimizer else 0.0
    if s.overlap_grad_reduce:
        reduce = max(0.0, reduce - 2.0 / 3.0 * t_mb)
    if s.overlap_param_gather:
        gather = max(0.0, gather - 1.0 / 3.0 * t_mb)
    owned = params / (dp if s.use_distributed_optimizer else 1)
    adam = 24.0 * owned / (la.get_gpu_hbm_bandwidth() * 1e9)
    step = pipeline + reduce + gather + adam
    mem = out["(weight+op_state+grad+act)_memory_per_gpu"] / 1024**3
    # Model FLOPs by llm-analysis's own count (forward + backward, no recompute): MFU in its world.
    model_flops = 3.0 * fwd_flops * w.global_batch_size / s.mbs
    mfu = model_flops / (step * world * gpu.peak_fp16_TFLOPS * 1e12)
    return Answer(step_time_s=step, mem_gib=mem, idle_share=(bubble + reduce + gather) / step, mfu=mfu)


@lru_cache(maxsize=1)
def _gpu_table() -> dict[str, dict[str, Any]]:
    import json
    from pathlib import Path

    analysis, _ = _import()
    folder = Path(analysis.__file__).with_name("gpu_configs")
    return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}


def _traceback(error: str) -> str:
    return "\n".join([
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/workspace/Megatron-LM/pretrain_gpt.py", line 291, in <module>',
        "[rank0]:     pretrain(",
        f"[rank0]: {error}",
        "E1122 12:00:00.000000 torch/distributed/elastic/multiprocessing/api.py:874] failed (exitcode: 1) local_rank: 0",
    ])


class LLMAnalysisLauncher(Launcher):
    """Answers from llm-analysis (see the module docstring) and fails like the sim launcher: Megatron's
    assertion for a refused configuration, CUDA OOM when the (per-configuration noisy) memory exceeds
    the GPU, NCCL watchdog timeouts and hangs at `hang_rate`; run-to-run step-time noise."""

    kind = "sim"

    def __init__(self, hidden: Hidden, seed: int = 0, noise: float = 0.01, hang_rate: float = 0.02,
                 mem_noise: float = 0.03):
        self.hidden, self.seed, self.noise, self.hang_rate, self.mem_noise = hidden, seed, noise, hang_rate, mem_noise
        self._answers: dict[str, Answer] = {}

    def describe(self) -> dict:
        return {"kind": "llm-analysis", "seed": self.seed, "noise": self.noise, "hang_rate": self.hang_rate}

    def truth(self, w: Workload, s: Strategy) -> Answer:
        sig = s.signature()
        if sig not in self._answers:
            self._answers[sig] = answer(w, s, self.hidden)
        return self._answers[sig]

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        world = workload.world_size
        fingerprint = {"launcher": "llm-analysis", "seed": self.seed}
        broken = violations(workload, strategy)
        if broken:
            return LaunchResult(ok=False, log=_traceback(f"AssertionError: {broken[0].message}"), exit_code=1,
                                duration_s=30.0, gpu_seconds=30.0 * world, fingerprint=fingerprint)
        a = self.truth(workload, strategy)
        limit = workload.cluster.spec.memory_gib
        mem = a.mem_gib * (1 + self.mem_noise * _rng(self.seed, "config", strategy.signature()).standard_normal())
        if mem > limit:
            want = max(0.25, mem - limit + 0.5)
            error = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want:.2f} GiB. GPU 0 has a "
                     f"total capacity of {limit:.2f} GiB of which 0.10 GiB is free.")
            return LaunchResult(ok=False, log=_traceback(error), exit_code=1, duration_s=STARTUP_S,
                                gpu_seconds=STARTUP_S * world, fingerprint=fingerprint)
        run = _rng(self.seed, "run", trial_key)
        if run.random() < self.hang_rate:
            log = (f"[rank{world - 1}]:[E1122 12:00:00 ProcessGroupNCCL.cpp:616] Watchdog caught collective "
                   f"operation timeout: WorkNCCL(SeqNum=4211, OpType=ALLREDUCE, Timeout(ms)=600000) ran for "
                   f"600081 milliseconds before timing out.")
            return LaunchResult(ok=False, log=log, exit_code=-9, duration_s=STARTUP_S + 600.0,
                                gpu_seconds=(STARTUP_S + 600.0) * world, fingerprint=fingerprint,
                                category_hint=FailureCategory.HANG)
        step = a.step_time_s * float(np.exp(self.noise * run.standard_normal()))
        mfu = a.mfu * a.step_time_s / step
        tflops = mfu * workload.peak_tflops
        util = float(np.clip(1.0 - a.idle_share + 0.02 * run.standard_normal(), 0.05, 1.0))
        metrics = Metrics(step_time_s=step, tflops_per_gpu=tflops, mfu=mfu,
                          tokens_per_s_per_gpu=workload.global_batch_size * workload.seq_length / (step * world),
                          mem_avg_gib=mem * 0.93, mem_max_gib=mem, mem_limit_gib=limit, gpu_util_avg=util,
                          gpu_util_max=min(1.0, util + 0.05))
        duration = STARTUP_S + (WARMUP_STEPS + TIMED_STEPS) * step
        return LaunchResult(ok=True, metrics=metrics, log=f"llm-analysis: {TIMED_STEPS} steps at {step:.3f} s",
                            exit_code=0, duration_s=duration, gpu_seconds=duration * world, fingerprint=fingerprint)


def draw_hidden(rng: np.random.Generator) -> Hidden:
    """A landscape's efficiencies: llm-analysis's own guidance is ~0.5 FLOP efficiency for Megatron."""
    return Hidden(flops_efficiency=float(rng.uniform(0.45, 0.62)), hbm_efficiency=float(rng.uniform(0.55, 0.85)),
                  nvlink_efficiency=float(rng.uniform(0.6, 0.9)), network_efficiency=float(rng.uniform(0.5, 0.85)))


# (preset, gpu, GPUs, sequence, sequences per GPU per step): dense presets on both GPU kinds, one to
# eight nodes; no CP (llm-analysis has none).
SETUPS: tuple[tuple[str, str, int, int, int], ...] = (
    ("llama2-7b", "a100-80gb", 8, 4096, 16),
    ("llama3-8b", "h100-sxm", 8, 8192, 16),
    ("gpt3-7b", "a100-80gb", 16, 4096, 16),
    ("qwen2.5-7b", "h100-sxm", 64, 4096, 16),
    ("llama3-70b", "h100-sxm", 64, 4096, 4),
)
# Development setups (`optico bench --dev`): none of them is a reported one. A landscape seed only
# redraws a setup's efficiencies and noise, while its memory and layout structure are llm-analysis's
# for that model and cluster, so tuning on the reported setups at another seed would tune on them.
DEV_SETUPS: tuple[tuple[str, str, int, int, int], ...] = (
    ("llama2-7b", "h100-sxm", 16, 4096, 16),
    ("llama3-8b", "a100-80gb", 16, 8192, 16),
    ("qwen2.5-7b", "a100-80gb", 8, 4096, 16),
    ("gpt3-7b", "h100-sxm", 64, 4096, 16),
    ("llama3-70b", "a100-80gb", 64, 4096, 4),
    ("llama3-8b", "h100-sxm", 16, 4096, 16),
    ("llama2-7b", "a100-80gb", 32, 4096, 8),
)


class ThirdPartyDef(LandscapeDef):
    """An llm-analysis landscape before it is built."""

    def build(self) -> Any:
        from optico.bench.experts import find_recipe, nearest_fitting, recipe_strategy
        from optico.bench.landscapes import (
            HANG_RATE,
            MEM_NOISE,
            MIN_FITTING_SHARE,
            STEP_NOISE,
            BenchLauncher,  # noqa: F401  (re-exported for readers: the launcher wraps this)
            Landscape,
            LandscapeSkipped,
            Truth,
            _rng as landscape_rng,
            failure_kind,
        )
        from optico.perfmodel.online import JobModel
        from optico.search_space import SearchSpace

        missing = available()
        if missing:
            raise LandscapeSkipped(missing)
        w = self.workload
        space = SearchSpace.build(w, self.tunables, self.fixed)
        candidates = list(space.enumerate(w))
        rng = landscape_rng("llm-analysis", self.landscape_seed, self.name)
        hidden = draw_hidden(rng)
        step_noise, mem_noise = float(rng.uniform(*STEP_NOISE)), float(rng.uniform(*MEM_NOISE))
        seed = int(rng.integers(0, 2**31))
        base = LLMAnalysisLauncher(hidden, seed=seed, noise=step_noise, hang_rate=HANG_RATE, mem_noise=mem_noise)
        results = evaluate_all(base, w, candidates)
        truth = {sig: Truth(r.metrics.mfu, None, r.metrics.mem_max_gib) if r.ok and r.metrics
                 else Truth(None, failure_kind(r)) for sig, r in results.items()}
        fitting = sum(t.mfu is not None for t in truth.values())
        if fitting < MIN_FITTING_SHARE * len(candidates):
            raise LandscapeSkipped(f"only {fitting} of {len(candidates)} configurations fit in memory")
        expert, source = None, ""
        recipe = find_recipe(self.preset, w)
        if recipe is not None:
            expert = nearest_fitting(recipe_strategy(recipe, w), candidates, JobModel(w))
            source = f"nearest fitting to {recipe.source}"

        def make() -> Launcher:
            fresh = LLMAnalysisLauncher(hidden, seed=seed, noise=step_noise, hang_rate=HANG_RATE, mem_noise=mem_noise)
            fresh._answers = base._answers  # the same noise-free answers: computed once per landscape
            return fresh

        return Landscape(name=self.name, kind="sim", workload=w, space=space, candidates=candidates, truth=truth,
                         make_launcher=make, expert=expert, expert_source=source, group="independent",
                         deviations={k: float(v) for k, v in hidden.__dict__.items()},
                         noise={"step_time": step_noise, "memory": mem_noise, "hang_rate": HANG_RATE})


def thirdparty_defs(landscape_seed: int = 0, suffix: str = "", dev: bool = False) -> list[ThirdPartyDef]:
    """The llm-analysis landscapes (SETUPS, or DEV_SETUPS with `dev`): the simulated suite's knobs
    without CP and CE fusion (neither is in llm-analysis), the distributed optimizer on."""
    from optico.bench.landscapes import MODEL_SETUPS, sim_tunables
    from optico.workload import Cluster

    out = []
    for preset, gpu, world, seq, per_gpu in DEV_SETUPS if dev else SETUPS:
        setup = MODEL_SETUPS[preset]
        w = Workload(model=setup.arch, seq_length=seq, global_batch_size=per_gpu * world, precision="bf16",
                     cluster=Cluster(gpu=gpu, gpus_per_node=8, nodes=world // 8))
        tunables = {k: v for k, v in sim_tunables(w, setup).items()
                    if k not in ("context_parallel_size", "cross_entropy_loss_fusion")}
        out.append(ThirdPartyDef(name=f"llm-analysis:{preset}-{gpu.split('-')[0]}-{world}{suffix}", preset=preset,
                                 workload=w, tunables=tunables, fixed={"use_distributed_optimizer": True},
                                 landscape_seed=landscape_seed))
    return out


def evaluate_all(launcher: LLMAnalysisLauncher, w: Workload, candidates: list[Strategy]) -> dict[str, LaunchResult]:
    """Noise-free answers for every candidate (the landscape's truth); fills `launcher`'s cache."""
    quiet = LLMAnalysisLauncher(launcher.hidden, seed=launcher.seed, noise=0.0, hang_rate=0.0,
                                mem_noise=launcher.mem_noise)
    quiet._answers = launcher._answers

    async def run() -> dict[str, LaunchResult]:
        return {s.signature(): await quiet.launch(w, s, trial_key="truth") for s in candidates}
    return asyncio.run(run())

"""Landscapes the tuners are benchmarked on: a workload, its search space, and a launcher that
answers the way a cluster would — never the tuner's own performance model.

- Simulated: a model preset on an 8-, 16- or 64-GPU A100-80GB or H100 cluster, answered by the
  simulator with *hidden* constants — the shipped constants (the ones the tuner's model uses)
  moved by seeded deviations of GEMM and attention efficiency, NVLink and network bandwidth,
  exposed communication, host overheads, activation memory and memory overhead — plus
  step-time noise, per-configuration memory noise and hangs. The tuner sees none of it.
- Replay: each distinct workload of a replay CSV with at least `MIN_REPLAY_CONFIGS` measured
  configurations; the search space is what the file measured, answers are the measurements.

A landscape is built once (its space enumerated, every configuration evaluated noise-free to
find the optimum) and shared by every tuner and seed. `Landscape.launcher(seed)` gives each
benchmark seed its own run noise and hangs while the landscape itself stays the same.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from optico.bench.experts import exact_layout, find_recipe, nearest_fitting, recipe_strategy
from optico.launchers.base import Launcher, ProgressCallback
from optico.launchers.replay import ReplayLauncher, representative
from optico.launchers.sim import TIMED_STEPS, WARMUP_STEPS, SimLauncher
from optico.perfmodel.constants import Constants, load_constants
from optico.perfmodel.online import JobModel
from optico.replay_format import ReplayRow
from optico.replay_measured import matches, measured_mfu
from optico.replay_names import matching_preset
from optico.search_space import SearchSpace, default_domain
from optico.spec import Budget, JobSpec, LauncherSpec, ReasonerSpec
from optico.strategy import Strategy
from optico.plausible import MIN_SHARE_OF_PEAK
from optico.redact import redact
from optico.textsafe import terminal_text
from optico.trial import FailureCategory, LaunchResult
from optico.workload import PRESETS, Cluster, ModelArch, Workload

PACKAGED_REPLAY = Path(__file__).resolve().parents[1] / "data" / "optico_llama3_8b_a100.csv"
_PACKAGE_PARENT = Path(__file__).resolve().parents[2]  # what published paths are relative to
# A replay workload with fewer measured configurations than this is no search: skipped.
MIN_REPLAY_CONFIGS = 4
HANG_RATE = 0.02  # the simulator's default: NCCL watchdog timeouts and silent hangs
# A simulated landscape where fewer configurations than this share fit in memory is skipped.
MIN_FITTING_SHARE = 0.01
# A replayed MFU below this is no training run's (a denormal, a unit slip; the lowest in the real
# tables is ~2e-4): the row is not a measurement and the landscape leaves it out. The reader refuses
# such rows already; the landscape also guards rows it derives.
MIN_PLAUSIBLE_MFU = MIN_SHARE_OF_PEAK


class LandscapeSkipped(Exception):
    """A landscape that cannot be benchmarked; the message says why."""


# -- hidden deviations -----------------------------------------------------------------------

@dataclass(frozen=True)
class Deviation:
    """How one constant of a simulated landscape departs from the tuner's: multiplied by
    exp(sigma·z) (or, `additive`, shifted by sigma·z) with z ~ N(0, 1) cut at ±2, then kept
    within the constant's calibration bounds."""

    field: str
    sigma: float
    why: str
    additive: bool = False


# Sized so that a landscape disagrees with the tuner's model about as much as the model disagrees
# with measured runs (`optico perfmodel evaluate` on shared/data: MFU off by 10-20 %, rank
# correlation within a workload well below 1): see docs/benchmarks.md for the figures.
DEVIATIONS: tuple[Deviation, ...] = (
    Deviation("gemm_efficiency", 0.08, "GEMM efficiency (library version, clocks, thermals)"),
    Deviation("gemm_knee", 0.5, "how fast GEMM efficiency falls for small (TP-split, small-batch) shapes"),
    Deviation("attention_efficiency", 0.2, "flash-attention efficiency"),
    Deviation("elementwise_scale", 0.3, "memory-bound kernels (fusions present or not)"),
    Deviation("nvlink_efficiency", 0.2, "NVLink bandwidth NCCL reaches"),
    Deviation("network_efficiency", 0.25, "inter-node bandwidth (fabric, rails, congestion)"),
    Deviation("tp_exposed", 0.2, "TP communication left exposed"),
    Deviation("cp_exposed", 0.3, "context-parallel KV exchange left exposed"),
    Deviation("p2p_exposed", 0.2, "pipeline send/recv on the critical path"),
    Deviation("dp_overlap_exposed", 0.5, "DP communication the overlap flags fail to hide"),
    Deviation("ep_exposed", 0.3, "expert all-to-all left exposed"),
    Deviation("moe_gemm_penalty", 0.1, "expert GEMMs without grouped GEMM"),
    Deviation("layer_overhead_s", 0.5, "host overhead per layer (kernel launches)"),
    Deviation("step_overhead_s", 0.5, "host overhead per step (data, logging)"),
    Deviation("activation_scale", 0.25, "activation memory (tensors the kernels keep)"),
    Deviation("logits_bytes", 0.3, "memory held at the loss without fusion"),
    Deviation("logits_bytes_fused", 0.3, "memory held at the loss with fusion"),
    Deviation("pp_extra_in_flight", 0.3, "micro-batches a pipeline stage holds beyond 1F1B's", additive=True),
    Deviation("mem_overhead_gib", 4.0, "memory overhead in GiB (CUDA context, NCCL, allocator)", additive=True),
)
STEP_NOISE = (0.005, 0.02)  # per-run step-time noise (std dev, relative), drawn per landscape
MEM_NOISE = (0.02, 0.04)  # per-configuration peak-memory deviation (std dev, relative)
# Step-time effects no term of the model explains, drawn per landscape (std devs of log step time):
# a main effect per value of each tunable ("sequence parallel costs more here than modelled"),
# which a tuner can learn from its measurements, and an idiosyncratic shortfall per configuration
# (a poor kernel choice for one shape), never a gain.
MAIN_EFFECTS = (0.01, 0.02)
SHORTFALLS = (0.005, 0.02)
# No simulated configuration runs faster than this share of the GPU's peak: a margin for the run
# noise (STEP_NOISE) below 100 %, above which a measurement is impossible (`optico.plausible`).
MAX_OPTIMUM_MFU = 0.95


def _rng(*parts: object) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def draw_hidden(base: Constants, rng: np.random.Generator) -> tuple[Constants, dict[str, float]]:
    """(hidden constants, each deviated constant's hidden/base ratio — or GiB shift when additive)."""
    bounds = Constants.free_fields()
    values = base.model_dump()
    moved: dict[str, float] = {}
    for d in DEVIATIONS:
        z = float(np.clip(rng.standard_normal(), -2.0, 2.0))
        old = values[d.field]
        new = old + d.sigma * z if d.additive else old * float(np.exp(d.sigma * z))
        lo, hi = bounds.get(d.field, (-np.inf, np.inf))
        new = float(np.clip(new, lo, hi))
        values[d.field] = new
        moved[d.field] = new - old if d.additive else (new / old if old else 1.0)
    return Constants.model_validate(values), moved


# -- the landscape ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Truth:
    """What one configuration does on a landscape without run noise: its MFU and peak memory, or
    how it fails."""

    mfu: float | None
    failure: str | None = None
    mem_gib: float | None = None


class BenchLauncher(Launcher):
    """A landscape's launcher for one benchmark seed.

    The seed is mixed into every trial key, so per-run noise and hangs differ between seeds
    while per-configuration facts (the landscape) do not. `candidates()` is the landscape's
    configuration set — enumerated once, reused by every tuner and seed (the loop would
    otherwise enumerate the space again for each job; the set is the same)."""

    def __init__(self, inner: Launcher, seed: int, candidates: list[Strategy]):
        self.inner, self.seed, self._candidates = inner, seed, candidates
        self.kind = inner.kind

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        return await self.inner.launch(workload, strategy, trial_key=f"bench-seed{self.seed}/{trial_key}",
                                       progress=progress)

    def candidates(self, workload: Workload) -> list[Strategy]:
        return list(self._candidates)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "bench_seed": self.seed}


@dataclass
class Landscape:
    """A built landscape: every tuner and seed gets the same space, truth and launcher kind."""

    name: str
    kind: Literal["sim", "replay"]
    workload: Workload
    space: SearchSpace
    candidates: list[Strategy] = field(repr=False)
    truth: dict[str, Truth] = field(repr=False)
    make_launcher: Callable[[], Launcher] = field(repr=False)
    expert: Strategy | None = None
    expert_source: str = ""
    hidden: Constants | None = field(default=None, repr=False)
    deviations: dict[str, float] = field(default_factory=dict)
    noise: dict[str, float] = field(default_factory=dict)
    replay_path: str | None = None
    # Which family the landscape belongs to (report sections): independent, out-of-form, real, self.
    group: str = "self"
    # The performance-model constants OptiCo and the model-based baselines use here (None: shipped).
    calibration: str | None = None

    @cached_property
    def optimum(self) -> Strategy:
        """The best configuration that runs (noise-free)."""
        return max((s for s in self.candidates if self.truth[s.signature()].mfu is not None),
                   key=lambda s: self.truth[s.signature()].mfu)

    @property
    def optimum_mfu(self) -> float:
        return self.truth[self.optimum.signature()].mfu  # type: ignore[return-value]

    @property
    def expert_mfu(self) -> float | None:
        """The expert configuration's noise-free MFU; None without an expert or when it fails here."""
        return self.truth[self.expert.signature()].mfu if self.expert is not None else None

    def true_mfu(self, s: Strategy) -> float | None:
        t = self.truth.get(s.signature())
        return t.mfu if t else None

    def launcher(self, seed: int) -> BenchLauncher:
        return BenchLauncher(self.make_launcher(), seed, self.candidates)

    def job_spec(self, budget: int, seed: int, reasoner: ReasonerSpec | None = None,
                 baseline: Strategy | None = None) -> JobSpec:
        """The OptiCo job for this landscape: its workload and space, no baseline (a cold start,
        like the other tuners), the product's default stopping rules within `budget` trials."""
        launcher = LauncherSpec(kind="replay", data=self.replay_path) if self.kind == "replay" \
            else LauncherSpec(kind="sim", seed=seed)
        return JobSpec(name=f"bench-{self.name}-seed{seed}", workload=self.workload, search_space=self.space,
                       baseline=baseline, budget=Budget(max_trials=budget), launcher=launcher,
                       reasoner=reasoner or ReasonerSpec(), seed=seed, calibration=self.calibration)

    def job_model(self) -> JobModel:
        """The tuner-side performance model of this landscape (its calibration, no observations)."""
        return JobModel(self.workload, load_constants(self.calibration))

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "group": self.group, "calibration": _shown(self.calibration),
                "workload": self.workload.describe(),
                "configurations": len(self.candidates),
                "fitting": sum(1 for t in self.truth.values() if t.mfu is not None),
                "optimum_mfu": self.optimum_mfu, "optimum": self.optimum.short(),
                "expert": self.expert.short() if self.expert else None, "expert_mfu": self.expert_mfu,
                "expert_source": self.expert_source, "deviations": self.deviations, "noise": self.noise}


class HiddenSimLauncher(SimLauncher):
    """The simulator with step-time effects its constants cannot express: each configuration's
    step time is multiplied by exp(sum of the main effects of its values + |shortfall·z|), z ~ N(0, 1)
    cut at 2.5 and fixed per configuration (seeded by the landscape and the signature) —
    systematic, like a real cluster, not run-to-run noise. Out-of-form landscapes add pairwise
    interactions (an effect per pair of knob values) and a two-sided residual per configuration
    (`residual`·z, z ~ N(0, 1) cut at 3): effects of a form the tuner's model has no term for."""

    def __init__(self, *, effects: dict[tuple[str, str], float], shortfall: float,
                 interactions: dict[tuple[str, str, str, str], float] | None = None, residual: float = 0.0,
                 slowdown: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.effects, self.shortfall = effects, shortfall
        self.interactions, self.residual, self.slowdown = interactions or {}, residual, slowdown
        self._fields = sorted({f for f, _ in self.effects})

    def factor(self, s: Strategy) -> float:
        """How much slower than the simulator `s` runs here: exp(shared effects + its own terms)."""
        return float(np.exp(self.shared_log_factor(s) + self.own_log_factor(s)))

    def shared_log_factor(self, s: Strategy) -> float:
        """The effects `s` shares with other configurations (main effects, pairwise interactions):
        what a tuner can learn about `s` from trials of others."""
        n = s.normalized()
        values = {f: repr(getattr(n, f)) for f in self._fields}
        log_f = self.slowdown + sum(self.effects.get((f, v), 0.0) for f, v in values.items())
        if self.interactions:
            items = sorted(values.items())
            log_f += sum(self.interactions.get((f, v, g, u), 0.0) for i, (f, v) in enumerate(items)
                         for g, u in items[i + 1:])
        return float(log_f)

    def own_log_factor(self, s: Strategy) -> float:
        """The terms `s` has alone (its shortfall and residual): only a launch of `s` reveals them."""
        z = float(np.clip(_rng(self.seed, "shortfall", s.signature()).standard_normal(), -2.5, 2.5))
        r = float(np.clip(_rng(self.seed, "residual", s.signature()).standard_normal(), -3.0, 3.0)) \
            if self.residual else 0.0
        return abs(self.shortfall * z) + self.residual * r

    def draw_own_log_factors(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """Fresh draws of `own_log_factor`'s terms, from the same distributions (`optico.bench.ceiling`)."""
        z = np.clip(rng.standard_normal(shape), -2.5, 2.5)
        r = np.clip(rng.standard_normal(shape), -3.0, 3.0)
        return np.abs(self.shortfall * z) + self.residual * r

    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        r = await super().launch(workload, strategy, trial_key=trial_key, progress=progress)
        if not r.ok or r.metrics is None:
            return r
        f, m = self.factor(strategy), r.metrics
        step = m.step_time_s * f
        metrics = m.model_copy(update={"step_time_s": step, "tflops_per_gpu": m.tflops_per_gpu / f,
                                       "mfu": m.mfu / f, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu / f})
        extra_s = (WARMUP_STEPS + TIMED_STEPS) * (step - m.step_time_s)
        return r.model_copy(update={"metrics": metrics, "log": f"sim: {TIMED_STEPS} steps at {step:.3f} s",
                                    "duration_s": r.duration_s + extra_s,
                                    "gpu_seconds": r.gpu_seconds + extra_s * workload.world_size})


def model_agreement(landscape: Landscape) -> dict[str, float | None]:
    """How far the tuner's performance model (the shipped constants, before any measurement) is
    from a landscape, in `optico perfmodel evaluate`'s terms: over the configurations that run,
    MFU and peak-memory median absolute percentage errors and the Spearman rank correlation of
    MFU (all, and within the model's top 5 %); over all configurations, fit/OOM accuracy; the
    true MFU of the model's favourite (the best predicted configuration it expects to fit) as a
    fraction of the optimum (0 = it fails there); and how hard 98 % of the optimum is to reach: how
    many configurations get there (`near_optimal`) and where the first of them sits in the model's
    ranking of what it expects to fit (`model_rank_98`, 1 = its favourite; None = the model expects
    none of them to fit). A rank far beyond the budget means reaching 98 % takes luck or a lot of
    learning: the trials must overturn the model's order."""
    from scipy.stats import spearmanr

    model = landscape.job_model()
    runs = [s for s in landscape.candidates if landscape.true_mfu(s) is not None]
    true = np.array([landscape.true_mfu(s) for s in runs], dtype=float)
    pred = np.array([model.mfu(s) for s in runs])
    top = np.argsort(-pred)[: max(10, len(runs) // 20)]
    mem = [(model.mem_gib(s), landscape.truth[s.signature()].mem_gib) for s in runs]
    mem = [(p, t) for p, t in mem if t]
    fits = [model.mem_gib(s) <= model.limit_gib for s in landscape.candidates]
    real = [landscape.true_mfu(s) is not None for s in landscape.candidates]
    expected = [s for s, f in zip(landscape.candidates, fits) if f]
    ranked = sorted(expected, key=model.mfu, reverse=True)  # the model's order; [0] is its favourite
    pick = landscape.true_mfu(ranked[0]) if ranked else None
    target = 0.98 * landscape.optimum_mfu
    rank_98 = next((i for i, s in enumerate(ranked, start=1) if (landscape.true_mfu(s) or 0.0) >= target), None)

    def rho(a: np.ndarray, b: np.ndarray) -> float | None:
        return float(spearmanr(a, b).correlation) if len(a) > 2 else None

    # Truths are finite and positive (replay rows that are not: `replay_measured`); a ratio that
    # still overflows is a figure, not a warning on the terminal.
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return {"mfu_median_ape": float(np.median(np.abs(pred - true) / true)) if runs else None,
                "mem_median_ape": float(np.median([abs(p - t) / t for p, t in mem])) if mem else None,
                "spearman": rho(pred, true), "spearman_top5": rho(pred[top], true[top]),
                "fit_accuracy": float(np.mean([a == b for a, b in zip(fits, real)])),
                "model_pick": (pick or 0.0) / landscape.optimum_mfu,
                "near_optimal": int((true >= target).sum()), "model_rank_98": rank_98}


def _evaluate_all(launcher: Launcher, w: Workload, candidates: list[Strategy]) -> dict[str, Truth]:
    """Runs every candidate once through a noise-free launcher (one event loop for all)."""
    async def run() -> dict[str, Truth]:
        out: dict[str, Truth] = {}
        for i, s in enumerate(candidates):
            r = await launcher.launch(w, s, trial_key=f"truth-{i}")
            out[s.signature()] = Truth(r.metrics.mfu, None, r.metrics.mem_max_gib) if r.ok and r.metrics \
                else Truth(None, failure_kind(r))
        return out
    return asyncio.run(run())


def failure_kind(r: LaunchResult) -> str:
    """A coarse failure class for reports: oom, hang, not_measured or error."""
    if r.category_hint == FailureCategory.NOT_MEASURED:
        return "not_measured"
    if r.category_hint == FailureCategory.OOM or "out of memory" in r.log.lower():
        return "oom"
    if r.category_hint == FailureCategory.HANG or "watchdog" in r.log.lower() or "hang" in r.log.lower():
        return "hang"
    return "error"


# -- simulated landscapes --------------------------------------------------------------------

class LandscapeDef(BaseModel):
    """A landscape before it is built (cheap, picklable): what every family of landscapes names."""

    model_config = ConfigDict(frozen=True)

    name: str
    preset: str
    workload: Workload
    tunables: dict[str, list[Any]]
    fixed: dict[str, Any]
    landscape_seed: int = 0

    def size_hint(self) -> int:
        """The space's raw size (before validity): a cheap guess at the cost of the landscape."""
        return SearchSpace.build(self.workload, self.tunables, self.fixed).size()


class SimDef(LandscapeDef):
    """A simulated landscape before it is built."""

    # Out-of-form effects (log step time std dev): half the variance in pairwise interactions, half
    # in a two-sided residual per configuration; 0 = the self-generated family.
    effect_size: float = 0.0
    group: str = "self"

    def build(self) -> Landscape:
        """The landscape; raises LandscapeSkipped when (almost) nothing in the space fits in memory."""
        w = self.workload
        space = SearchSpace.build(w, self.tunables, self.fixed)
        candidates = list(space.enumerate(w))
        if not candidates:
            raise LandscapeSkipped("no valid configuration in the space")
        rng = _rng("optico-bench", self.landscape_seed, self.name)
        hidden, moved = draw_hidden(load_constants(), rng)
        step_noise = float(rng.uniform(*STEP_NOISE))
        mem_noise = float(rng.uniform(*MEM_NOISE))
        effect_sigma = float(rng.uniform(*MAIN_EFFECTS))
        effects = {(f, repr(v)): float(effect_sigma * np.clip(rng.standard_normal(), -2.0, 2.0))
                   for f, domain in space.tunables.items() for v in domain}
        shortfall = float(rng.uniform(*SHORTFALLS))
        sim_seed = int(rng.integers(0, 2**31))
        interactions, residual = out_of_form(space, self.effect_size, _rng("out-of-form", self.landscape_seed,
                                                                            self.name))
        effects_kw: dict[str, Any] = dict(effects=effects, shortfall=shortfall, interactions=interactions,
                                          residual=residual)

        def evaluate() -> dict[str, Truth]:
            return _evaluate_all(HiddenSimLauncher(seed=sim_seed, noise=0.0, hang_rate=0.0, constants=hidden,
                                                   mem_noise=mem_noise, **effects_kw), w, candidates)

        truth = evaluate()
        # Large two-sided effects can lift a configuration past the GPU's peak, which no cluster
        # measures: such a landscape is slowed uniformly (an offset, which any tuner learns from its
        # first run) until its optimum is MAX_OPTIMUM_MFU.
        best = max((t.mfu for t in truth.values() if t.mfu is not None), default=0.0)
        if best > MAX_OPTIMUM_MFU:
            effects_kw["slowdown"] = float(np.log(best / MAX_OPTIMUM_MFU))
            truth = evaluate()
        fitting = sum(t.mfu is not None for t in truth.values())
        if fitting < MIN_FITTING_SHARE * len(candidates):
            raise LandscapeSkipped(f"only {fitting} of {len(candidates)} configurations fit in memory: a "
                                   f"memory puzzle, not a tuning landscape")
        expert, source = None, ""
        recipe = find_recipe(self.preset, w)
        if recipe is not None:
            expert = nearest_fitting(recipe_strategy(recipe, w), candidates, JobModel(w))
            source = recipe.source if expert is not None and expert.signature() == \
                recipe_strategy(recipe, w).signature() else f"nearest fitting to {recipe.source}"

        def make() -> Launcher:
            return HiddenSimLauncher(seed=sim_seed, noise=step_noise, hang_rate=HANG_RATE, constants=hidden,
                                     mem_noise=mem_noise, **effects_kw)

        return Landscape(name=self.name, kind="sim", workload=w, space=space, candidates=candidates, truth=truth,
                         make_launcher=make, expert=expert, expert_source=source, hidden=hidden, deviations=moved,
                         noise={"step_time": step_noise, "memory": mem_noise, "main_effects": effect_sigma,
                                "shortfall": shortfall, "hang_rate": HANG_RATE, "out_of_form": self.effect_size,
                                "slowdown": effects_kw.get("slowdown", 0.0)},
                         group=self.group)


def out_of_form(space: SearchSpace, size: float, rng: np.random.Generator
                ) -> tuple[dict[tuple[str, str, str, str], float], float]:
    """Effects of a form the tuner's model cannot express, of total log-step-time std dev `size`:
    an effect per pair of values of two tunables (N(0, s_pair^2), s_pair so the pairs of one
    configuration sum to variance size^2/2) and the std dev of a two-sided per-configuration residual
    (variance size^2/2). Returns (interactions keyed (field, repr(value), field, repr(value)) with the
    fields in name order, residual std dev)."""
    if size <= 0:
        return {}, 0.0
    fields = sorted(f for f, v in space.tunables.items() if len(v) > 1)
    n_pairs = max(1, len(fields) * (len(fields) - 1) // 2)
    s_pair = size * float(np.sqrt(0.5 / n_pairs))
    out: dict[tuple[str, str, str, str], float] = {}
    for i, f in enumerate(fields):
        for g in fields[i + 1:]:
            for v in space.tunables[f]:
                for u in space.tunables[g]:
                    out[(f, repr(v), g, repr(u))] = float(s_pair * np.clip(rng.standard_normal(), -3, 3))
    return out, size * float(np.sqrt(0.5))


@dataclass(frozen=True)
class ModelSetup:
    """How a preset is trained in the suite: sequence, batch per GPU, what is tuned."""

    arch: ModelArch
    seq_length: int
    gbs_per_gpu: int
    context_parallel: bool = False  # long sequences: CP 1/2 is tuned


def _qwen3_moe_24l() -> ModelArch:
    # examples/qwen3-moe-a100.yaml: Qwen3-30B-A3B cut to 24 layers so Adam fits 8 x 80 GB.
    return PRESETS["qwen3-30b-a3b"].model_copy(update={"name": "qwen3-moe-24l", "num_layers": 24})


MODEL_SETUPS: dict[str, ModelSetup] = {
    "llama2-7b": ModelSetup(PRESETS["llama2-7b"], 4096, 16),
    "llama3-8b": ModelSetup(PRESETS["llama3-8b"], 8192, 16, context_parallel=True),
    "qwen2.5-7b": ModelSetup(PRESETS["qwen2.5-7b"], 4096, 16),
    "gpt3-7b": ModelSetup(PRESETS["gpt3-7b"], 4096, 16),
    "llama3-70b": ModelSetup(PRESETS["llama3-70b"], 8192, 2, context_parallel=True),
    "mixtral-8x7b": ModelSetup(PRESETS["mixtral-8x7b"], 4096, 16),
    "qwen3-moe-24l": ModelSetup(_qwen3_moe_24l(), 4096, 32),
}
# Where an example spec exists, its workload exactly (examples/*.yaml).
EXAMPLE_WORKLOADS: dict[tuple[str, str, int], dict[str, Any]] = {
    ("llama3-8b", "a100-80gb", 8): {"precision": "fp16", "global_batch_size": 512},  # llama3-8b-a100.yaml
    ("gpt3-7b", "a100-80gb", 16): {"global_batch_size": 1024},  # gpt3-7b-a100-16.yaml
    ("qwen3-moe-24l", "a100-80gb", 8): {"global_batch_size": 256},  # qwen3-moe-a100.yaml
    ("llama3-70b", "h100-sxm", 64): {"global_batch_size": 128},  # llama3-70b-h100-64.yaml
}
# Combinations where (almost) nothing fits in memory — `build()` skips them (70B on 16 GPUs: 5-9
# of ~4000 configurations fit) — left out of the default suite so it spends no time building them.
NOTHING_FITS: frozenset[tuple[str, str, int]] = frozenset({
    ("llama3-70b", "a100-80gb", 8), ("llama3-70b", "a100-80gb", 16), ("llama3-70b", "h100-sxm", 8),
    ("llama3-70b", "h100-sxm", 16), ("mixtral-8x7b", "a100-80gb", 8), ("mixtral-8x7b", "h100-sxm", 8),
})


def _domain(field: str, w: Workload, keep: list[Any]) -> list[Any]:
    return [v for v in default_domain(field, w) if v in keep]


def sim_tunables(w: Workload, setup: ModelSetup) -> dict[str, list[Any]]:
    """The examples' knobs, domains trimmed so a space stays within a few thousand valid
    configurations: PP up to 8 (4 for MoE), VPP 2 (and 5 where layers per stage allow: the
    Llama3-70B recipe), CP 1/2 for 8K sequences, MBS up to 4 (2 for 8K sequences and MoE),
    TP and EP up to 4 and 8 for MoE."""
    moe, long_seq = w.model.is_moe, w.seq_length >= 8192
    t: dict[str, list[Any]] = {
        "tensor_model_parallel_size": [v for v in default_domain("tensor_model_parallel_size", w)
                                       if not moe or v <= 4],
        "pipeline_model_parallel_size": _domain("pipeline_model_parallel_size", w, [1, 2, 4] if moe else [1, 2, 4, 8]),
    }
    if not moe:
        t["virtual_pipeline_model_parallel_size"] = _domain("virtual_pipeline_model_parallel_size", w, [None, 2, 5])
    if setup.context_parallel:
        t["context_parallel_size"] = _domain("context_parallel_size", w, [1, 2])
    if moe:
        t["expert_model_parallel_size"] = [v for v in default_domain("expert_model_parallel_size", w) if v <= 8]
    t["micro_batch_size"] = _domain("micro_batch_size", w, [1, 2] if moe or long_seq else [1, 2, 4])
    t["sequence_parallel"] = [False, True]
    t["recompute_granularity"] = [None, "selective", "full"]
    t["overlap_grad_reduce"] = [False, True]
    t["overlap_param_gather"] = [False, True]
    if moe:
        t["moe_token_dispatcher_type"] = ["allgather", "alltoall"]
    t["cross_entropy_loss_fusion"] = [False, True]
    return t


def sim_fixed(w: Workload) -> dict[str, Any]:
    """Fixed as in the examples (the distributed optimizer) and the MoE recipes (grouped GEMM)."""
    return {"use_distributed_optimizer": True, **({"moe_grouped_gemm": True} if w.model.is_moe else {})}


def suite_clusters(preset: str, all_clusters: bool = False) -> list[tuple[str, int]]:
    """(gpu, world) pairs a preset runs on: 8 and 64 GPUs of A100-80GB and H100 (16 where nothing
    fits on 8), plus every example spec's cluster; `all_clusters`: 8, 16 and 64 everywhere.
    Combinations in NOTHING_FITS are left out."""
    out: list[tuple[str, int]] = []
    for gpu in ("a100-80gb", "h100-sxm"):
        worlds = [8, 16, 64] if all_clusters else [8 if (preset, gpu, 8) not in NOTHING_FITS else 16, 64]
        worlds += [w for (p, g, w) in EXAMPLE_WORKLOADS if p == preset and g == gpu and w not in worlds]
        out += [(gpu, w) for w in sorted(worlds) if (preset, gpu, w) not in NOTHING_FITS]
    return out


def sim_defs(landscape_seed: int = 0, presets: list[str] | None = None, all_clusters: bool = False,
             effect_size: float = 0.0, group: str = "self", suffix: str = "") -> list[SimDef]:
    """The simulated suite: each preset on its clusters (`suite_clusters`); `effect_size` adds
    out-of-form effects (`out_of_form`), `suffix` goes on every name."""
    out = []
    for preset, setup in MODEL_SETUPS.items():
        if presets is not None and preset not in presets:
            continue
        for gpu, world in suite_clusters(preset, all_clusters):
            overrides = EXAMPLE_WORKLOADS.get((preset, gpu, world), {})
            w = Workload(model=setup.arch, seq_length=setup.seq_length,
                         global_batch_size=overrides.get("global_batch_size", setup.gbs_per_gpu * world),
                         precision=overrides.get("precision", "bf16"),
                         # Recipe runs on clusters with Transformer Engine, like the examples: the fused
                         # loss runs TE's kernel, which saves memory (megatron-core's native one costs it).
                         cross_entropy_fusion_impl="te",
                         cluster=Cluster(gpu=gpu, gpus_per_node=8, nodes=world // 8))
            name = f"{preset}-{gpu.split('-')[0]}-{world}{suffix}"
            out.append(SimDef(name=name, preset=preset, workload=w, tunables=sim_tunables(w, setup),
                              fixed=sim_fixed(w), landscape_seed=landscape_seed, effect_size=effect_size,
                              group=group))
    return out


# -- replay landscapes -----------------------------------------------------------------------

class ReplayDef(BaseModel):
    """One workload of a replay CSV before it is built (cheap, picklable)."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: str
    workload: Workload
    # OptiCo's constants here: one fitted without this file's rows (optico.bench.separation).
    calibration: str | None = None
    group: str = "real"

    def size_hint(self) -> int:
        return 1

    def build(self) -> Landscape:
        from optico.bench.separation import LandscapeOverlap, check_disjoint, row_key

        base = ReplayLauncher(self.path)
        w = self.workload
        measured = replay_measured(base, w)
        if not measured:
            raise LandscapeSkipped("no measured configuration")
        space = replay_space(w, measured)
        candidates = [s for s in measured if space.contains(s)]
        try:  # refuse a landscape whose rows the tuner's calibration has seen
            check_disjoint(self.name, {row_key(w.key(), s.signature()) for s in candidates}, self.calibration)
        except LandscapeOverlap as exc:
            raise LandscapeSkipped(str(exc)) from exc
        truth: dict[str, Truth] = {}
        for s in candidates:
            rows = base.rows_for(w, s)
            chosen = representative(rows)  # what the launcher replays
            mfu = measured_mfu(chosen) if chosen.result == "ok" else None
            truth[s.signature()] = Truth(mfu, None if mfu is not None else chosen.result, chosen.mem_max_gib)
        if not any(t.mfu is not None for t in truth.values()):
            raise LandscapeSkipped("no measured configuration ran")
        preset = matching_preset(w.model)
        recipe = find_recipe(preset.name if preset else None, w)
        expert = exact_layout(recipe_strategy(recipe, w), candidates) if recipe else None
        return Landscape(name=self.name, kind="replay", workload=w, space=space, candidates=candidates, truth=truth,
                         make_launcher=lambda: ReplayLauncher(self.path, rows=base.rows), expert=expert,
                         expert_source=recipe.source if expert is not None and recipe else "",
                         replay_path=self.path, group=self.group, calibration=self.calibration)


def _shown(path: str | None) -> str | None:
    """A packaged file as its path inside the package's parent (`optico/bench/calibrations/...`): the
    published results should not carry the absolute path of the machine that ran them."""
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(_PACKAGE_PARENT).as_posix()
    except ValueError:
        return path


def _replayed_row(launcher: ReplayLauncher, w: Workload, s: Strategy) -> ReplayRow:
    """The row the launcher answers `s` with (`optico.launchers.replay.representative`)."""
    return representative(launcher.rows_for(w, s))


def replay_measured(launcher: ReplayLauncher, w: Workload) -> list[Strategy]:
    """The configurations a replay landscape of `w` holds: the launcher's candidates (rows whose
    numbers a GPU can measure: the reader skips the others, `optico.replay_measured.impossible_measurement`),
    less those whose replayed row has no MFU or one below MIN_PLAUSIBLE_MFU (a typo such as 1e-320,
    which would break every ratio)."""
    out = []
    for s in launcher.candidates(w):
        row = _replayed_row(launcher, w, s)
        if row.result == "ok":
            mfu = measured_mfu(row)
            if mfu is None or mfu < MIN_PLAUSIBLE_MFU:
                continue
        out.append(s)
    return out


def replay_space(w: Workload, measured: list[Strategy]) -> SearchSpace:
    """The space of a replay table: a field the rows vary is tunable over the values they hold
    (in first-seen order), every other field fixed at the rows' common value."""
    tunables: dict[str, list[Any]] = {}
    fixed: dict[str, Any] = {}
    for name in Strategy.model_fields:
        values = list(dict.fromkeys(getattr(s, name) for s in measured))
        if len(values) > 1:
            tunables[name] = values
        elif name not in ("recompute_method", "recompute_num_layers") or values[0] is not None:
            fixed[name] = values[0]
    return SearchSpace.build(w, tunables, fixed)


def replay_defs(path: str | Path, min_configs: int = MIN_REPLAY_CONFIGS,
                calibration: str | None = None, rows: list[ReplayRow] | None = None,
                left_out: list[str] | None = None) -> list[ReplayDef]:
    """One landscape per distinct workload of the file with at least `min_configs` configurations;
    `calibration` defaults to the one held out from this file (None when there is none: refused);
    `rows`: the file's rows, when the caller read them already; `left_out` gets a line per workload
    that is no landscape, and why."""
    from optico.bench.separation import heldout_calibration

    path = Path(path)
    try:
        calibration = calibration or heldout_calibration(path)
    except OSError:  # "without-<stem>.json" longer than the file system allows: none was built
        calibration = None
    launcher = ReplayLauncher(path, rows=rows)
    out: list[ReplayDef] = []
    seen: list[Workload] = []
    for row in launcher.rows:
        if not row.usable or row.workload is None:
            continue
        w = row.workload
        if any(matches(row, v) for v in seen):
            continue
        seen.append(w)
        measured = replay_measured(launcher, w)
        # Enough configurations, and at least one that ran: a table of OOMs has no optimum.
        if len(measured) < min_configs or all(_replayed_row(launcher, w, s).result != "ok" for s in measured):
            if left_out is not None:
                why = (f"{len(measured)} measured configuration(s), at least {min_configs} needed"
                       if len(measured) < min_configs else "no run that finished")
                left_out.append(f"{w.model.name} on {w.world_size} {w.cluster.gpu}, GBS {w.global_batch_size} "
                                f"(line {row.line}): {why}")
            continue
        cluster = f"{w.cluster.gpu.split('-')[0]}-{w.world_size}"
        # The name goes to the terminal, the report and the JSON: controls in the file's name or the
        # model's (a CSV cell) shown escaped, on one line, and a key pasted into either masked.
        name = terminal_text(redact(f"replay:{path.stem[:200]}:{w.model.name[:200]}-{cluster}-"
                                    f"gbs{w.global_batch_size}"), one_line=True, max_chars=500)
        if any(d.name == name for d in out):
            name += f"-line{row.line}"
        out.append(ReplayDef(name=name, path=str(path), workload=w, calibration=calibration))
    return out


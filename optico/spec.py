"""The job spec: a YAML file a performance engineer writes, loaded into typed models.

Every error names the field (a dotted path into the YAML) and the reason, as one
line, so `optico tune` can print it and exit 2 before touching the pool.

Everything is checked here, before a job exists, and within bounds: the text (size, depth,
aliases, duplicate keys, types: `optico.safe_yaml`), each value's type strictly (`true` is not
a GPU count, `8.0` not a micro-batch), each magnitude (`LIMITS`: nothing a real job needs is
refused, nothing that would make the arithmetic or the enumeration blow up is accepted), the
size of the search space, and the files the spec names (`optico.input_files`). The CLI and the
REST API share `parse_spec_text`, so both give the same errors.
"""

from __future__ import annotations

import itertools
import random
import re
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from optico.errors import SpecError, loc_fields
from optico.input_files import MAX_SPEC_BYTES, decode_text, read_text, resolve
from optico.knobs import knob
from optico.perfmodel.constants import read_calibration
from optico.programs import ProgramSpec
from optico.redact import is_optico_own
from optico.replay_csv import check_replay_csv
from optico.rules import is_valid, violations
from optico.safe_yaml import load_yaml
from optico.search_space import SearchSpace
from optico.strategy import Strategy, canonical_field, check_value, strategy_from_mapping
from optico.textsafe import BIDI, INVISIBLE, SEPARATORS, SURROGATES, has_visible
from optico.workload import PRESETS, Cluster, Framework, ModelArch, Workload

__all__ = ["Budget", "JobSpec", "LauncherSpec", "ReasonerSpec", "SpecError", "load_spec", "parse_spec",
           "parse_spec_text"]

# rules: the offline expert rules. model-guided: an LLM ranks the performance model's candidate
# moves (the name "openai" is accepted for it: jobs stored before the modes had names).
# llm-led: the paper's method: the LLM reasons over the pool's history and writes the
# configurations; the guard is the only code between it and a launch.
ReasonerKind = Literal["rules", "model-guided", "llm-led"]
REASONER_KINDS: tuple[str, ...] = ("rules", "model-guided", "llm-led")
# The paper's ablations: without the pool's history (the last trial only), without failure
# analysis, without chain of thought, without confidence scores.
Ablation = Literal["history", "failure-analysis", "cot", "confidence"]
ABLATIONS: tuple[str, ...] = ("history", "failure-analysis", "cot", "confidence")

MAX_SEED = 2**32 - 1  # numpy's generators take seeds in [0, 2**32)
MAX_SECONDS = 30 * 24 * 3600.0  # a month: no single run or wait is longer
MAX_PROGRAM_STEPS = 1_000_000  # steps of one trial: far beyond a measurement, within any counter
MAX_TRIALS = 10_000
MAX_GPU_HOURS = 1e9
MAX_NAME_CHARS = 200
MAX_PATH_CHARS = 4096
# A name printed in every table and log line: any printable text, no control characters.
_CONTROL = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{BIDI}{SEPARATORS}{SURROGATES}{INVISIBLE}]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Budget(BaseModel):
    """When a job stops, whichever comes first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_trials: PositiveInt = Field(20, description="Validation runs at most (the paper's T_max).")
    gpu_hours: float | None = Field(None, gt=0, description="GPU-hours the runs may spend.")
    patience: PositiveInt | None = Field(None, description="Stop after this many trials without a better MFU.")
    target_mfu: float | None = Field(None, gt=0, le=1, description="Stop once a trial reaches this MFU.")
    # 0.1 %: the launches a stop saves cost less than that share of a run of weeks to months, the runs
    # OptiCo tunes (a few 20-minute trials against 0.1 % of a two-month run are about even).
    converge_tol: float | None = Field(0.001, ge=0, lt=1, description="Stop once the next launches (up to 10) "
                                       "are not expected to beat the best measured MFU by more than this "
                                       "fraction (the model, corrected by the job's measurements, and its "
                                       "uncertainty); None = never.")
    min_trials: PositiveInt = Field(8, description="Trials before convergence may stop the job.")


class LauncherSpec(BaseModel):
    """Where validation runs happen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sim", "replay", "local", "ray"] = "sim"
    seed: int | None = Field(None, description="Simulator noise seed; None = the job's seed.")
    noise: float = Field(0.01, ge=0, le=0.5, description="Simulator: relative step-time noise (std dev).")
    hang_rate: float = Field(0.02, ge=0, le=1, description="Simulator: chance a run hangs (NCCL watchdog).")
    infra_rate: float = Field(0.0, ge=0, le=1, description="Simulator: chance a run dies of a node fault.")
    trial_seconds: float = Field(0.0, ge=0, le=3600, validation_alias=AliasChoices("trial_seconds", "delay_s"),
                                 description="Simulator: wall-clock seconds each simulated trial takes (to watch "
                                             "progress live, or interrupt a run); `delay_s` is its old name.")
    framework_version: str | None = Field(None, min_length=1, max_length=64, description="Simulator: the framework "
                                          "release the simulated cluster runs; another version is another "
                                          "landscape (deterministically) and another fingerprint. "
                                          "OPTICO_SIM_FRAMEWORK_VERSION overrides it at every launch.")
    data: str | None = Field(None, description="Replay: the CSV of measured runs.")
    timeout_s: float = Field(3600, gt=0, description="Wall-clock limit of one run.")
    hang_s: float = Field(600, gt=0, description="A run printing nothing for this long is hung.")
    address: str | None = Field(None, description="Ray: cluster address (auto, ray://host:port, local); None = "
                                                  "an existing cluster (RAY_ADDRESS, `ray start`), else a new "
                                                  "local one.")
    program: ProgramSpec | None = Field(None, description="local/ray: what torchrun runs: {kind: megatron-core} "
                                                          "(default) or {kind: megatron-lm, command: [...]}.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for the training processes, on top "
                                "of an allowlist (PATH, CUDA_*, NCCL_*, ...). Values under secret-looking names "
                                "(KEY, TOKEN, SECRET, PASSWORD, AUTH, COOKIE, ...: optico.redact.SECRET_NAME) are "
                                "stored as *** and taken from the worker's own variable of that name at launch.")
    pass_env: list[str] = Field(default_factory=list, description="Names of the worker's environment variables "
                                "passed to the training processes (e.g. WANDB_API_KEY); OPTICO_* and OPENAI_API_KEY "
                                "never pass.")
    run_dir: str | None = Field(None, description="local/ray: where trial run directories go; None = "
                                                  "<data dir>/runs.")
    num_cpus_per_node: float = Field(1, gt=0, description="Ray: CPUs each node's bundle reserves (keep it small: "
                                                          "a placement group holding every CPU starves Ray).")
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray: runtime_env of the node actors "
                                        "(env_vars, working_dir, image_uri, ...), passed through.")
    placement_timeout_s: float = Field(120, gt=0, description="Ray: fail a trial whose placement group is not "
                                                              "ready after this long (the cluster lacks GPUs).")
    max_infra_retries: int = Field(2, ge=0, le=10, description="Ray: re-runs of a trial whose node or actor died.")
    ray_init: dict[str, Any] = Field(default_factory=dict, description="Ray: ray.init() keywords when this "
                                     "process starts the cluster, e.g. {num_gpus: 2} for logical GPUs.")

    @field_validator("pass_env")
    @classmethod
    def _not_ours(cls, names: list[str]) -> list[str]:
        if len(names) > MAX_ENV_VARS:
            raise ValueError(f"{len(names)} names; at most {MAX_ENV_VARS}")
        for name in names:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name[:50]!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            if is_optico_own(name):
                raise ValueError(f"{name}: {OWN_REASON}")
        return names


class ReasonerSpec(BaseModel):
    """Which reasoner each agent uses, the paper's ablations, and whether the LLM is required."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    analysis: ReasonerKind = "rules"
    generation: ReasonerKind = "rules"
    failure: ReasonerKind = "rules"
    ablate: tuple[Ablation, ...] = Field((), description="Ablations to run (the paper's Table 2): history "
                                         "(the agents see the last trial only), failure-analysis (failed runs "
                                         "are not diagnosed), cot (no chain of thought asked), confidence (no "
                                         "confidence scores asked).")
    require_llm: bool = Field(False, description="A fallback from an LLM reasoner to the rules fails the job "
                                                 "instead of being recorded and tolerated.")

    @field_validator("analysis", "generation", "failure", mode="before")
    @classmethod
    def _alias(cls, value: object) -> object:
        return "model-guided" if value == "openai" else value

    @field_validator("ablate", mode="before")
    @classmethod
    def _ablations(cls, value: object) -> object:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, (list, tuple)) and not all(isinstance(v, str) for v in value):
            return tuple(value)  # a list or mapping among them cannot go in a set; pydantic names the item
        if isinstance(value, (list, tuple)):
            return tuple(sorted(set(value), key=lambda v: ABLATIONS.index(v) if v in ABLATIONS else 99))
        return value

    @classmethod
    def every(cls, kind: str, **more: object) -> ReasonerSpec:
        """The same reasoner for all three agents."""
        return cls(analysis=kind, generation=kind, failure=kind, **more)  # type: ignore[arg-type]

    @property
    def uses_llm(self) -> bool:
        return any(k != "rules" for k in (self.analysis, self.generation, self.failure))

    def ablated(self, what: str) -> bool:
        return what in self.ablate


class JobSpec(BaseModel):
    """Everything a tuning job needs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    workload: Workload
    search_space: SearchSpace
    baseline: Strategy | None = None
    budget: Budget = Budget()
    launcher: LauncherSpec = LauncherSpec()
    reasoner: ReasonerSpec = ReasonerSpec()
    seed: int = 0
    calibration: str | None = Field(None, description="Performance-model constants (JSON from `optico perfmodel "
                                                      "calibrate`); None = $OPTICO_CALIBRATION, else the shipped ones.")


# -- bounds ---------------------------------------------------------------------------------

# Inclusive bounds on magnitudes, checked on the input only (a stored job is read back as it was):
# far beyond any real job (the largest public models have ~130 layers, 16K hidden, 256 experts,
# 1M-token contexts) and low enough that FLOPs, memory and the default search domains stay small
# and exact, that seeds fit numpy and that waits fit asyncio.
# The model's and the cluster's integer sizes are bounded where they are declared
# (`optico.workload.positive_up_to`), so a replay table's rows are bounded too; these are the rest.
LIMITS: dict[str, tuple[float, float]] = {
    "workload.cluster.network_gbps": (0.1, 100_000),
    "budget.max_trials": (1, MAX_TRIALS),
    "budget.min_trials": (1, MAX_TRIALS),
    "budget.patience": (1, MAX_TRIALS),
    "budget.gpu_hours": (0, MAX_GPU_HOURS),
    "launcher.seed": (0, MAX_SEED),
    "launcher.timeout_s": (0, MAX_SECONDS),
    "launcher.hang_s": (0, MAX_SECONDS),
    "launcher.placement_timeout_s": (0, MAX_SECONDS),
    "launcher.num_cpus_per_node": (0, 4096),
    # What each trial runs (`optico.programs`): a trial's steps and seed, bounded like the launcher's own.
    "launcher.program.warmup": (0, MAX_PROGRAM_STEPS),
    "launcher.program.max_steps": (1, MAX_PROGRAM_STEPS),
    "launcher.program.min_steps": (1, MAX_PROGRAM_STEPS),
    "launcher.program.cv_target": (0, 1),
    "launcher.program.cv_window": (1, MAX_PROGRAM_STEPS),
    "launcher.program.max_time_s": (0, MAX_SECONDS),
    "launcher.program.seed": (0, MAX_SEED),
    "launcher.program.train_iters": (1, MAX_PROGRAM_STEPS),
    "launcher.program.warmup_iters": (0, MAX_PROGRAM_STEPS),
    "launcher.program.log_interval": (1, MAX_PROGRAM_STEPS),
}
MAX_ENV_VARS = 512
MAX_WORLD_SIZE = 1_048_576
MAX_TUNABLES = 64
MAX_DOMAIN_VALUES = 256
MAX_STRATEGY_INT = 1_048_576  # a parallel size, micro-batch or layer count larger than any world or model
# The product of the domain sizes: enumerating a space costs ~15 us per combination, and the
# loop keeps every valid one in memory. A space beyond this must list fewer tunables or values.
MAX_SPACE_COMBINATIONS = 1_000_000
# Spec load proves the space holds a valid strategy by finding one; it gives up (an error)
# after this many invalid combinations, or this long, rather than walk a million of them.
FEASIBILITY_PROBE = 50_000
FEASIBILITY_SECONDS = 2.0


def _check_limits(obj: BaseModel, where: str) -> None:
    """Every LIMITS entry under `where` (a section of the spec, e.g. "workload") on its validated model."""
    for dotted, (low, high) in LIMITS.items():
        if not dotted.startswith(where + "."):
            continue
        value: Any = obj
        for part in dotted[len(where) + 1:].split("."):
            value = getattr(value, part, None)
        if value is not None and not low <= value <= high:
            raise SpecError(dotted, f"{_figure(value)} is outside the allowed range {_figure(low)} to {_figure(high)}")


def _figure(x: float) -> str:
    """A bound or a value as written: whole numbers in full ('4,294,967,296', not '4.29497e+09', which
    made a seed one past the bound read as equal to it), others to 6 significant digits."""
    if float(x).is_integer() and abs(x) < 1e18:
        return f"{int(x):,}"
    return f"{x:g}"


# -- loading ------------------------------------------------------------------------

def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:40] + '...'}"


def _loc(prefix: str, err: dict[str, Any]) -> str:
    parts = [prefix, *loc_fields(err["loc"])]
    return ".".join(p for p in parts if p)


def _message(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"].endswith("_type") or err["type"] in ("literal_error", "enum"):
        msg += f", got {_describe(err.get('input'))}"
    return msg


def _validated(cls: type[BaseModel], data: Any, where: str) -> Any:
    """`cls` from `data`, strictly: YAML has types, so `true` is no count and `"8"` no number."""
    try:
        return cls.model_validate(data, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        field, message = _loc(where, err), _message(err)
        # A model's own check names the field it refuses first ("precision: fp8 needs ..."): point there.
        name, sep, reason = message.partition(": ")
        if err["type"] == "value_error" and sep and name in getattr(cls, "model_fields", {}) and not err["loc"]:
            field, message = f"{field}.{name}", reason
        raise SpecError(field, message) from None


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(where, f"must be a mapping, got {type(data).__name__}")
    return data


def _preset(name: Any, where: str) -> ModelArch:
    if not isinstance(name, str) or name not in PRESETS:
        raise SpecError(where, f"unknown preset {str(name)[:60]!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _model(raw: Any) -> ModelArch:
    where = "workload.model"
    if isinstance(raw, str):
        return _preset(raw, where)
    data = dict(_mapping(raw, where))
    preset = data.pop("preset", None)
    if preset is not None:
        base = _preset(preset, f"{where}.preset").model_dump()
        base.update(data)
        data = base
    name = data.get("name")
    if isinstance(name, str) and (len(name) > MAX_NAME_CHARS or _CONTROL.search(name)):
        raise SpecError(f"{where}.name", f"must be printable text of at most {MAX_NAME_CHARS} characters")
    return _validated(ModelArch, data, where)


def _workload(raw: Any) -> Workload:
    data = dict(_mapping(raw, "workload"))
    if "model" not in data:
        raise SpecError("workload.model", "missing (a preset name or an architecture mapping)")
    if "cluster" not in data:
        raise SpecError("workload.cluster", "missing (gpu, gpus_per_node, nodes)")
    model = _model(data.pop("model"))
    cluster_raw = _mapping(data.pop("cluster"), "workload.cluster")
    if isinstance(cluster_raw.get("gpu"), str) and (len(cluster_raw["gpu"]) > 100 or _CONTROL.search(cluster_raw["gpu"])):
        raise SpecError("workload.cluster.gpu", "unknown GPU (a catalog key such as h100-sxm)")
    cluster = _validated(Cluster, cluster_raw, "workload.cluster")
    framework = _validated(Framework, _mapping(data.pop("framework", None), "workload.framework"),
                           "workload.framework")
    for key in ("megatron_core", "image"):
        _check_text(getattr(framework, key), f"workload.framework.{key}")
    w = _validated(Workload, {**data, "model": model, "cluster": cluster, "framework": framework}, "workload")
    _check_limits(w, "workload")
    if w.cluster.gpus_per_node * w.cluster.nodes > MAX_WORLD_SIZE:
        raise SpecError("workload.cluster", f"{w.cluster.nodes} nodes x {w.cluster.gpus_per_node} GPUs is more "
                                            f"than the limit of {MAX_WORLD_SIZE:,} GPUs")
    return w


def _strategy_value(field: str, value: Any, where: str) -> Any:
    """One value of a strategy field, checked strictly (a YAML `true` is not a TP of 1) and bounded."""
    if field == "recompute_granularity" and isinstance(value, str) and value.lower() in ("none", "no", "off"):
        value = None
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_STRATEGY_INT:
        raise SpecError(where, f"{value} is more than the limit of {MAX_STRATEGY_INT:,}")
    try:
        check_value(field, value, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(where, f"{_describe(value)} is not a valid {field}: {_message(err)}") from None
    return value


def _names(raw: Any, where: str) -> list[tuple[str, str]]:
    """(name as written, strategy field) for each key of a tunables/fixed/baseline section; two names of
    one knob (`tp` and `tensor_model_parallel_size`) are a duplicate key, refused rather than the last winning."""
    out: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for name in raw:
        if not isinstance(name, str):
            raise SpecError(where, f"names must be strings, got {_describe(name)}")
        try:
            field = canonical_field(name)
        except KeyError as exc:
            raise SpecError(where, exc.args[0]) from None
        if field in seen:
            raise SpecError(f"{where}.{name}", f"names the same knob as {seen[field]!r}")
        seen[field] = name
        out.append((name, field))
    return out


def _baseline_values(raw: Any) -> dict[str, Any] | None:
    """Strategy field -> value for each key the spec's baseline sets, each value checked (errors name
    `baseline.<key>`); None without a baseline. A default space is widened to hold them."""
    if raw is None:
        return None
    data = _mapping(raw, "baseline")
    return {field: _strategy_value(field, data[name], f"baseline.{name}") for name, field in _names(data, "baseline")}


def _search_space(raw: Any, w: Workload, baseline: dict[str, Any]) -> SearchSpace:
    """The search space; a default one (no tunables) holds the `baseline`'s values."""
    data = _mapping(raw, "search_space")
    unknown = set(data) - {"tunables", "fixed"}
    if unknown:
        raise SpecError(f"search_space.{sorted(map(str, unknown))[0]}", "unknown field (use tunables and fixed)")
    tunables = data.get("tunables")
    if tunables is not None and not isinstance(tunables, (list, dict)):
        raise SpecError("search_space.tunables", "must be a list of names or a mapping name -> values")
    if tunables is not None and not tunables:
        raise SpecError("search_space.tunables", "is empty: name at least one knob to tune, or leave tunables "
                                                 "out for the default ones")
    if tunables is not None and len(tunables) > MAX_TUNABLES:
        raise SpecError("search_space.tunables", f"{len(tunables)} tunables; at most {MAX_TUNABLES}")
    fixed = _mapping(data.get("fixed"), "search_space.fixed")
    for name, field in _names(tunables or [], "search_space.tunables"):
        values = tunables[name] if isinstance(tunables, dict) else None
        if values is None:
            continue
        where = f"search_space.tunables.{name}"
        if not isinstance(values, list) or not values:
            raise SpecError(where, "must be a non-empty list of values")
        if len(values) > MAX_DOMAIN_VALUES:
            raise SpecError(where, f"{len(values)} values; at most {MAX_DOMAIN_VALUES}")
        for value in values:
            _strategy_value(field, value, where)
    for name, field in _names(fixed, "search_space.fixed"):
        _strategy_value(field, fixed[name], f"search_space.fixed.{name}")
    try:
        space = SearchSpace.build(w, tunables, fixed, baseline)
    except (KeyError, ValueError) as exc:
        text = exc.args[0] if exc.args else str(exc)
        field, _, reason = text.partition(": ")
        if field.startswith("search_space"):
            raise SpecError(field, reason) from None
        raise SpecError("search_space", text) from None
    size = space.size()
    if size > MAX_SPACE_COMBINATIONS:
        # The advice first and the widest domains after it: the error line is clipped, never the advice.
        widest = sorted(((len(d), f) for f, d in space.tunables.items() if len(d) > 1), reverse=True)
        shown = ", ".join(f"{f} {n}" for n, f in widest[:5]) + (f", {len(widest) - 5} more" if len(widest) > 5 else "")
        raise SpecError("search_space.tunables", f"{size:,} combinations are more than the limit of "
                                                 f"{MAX_SPACE_COMBINATIONS:,}; tune fewer knobs or list fewer values "
                                                 f"(values per knob: {shown})")
    return space


def _check_feasible(w: Workload, space: SearchSpace) -> None:
    """Fails early, naming the field, when no strategy in the space can be valid."""
    m, world = w.model, w.world_size
    tps = space.tunables.get("tensor_model_parallel_size", [space.fixed.get("tensor_model_parallel_size", 1)])
    good_tp = [t for t in tps if m.num_attention_heads % t == 0 and (m.groups % t == 0 or t % m.groups == 0)]
    if not good_tp:
        raise SpecError("search_space.tunables.tensor_model_parallel_size",
                        f"no allowed TP {tps} divides num_attention_heads ({m.num_attention_heads}) "
                        f"and num_query_groups ({m.groups})")
    pps = space.tunables.get("pipeline_model_parallel_size", [space.fixed.get("pipeline_model_parallel_size", 1)])
    cps = space.tunables.get("context_parallel_size", [space.fixed.get("context_parallel_size", 1)])
    mbss = space.tunables.get("micro_batch_size", [space.fixed.get("micro_batch_size", 1)])
    layouts = [(t, p, c) for t in good_tp for p in pps for c in cps if world % (t * p * c) == 0]
    if not layouts:
        raise SpecError("workload.cluster", f"{world} GPUs cannot be split as TP·PP·CP for any allowed TP {good_tp}, "
                                            f"PP {pps}, CP {cps}")
    if not any(w.global_batch_size % (b * (world // (t * p * c))) == 0 for t, p, c in layouts for b in mbss):
        raise SpecError("workload.global_batch_size",
                        f"{w.global_batch_size} is not divisible by MICRO_BATCH_SIZE·DP for any allowed layout "
                        f"(MBS {mbss}, {world} GPUs)")
    if _first_valid(space, w) is not None:
        return
    probed = "" if space.size() <= FEASIBILITY_PROBE else (f" among {FEASIBILITY_PROBE:,} of its {space.size():,} "
                                                           f"combinations drawn at random; narrow the domains")
    raise SpecError("search_space", f"no valid strategy in the space{probed}; e.g. {space.base().short()}: "
                                    f"{'; '.join(map(str, violations(w, space.base())))}")


def _first_valid(space: SearchSpace, w: Workload) -> Strategy | None:
    """A valid strategy of the space, or None. Exhaustive up to FEASIBILITY_PROBE combinations;
    beyond, that many drawn uniformly (seeded), so no domain order can hide the valid ones behind
    an invalid first value; within FEASIBILITY_SECONDS either way."""
    fields = list(space.tunables)
    domains = [space.tunables[f] for f in fields]
    size = space.size()
    if size <= FEASIBILITY_PROBE:
        combos = itertools.product(*domains)
    else:
        def decode(index: int) -> tuple[Any, ...]:
            values = []
            for domain in reversed(domains):
                index, digit = divmod(index, len(domain))
                values.append(domain[digit])
            return tuple(reversed(values))
        combos = map(decode, random.Random(0).sample(range(size), FEASIBILITY_PROBE))
    deadline = time.monotonic() + FEASIBILITY_SECONDS
    for n, values in enumerate(combos):
        strategy = Strategy.model_validate({**space.fixed, **dict(zip(fields, values))}).normalized()
        if is_valid(w, strategy):
            return strategy
        if n % 1000 == 999 and time.monotonic() > deadline:
            break
    return None


def _baseline(given: dict[str, Any] | None, w: Workload, space: SearchSpace) -> Strategy | None:
    """The baseline strategy from its checked values (`_baseline_values`): valid and inside the space."""
    if given is None:
        return None
    merged = {**space.fixed, **given}
    try:
        strategy = strategy_from_mapping(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(_loc("baseline", err), _message(err)) from None
    broken = violations(w, strategy)
    if broken:
        # The field the spec set off its default (pp: 5), not the first the rule reads (TP, left at 1).
        params = broken[0].params
        field = next((p for p in params if p in given and given[p] != knob(p).default),
                     next((p for p in params if p in given), params[0] if params else ""))
        raise SpecError(f"baseline.{field}" if field else "baseline", str(broken[0]))
    outside = space.outside(strategy)
    if outside:
        raise SpecError("baseline", f"outside the search space: {outside[0]}")
    return strategy


def _path_field(value: Any, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise SpecError(field, f"must be a file path, got {_describe(value)}")
    if len(value) > MAX_PATH_CHARS:
        raise SpecError(field, f"longer than {MAX_PATH_CHARS} characters")
    return value


# Begins with a short word: after "..._KEY: " a longer one reads as the key's value to the redactor.
OWN_REASON = ("one of OptiCo's own variables (OPTICO_*, except OPTICO_BENCH_*, and OPENAI_API_KEY, its LLM key's "
              "fallback), which never reach a trial")


def _launcher(raw: Any) -> LauncherSpec:
    launcher = _validated(LauncherSpec, _mapping(raw, "launcher"), "launcher")
    _check_limits(launcher, "launcher")
    if len(launcher.env) > MAX_ENV_VARS:
        raise SpecError("launcher.env", f"{len(launcher.env)} variables; at most {MAX_ENV_VARS}")
    for name, value in launcher.env.items():
        if not ENV_NAME.fullmatch(name):
            raise SpecError("launcher.env", f"{name[:50]!r} is not an environment variable name "
                                            f"([A-Za-z_][A-Za-z0-9_]*)")
        if _CONTROL.search(value):
            raise SpecError(f"launcher.env.{name}", "holds a control, escape or invisible character")
        if is_optico_own(name):
            # A secret-looking value is stored as *** and filled from the worker's variable at launch:
            # under one of OptiCo's own names that would hand the worker's LLM key to the trial.
            raise SpecError(f"launcher.env.{name}", OWN_REASON)
    for key in ("data", "address", "run_dir", "framework_version"):
        _check_text(getattr(launcher, key), f"launcher.{key}")
    for key in ("python", "cwd"):
        _check_text(getattr(launcher.program, key, None), f"launcher.program.{key}")
    return launcher


def _check_text(value: str | None, field: str) -> None:
    """A path or version string shown in tables, logs and fingerprints: bounded, no control characters."""
    if value is None:
        return
    if len(value) > MAX_PATH_CHARS:
        raise SpecError(field, f"longer than {MAX_PATH_CHARS} characters")
    if _CONTROL.search(value):
        raise SpecError(field, "contains a control or bidirectional-override character")


def _confined(path: Path, field: str, files_within: Path | None) -> Path:
    """`path`, resolved; SpecError unless it lies inside `files_within` (when given)."""
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python < 3.13)
        reason = getattr(exc, "strerror", None) or "a loop of symbolic links"
        raise SpecError(field, f"cannot read {path}: {reason}") from None
    if files_within is not None and not resolved.is_relative_to(files_within.resolve()):
        raise SpecError(field, f"{path} is outside {files_within}, the folder specs may read files from")
    return resolved


def check_launcher(launcher: LauncherSpec, w: Workload, space: SearchSpace,
                   base_dir: Path | None = None, files_within: Path | None = None) -> LauncherSpec:
    """The launcher section checked against the workload (also after `--launcher` changes its kind):
    the replay CSV read and checked whole, its path made absolute."""
    if launcher.run_dir is not None and files_within is not None:
        _confined(resolve(launcher.run_dir, base_dir), "launcher.run_dir", files_within)
    if launcher.kind != "replay":
        return launcher
    if not launcher.data:
        raise SpecError("launcher.data", "the replay launcher needs the CSV of measured runs")
    path = _confined(resolve(_path_field(launcher.data, "launcher.data"), base_dir), "launcher.data", files_within)
    check_replay_csv(path, w, space, "launcher.data")
    return launcher.model_copy(update={"data": str(path)})


def _name(name: Any) -> str:
    if not isinstance(name, str):
        raise SpecError("name", f"must be a string, got {_describe(name)}")
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        raise SpecError("name", f"must be 1 to {MAX_NAME_CHARS} characters, got {len(name):,}")
    if _CONTROL.search(name):
        raise SpecError("name", "must be printable text (no control, escape or bidi characters)")
    if not has_visible(name):
        raise SpecError("name", "shows nothing (only spaces or blank characters)")
    return name


def _seed(seed: Any) -> int:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise SpecError("seed", f"must be an integer from 0 to {MAX_SEED}, got {_describe(seed)}")
    return seed


def _default_name(origin_name: str | None) -> str:
    stem = Path(origin_name).stem if origin_name else ""
    stem = _CONTROL.sub("_", stem)[:MAX_NAME_CHARS]
    return stem if stem.strip() else "job"  # '   .yaml' named a job of spaces: refused as `name`, never written


def parse_spec(data: Any, origin: Path | None = None, *, origin_name: str | None = None,
               base_dir: Path | None = None, files_within: Path | None = None) -> JobSpec:
    """A JobSpec from parsed YAML; raises SpecError naming the field.

    `origin` is the spec file (its stem is the default name, its folder resolves relative paths);
    or give `origin_name` and `base_dir` separately (the REST API: a name, no folder).
    `files_within`: every file or folder the spec names must lie inside it (a server's data folder)."""
    if origin is not None:
        origin_name = origin_name or origin.name
        base_dir = base_dir or origin.parent
    data = _mapping(data, origin_name or "spec")
    known = set(JobSpec.model_fields)
    for key in data:
        if key not in known:
            raise SpecError(str(key)[:60], f"unknown field; known: {', '.join(sorted(known))}")
    name, seed = _name(data.get("name", _default_name(origin_name))), _seed(data.get("seed", 0))
    w = _workload(data.get("workload"))
    given = _baseline_values(data.get("baseline"))
    space = _search_space(data.get("search_space"), w, given or {})
    _check_feasible(w, space)
    baseline = _baseline(given, w, space)
    budget = _validated(Budget, _mapping(data.get("budget"), "budget"), "budget")
    _check_limits(budget, "budget")
    launcher = _launcher(data.get("launcher"))
    launcher = check_launcher(launcher, w, space, base_dir, files_within)
    reasoner_raw = data.get("reasoner")
    if isinstance(reasoner_raw, str):
        reasoner_raw = {"analysis": reasoner_raw, "generation": reasoner_raw, "failure": reasoner_raw}
    elif isinstance(reasoner_raw, dict) and "all" in reasoner_raw:
        if not isinstance(reasoner_raw["all"], str):
            raise SpecError("reasoner.all", f"must be a reasoner's name ({', '.join(REASONER_KINDS)}), "
                                            f"got {type(reasoner_raw['all']).__name__}")
        # {all: llm-led, ablate: [cot]}: one kind for every agent, with options beside it
        kind = reasoner_raw["all"]
        reasoner_raw = {"analysis": kind, "generation": kind, "failure": kind,
                        **{k: v for k, v in reasoner_raw.items() if k != "all"}}
    reasoner = _validated(ReasonerSpec, _mapping(reasoner_raw, "reasoner"), "reasoner")
    calibration = data.get("calibration")
    if calibration is not None:
        path = _confined(resolve(_path_field(calibration, "calibration"), base_dir), "calibration", files_within)
        read_calibration(path, "calibration")
        calibration = str(path)
    return JobSpec(name=name, workload=w, search_space=space, baseline=baseline, budget=budget,
                   launcher=launcher, reasoner=reasoner, seed=seed, calibration=calibration)


def parse_spec_text(text: str | bytes, *, origin_name: str | None = None, base_dir: Path | None = None,
                    files_within: Path | None = None) -> JobSpec:
    """A JobSpec from the text of a spec (YAML, or JSON, which YAML reads too); the one entry point
    the CLI and the REST API share, so both give the same errors.

    `origin_name` names the document in errors and is the default job name (its stem);
    `base_dir` is where relative paths in the spec (launcher.data, calibration) are found (None: the
    current directory); `files_within`, when given, is the only folder the spec may name files in
    (a server should not read any file a request names). Raises SpecError(field, reason), one
    line, for anything that cannot run."""
    where = origin_name or "spec"
    if isinstance(text, (bytes, bytearray)):
        if len(text) > MAX_SPEC_BYTES:
            raise SpecError(where, f"{len(text):,} bytes; a spec may be at most {MAX_SPEC_BYTES:,}")
        text = decode_text(bytes(text), where, where, "spec")
    elif len(text) > MAX_SPEC_BYTES:
        raise SpecError(where, f"{len(text):,} characters; a spec may be at most {MAX_SPEC_BYTES:,}")
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = " ".join(p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
        field = getattr(exc, "field", None)
        if field:  # a value the loader refused, where it sits: the field first, like any other error
            raise SpecError(field, f"{problem} ({where}, line {mark.line + 1})" if mark else problem) from None
        raise SpecError(where, f"not valid YAML{at}: {problem or str(exc).splitlines()[0]}") from None
    if data is None:
        raise SpecError(where, "is empty")
    return parse_spec(data, origin_name=origin_name, base_dir=base_dir, files_within=files_within)


def load_spec(path: str | Path) -> JobSpec:
    """Reads and validates a YAML spec file; raises SpecError with a one-line reason."""
    path = Path(path)
    try:
        exists = path.exists()
    except OSError as exc:  # a name the file system refuses (too long, ...): stat() itself raises
        raise SpecError(path.name or "SPEC.yaml", f"cannot read {path}: {exc.strerror or exc}") from None
    if not exists:
        raise SpecError(path.name or "SPEC.yaml", f"no such spec file: {path}")
    text = read_text(path, path.name or "SPEC.yaml", "spec", MAX_SPEC_BYTES)
    return parse_spec_text(text, origin_name=path.name, base_dir=path.parent)

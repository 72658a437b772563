"""The job spec: a YAML file a performance engineer writes, loaded into typed models.

Every error names the field (a dotted path into the YAML) and the reason, as one
line, so `optico tune` can print it and exit 2 before touching the pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from optico.launchers.program import ProgramSpec
from optico.perfmodel.constants import load_constants
from optico.rules import violations
from optico.search_space import SearchSpace
from optico.strategy import Strategy, canonical_field, strategy_from_mapping
from optico.workload import PRESETS, Cluster, Framework, ModelArch, Workload

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


class SpecError(ValueError):
    """A spec that cannot run: `field` is the dotted path, `reason` says why."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)


class Budget(BaseModel):
    """When a job stops, whichever comes first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_trials: PositiveInt = Field(20, description="Validation runs at most (the paper's T_max).")
    gpu_hours: float | None = Field(None, gt=0, description="GPU-hours the runs may spend.")
    patience: PositiveInt | None = Field(None, description="Stop after this many trials without a better MFU.")
    target_mfu: float | None = Field(None, gt=0, le=1, description="Stop once a trial reaches this MFU.")
    converge_tol: float | None = Field(0.005, ge=0, lt=1, description="Stop once no untried configuration is "
                                       "predicted to beat the best measured MFU by more than this fraction "
                                       "(the model, corrected by the job's measurements); None = never.")
    min_trials: PositiveInt = Field(8, description="Trials before convergence may stop the job.")


class LauncherSpec(BaseModel):
    """Where validation runs happen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["sim", "replay", "local", "ray"] = "sim"
    seed: int | None = Field(None, description="Simulator noise seed; None = the job's seed.")
    noise: float = Field(0.01, ge=0, le=0.5, description="Simulator: relative step-time noise (std dev).")
    hang_rate: float = Field(0.02, ge=0, le=1, description="Simulator: chance a run hangs (NCCL watchdog).")
    infra_rate: float = Field(0.0, ge=0, le=1, description="Simulator: chance a run dies of a node fault.")
    delay_s: float = Field(0.0, ge=0, le=3600, description="Simulator: real seconds each run takes (to watch "
                                                            "progress, or interrupt a run).")
    data: str | None = Field(None, description="Replay: the CSV of measured runs.")
    timeout_s: float = Field(3600, gt=0, description="Wall-clock limit of one run.")
    hang_s: float = Field(600, gt=0, description="A run printing nothing for this long is hung.")
    address: str | None = Field(None, description="Ray: cluster address (auto, ray://host:port, local); None = "
                                                  "an existing cluster (RAY_ADDRESS, `ray start`), else a new "
                                                  "local one.")
    program: ProgramSpec | None = Field(None, description="local/ray: what torchrun runs: {kind: megatron-core} "
                                                          "(default) or {kind: megatron-lm, command: [...]}.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment for the training processes.")
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


# -- loading ------------------------------------------------------------------------

def _loc(prefix: str, err: dict[str, Any]) -> str:
    parts = [prefix] + [str(p) for p in err["loc"] if not str(p).startswith("function-")]
    return ".".join(p for p in parts if p)


def _validated(cls: type[BaseModel], data: Any, where: str) -> Any:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(_loc(where, err), msg) from None


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(where, f"must be a mapping, got {type(data).__name__}")
    return data


def _model(raw: Any) -> ModelArch:
    where = "workload.model"
    if isinstance(raw, str):
        if raw not in PRESETS:
            raise SpecError(where, f"unknown preset {raw!r}; known: {', '.join(sorted(PRESETS))}")
        return PRESETS[raw]
    data = dict(_mapping(raw, where))
    preset = data.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise SpecError(f"{where}.preset", f"unknown preset {preset!r}; known: {', '.join(sorted(PRESETS))}")
        base = PRESETS[preset].model_dump()
        base.update(data)
        data = base
    return _validated(ModelArch, data, where)


def _workload(raw: Any) -> Workload:
    data = dict(_mapping(raw, "workload"))
    if "model" not in data:
        raise SpecError("workload.model", "missing (a preset name or an architecture mapping)")
    if "cluster" not in data:
        raise SpecError("workload.cluster", "missing (gpu, gpus_per_node, nodes)")
    model = _model(data.pop("model"))
    cluster = _validated(Cluster, _mapping(data.pop("cluster"), "workload.cluster"), "workload.cluster")
    framework = _validated(Framework, _mapping(data.pop("framework", None), "workload.framework"),
                           "workload.framework")
    return _validated(Workload, {**data, "model": model, "cluster": cluster, "framework": framework}, "workload")


def _search_space(raw: Any, w: Workload) -> SearchSpace:
    data = _mapping(raw, "search_space")
    unknown = set(data) - {"tunables", "fixed"}
    if unknown:
        raise SpecError(f"search_space.{sorted(unknown)[0]}", "unknown field (use tunables and fixed)")
    tunables = data.get("tunables")
    if tunables is not None and not isinstance(tunables, (list, dict)):
        raise SpecError("search_space.tunables", "must be a list of names or a mapping name -> values")
    try:
        for name in (tunables or []):
            canonical_field(str(name))
        for name in _mapping(data.get("fixed"), "search_space.fixed"):
            canonical_field(str(name))
    except KeyError as exc:
        raise SpecError("search_space.tunables" if "fixed" not in str(exc) else "search_space.fixed",
                        exc.args[0]) from None
    try:
        return SearchSpace.build(w, tunables, data.get("fixed"))
    except (KeyError, ValueError) as exc:
        text = exc.args[0] if exc.args else str(exc)
        field, _, reason = text.partition(": ")
        if field.startswith("search_space"):
            raise SpecError(field, reason) from None
        raise SpecError("search_space", text) from None


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
    for s in space.enumerate(w):
        return
    raise SpecError("search_space", f"no valid strategy in the space; e.g. {space.base().short()}: "
                                    f"{'; '.join(map(str, violations(w, space.base())))}")


def _baseline(raw: Any, w: Workload, space: SearchSpace) -> Strategy | None:
    if raw is None:
        return None
    data = _mapping(raw, "baseline")
    try:
        given = {canonical_field(str(k)): v for k, v in data.items()}
    except KeyError as exc:
        raise SpecError("baseline", exc.args[0]) from None
    merged = {**space.fixed, **given}
    try:
        strategy = strategy_from_mapping(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(_loc("baseline", err), err["msg"]) from None
    broken = violations(w, strategy)
    if broken:
        raise SpecError(f"baseline.{broken[0].params[0]}", str(broken[0]))
    outside = space.outside(strategy)
    if outside:
        raise SpecError("baseline", f"outside the search space: {outside[0]}")
    return strategy


def parse_spec(data: Any, origin: Path | None = None) -> JobSpec:
    """A JobSpec from parsed YAML; raises SpecError naming the field."""
    data = _mapping(data, "")
    known = set(JobSpec.model_fields)
    for key in data:
        if key not in known:
            raise SpecError(str(key), f"unknown field; known: {', '.join(sorted(known))}")
    w = _workload(data.get("workload"))
    space = _search_space(data.get("search_space"), w)
    _check_feasible(w, space)
    baseline = _baseline(data.get("baseline"), w, space)
    budget = _validated(Budget, _mapping(data.get("budget"), "budget"), "budget")
    launcher = _validated(LauncherSpec, _mapping(data.get("launcher"), "launcher"), "launcher")
    if launcher.kind == "replay":
        if not launcher.data:
            raise SpecError("launcher.data", "the replay launcher needs the CSV of measured runs")
        path = Path(launcher.data)
        if not path.is_absolute() and origin is not None:
            path = (origin.parent / path).resolve()
        if not path.is_file():
            raise SpecError("launcher.data", f"no such file: {path}")
        launcher = launcher.model_copy(update={"data": str(path)})
    reasoner_raw = data.get("reasoner")
    if isinstance(reasoner_raw, str):
        reasoner_raw = {"analysis": reasoner_raw, "generation": reasoner_raw, "failure": reasoner_raw}
    elif isinstance(reasoner_raw, dict) and isinstance(reasoner_raw.get("all"), str):
        # {all: llm-led, ablate: [cot]}: one kind for every agent, with options beside it
        kind = reasoner_raw["all"]
        reasoner_raw = {"analysis": kind, "generation": kind, "failure": kind,
                        **{k: v for k, v in reasoner_raw.items() if k != "all"}}
    reasoner = _validated(ReasonerSpec, _mapping(reasoner_raw, "reasoner"), "reasoner")
    name = data.get("name") or (origin.stem if origin else "job")
    seed = data.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SpecError("seed", f"must be an integer, got {seed!r}")
    calibration = data.get("calibration")
    if calibration is not None:
        path = Path(str(calibration))
        if not path.is_absolute() and origin is not None:
            path = (origin.parent / path).resolve()
        try:
            load_constants(path)
        except (OSError, ValueError) as exc:
            raise SpecError("calibration", str(exc).splitlines()[0]) from None
        calibration = str(path)
    return JobSpec(name=str(name), workload=w, search_space=space, baseline=baseline, budget=budget,
                   launcher=launcher, reasoner=reasoner, seed=seed, calibration=calibration)


def load_spec(path: str | Path) -> JobSpec:
    """Reads and validates a YAML spec; raises SpecError with a one-line reason."""
    path = Path(path)
    if not path.is_file():
        raise SpecError("", f"no such spec file: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError("", f"{path.name} is not valid YAML{where}: {problem}") from None
    return parse_spec(data, origin=path)

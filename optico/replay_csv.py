"""The replay CSV format (DESIGN.md, "Replay CSV format") read into typed rows.

One row is one measured run. The replay launcher answers from these rows, the
performance model is evaluated against them, and the tuner benchmark replays them as
landscapes, so all three must read a cell the same way. This module is that one reading:
what an empty cell means (`ReplayDefaults`), how the free-text cells are parsed, which rows
cannot be used and why (`ReplayRow.skip_reason`), and how the sources' different
throughput figures become one comparable MFU (`measured_mfu`).

Rules that are decisions rather than parsing, in one place:

- Gated MLP (SwiGLU): a row is SwiGLU when its model name or notes say "swiglu"; else it
  is not when ffn_hidden_size == 4·hidden_size (GPT-3's GeLU MLP, Megatron-LM's default
  width) or when the model name is a GPT-3-style or Nemotron name ("GPT", "gpt3",
  "MT-NLG", "Nemotron"; GeLU / squared-ReLU MLPs) but not GPT-OSS (gated); every other
  row is SwiGLU (Llama, Qwen, Mixtral, DeepSeek: all gated). A row that matches a preset
  takes the preset's flag instead.
- Tied embeddings: Megatron-LM ties them unless --untie-embeddings-and-output-weights.
  Notes that carry the run's Megatron arguments ("args: name=value, ...", as the
  Megatron-LM CI transcription does) decide; else a matching preset decides; else
  GPT-3-style names ("GPT" but not GPT-OSS, "MT-NLG") are tied (the papers' runs used
  Megatron's default) and the rest untied (Llama-style, ModelArch's default).
- Hardware FLOPs (`counts_recompute`): the data README says Narayanan et al. 2021 Table 1
  and DLPerf count the recompute forward pass. A row counts it when its source or notes
  say "recompute forward pass", "HFU-like" or "hardware FLOPs", or its source is DLPerf or
  Narayanan et al. 2021 (arXiv 2104.04473). "MFU/HFU columns ... not transcribed" does not
  match: it names the columns, it does not describe the figures.
- gpus_per_node: 8 (DGX/HGX A100, H100, H200, B200, B300 and the V100 servers), except
  GB200/GB300 where a "node" is the 72-GPU NVL72 rack: what gpus_per_node decides in
  OptiCo is which traffic stays on NVLink, and in an NVL72 rack all 72 GPUs share one
  NVLink fabric (a compute tray has 4 GPUs, but the tray is not the NVLink boundary).
  `Cluster.num_gpus` is the job's world size, which may be less than one node.
- Precision: anything naming fp8 (FP8, MXFP8, FP8-CS, FP8-MX, FP8 blockwise, "fp8 (hybrid)
  over bf16") trains in fp8; else bf16, else fp16 ("fp16/mixed"). fp4 (NVFP4) and fp32 are
  not modelled: the row is skipped.
- Layout: the dp cell is derived by the transcriber, so it is checked against
  num_gpus / (TP·PP·CP), never used. A 'true' SP cell at TP 1 reads as no SP (Megatron-LM
  turns it off there). The row must then pass `optico.rules.violations`; each broken rule is
  quoted in the skip reason.
- Notes that carry "args: name=value, ..." add what they state: kv-channels, untied
  embeddings, shared-expert size, overlap/TP-comm-overlap/grouped-GEMM/cross-entropy-fusion
  flags, dispatcher, uneven first/last pipeline stages.
- Skipped, with the reason: a required input missing (named), an unknown GPU, an unmodelled
  precision, MLA or linear-attention/Mamba architectures, LoRA fine-tuning, Megatron-FSDP,
  an MoE row without topk, a layout inconsistent with num_gpus or rejected by the rules.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from optico.gpus import GPUS, Precision, normalize_gpu_name
from optico.perfmodel.flops import flops_per_iteration
from optico.rules import violations
from optico.strategy import Strategy
from optico.workload import PRESETS, Cluster, ModelArch, Workload

Result = Literal["ok", "oom", "error"]

# The columns of DESIGN.md's format, in its order. A file may have more; it must have these.
COLUMNS: tuple[str, ...] = (
    "model", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
    "vocab_size", "seq_length", "num_experts", "topk", "gpu", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
    "mbs", "gbs", "recompute", "precision", "sequence_parallel", "distributed_optimizer", "result",
    "tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib", "source", "notes",
)

# Without these a row cannot be turned into a workload and a strategy: there is no honest default.
REQUIRED: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "vocab_size", "seq_length", "gpu", "num_gpus",
    "tp", "pp", "mbs", "gbs",
)

_INT_CELLS: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
    "seq_length", "num_experts", "topk", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs",
)

MEASURED: tuple[str, ...] = ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib")

# GPUs whose "node" is an NVL72 rack (see the module docstring).
NVL72_GPUS = frozenset({"gb200", "gb300"})

# Full recompute runs each layer's forward twice: forward + recompute + backward (2x forward)
# = 4 forward-equivalents where model FLOPs count 3. Hardware-FLOP figures are 4/3 of model ones.
FULL_RECOMPUTE_HFU_RATIO = 4.0 / 3.0


class ReplayDefaults(BaseModel):
    """What an EMPTY cell means. An empty cell is a value the source does not give
    (data README); these are the values Megatron-LM or the published recipes use then.

    Fixed rules that are not settings: empty num_query_groups = num_attention_heads
    (multi-head attention, Megatron-LM's default); empty num_experts = dense model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision: Precision = Field("bf16", description="The training precision of every recent recipe; "
                                                     "the H100 README table's MFU only fits the BF16 peak.")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="Megatron-LM's default: no activation recompute.")
    sequence_parallel: bool = Field(
        False, description="Megatron-LM's default. Exception, not a setting: an MoE row with EP > 1 and TP > 1 "
                           "ran, and Megatron-LM refuses that layout without SP, so SP was on. (A 'true' cell "
                           "at TP 1 reads as False: Megatron-LM turns SP off there.)")
    distributed_optimizer: bool = Field(
        True, description="All published performance recipes in shared/data run the distributed optimizer; "
                          "the OptiCo table's memory figures only fit with it.")
    recipe_flags: bool = Field(
        True, description="Rows from NeMo, Megatron-Bridge and DGX Cloud recipes (named in their source) take "
                          "those recipes' settings for knobs the table leaves out: sequence parallel with TP > 1, "
                          "overlapped grad reduce and param gather, gradients reduced in bf16 "
                          "(their performance scripts set grad_reduce_in_fp32 = False).")
    ffn_hidden_ratio: PositiveInt = Field(
        4, description="ffn_hidden_size = ratio x hidden_size: Megatron-LM's default without --ffn-hidden-size.")
    context_parallel_size: PositiveInt = 1
    expert_model_parallel_size: PositiveInt = 1
    virtual_pipeline_model_parallel_size: PositiveInt = Field(1, description="Chunks per pipeline rank; 1 = none.")


class ReplayRow(BaseModel):
    """One measured run, parsed.

    `workload` and `strategy` are filled whenever the cells allow, even on a skipped row, so a
    report can show what the row was; only rows whose `skip_reason` is None may be evaluated or
    replayed. Measured values are as the source gives them (see `counts_recompute`)."""

    model_config = ConfigDict(frozen=True)

    file: str = Field(description="The CSV's file name.")
    line: int = Field(description="1-based line of the row in the file (the header is line 1).")
    model_name: str
    source: str = ""
    notes: str = ""
    workload: Workload | None = None
    strategy: Strategy | None = None
    result: Result
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    step_time_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    mem_max_gib: float | None = None
    counts_recompute: bool = Field(False, description="tflops_per_gpu and mfu count the recompute forward pass "
                                                      "(hardware FLOPs), not model FLOPs.")
    skip_reason: str | None = Field(None, description="Why the row cannot be evaluated or replayed; None = usable.")

    @property
    def usable(self) -> bool:
        return self.skip_reason is None

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


# -- cells -------------------------------------------------------------------------------------

def _int(cells: dict[str, str], name: str, problems: list[str]) -> int | None:
    text = cells.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        problems.append(f"{name} {text!r} is not a number")
        return None
    if value != int(value) or value < 1:
        problems.append(f"{name} {text!r} is not a positive integer")
        return None
    return int(value)


def _float(cells: dict[str, str], name: str, problems: list[str]) -> float | None:
    text = cells.get(name, "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        problems.append(f"{name} {text!r} is not a number")
        return None


def _bool(text: str, name: str, default: bool, problems: list[str]) -> bool:
    value = text.strip().lower()
    if not value:
        return default
    if value in ("true", "yes", "1", "on"):
        return True
    if value in ("false", "no", "0", "off"):
        return False
    problems.append(f"{name} {text!r} is not true/false")
    return default


def parse_precision(text: str, default: Precision) -> Precision | None:
    """'BF16' -> bf16, 'fp16/mixed' -> fp16, 'MXFP8' / 'FP8-CS' / 'fp8 (hybrid) over bf16' -> fp8;
    None for a precision we do not model (NVFP4, any fp4, fp32/tf32)."""
    value = text.strip().lower()
    if not value:
        return default
    if "fp4" in value or "int4" in value:
        return None
    if "fp8" in value:  # before bf16: "fp8 (hybrid, ...) over bf16" trains in fp8
        return "fp8"
    if "bf16" in value:
        return "bf16"
    if "fp16" in value:
        return "fp16"
    return None


def parse_recompute(text: str, default: str) -> tuple[str | None, str | None, int | None] | None:
    """(granularity, method, num_layers): 'full' -> full/uniform/1 (Megatron's --recompute-method
    uniform with one layer per group), 'full (method=block, num_layers=4)' as written, 'selective'
    (any modules), 'none'. None when the text is none of these."""
    value = text.strip().lower() or default
    if value in ("none", "no", "off", "false"):
        return None, None, None
    if value.startswith("selective"):
        return "selective", None, None
    if value.startswith("full"):
        method = re.search(r"method\s*=\s*(uniform|block)", value)
        layers = re.search(r"num_layers\s*=\s*(\d+)", value)
        return "full", method.group(1) if method else "uniform", int(layers.group(1)) if layers else 1
    return None


def _megatron_args(notes: str) -> dict[str, str] | None:
    """The 'args: name=value, ...' list some notes carry (the run's non-default Megatron-LM
    arguments); None when the notes carry none."""
    found = re.search(r"\bargs:\s*(.*)", notes)
    if not found:
        return None
    return dict(re.findall(r"([a-z][a-z0-9-]*)=([^,;\s]+)", found.group(1)))


def _is_true(text: str | None) -> bool:
    return (text or "").lower() == "true"


_GPT3_STYLE = re.compile(r"gpt(?![-_ ]?oss)|mt-nlg", re.IGNORECASE)  # GPT-OSS is a gated MoE


def _gpt3_style(name: str) -> bool:
    """GPT-3-family names (Megatron's GPT, MT-NLG): GeLU MLP, tied embeddings."""
    return bool(_GPT3_STYLE.search(name))


def _ungated_name(name: str) -> bool:
    """GPT-3-family and Nemotron names: ungated (GeLU / squared-ReLU) MLPs."""
    return _gpt3_style(name) or "nemotron" in name.lower()


def counts_recompute_flops(source: str, notes: str) -> bool:
    """The rule in the module docstring: does this row's TFLOP/s count the recompute pass?"""
    text = f"{source} {notes}".lower()
    return any(k in text for k in ("recompute forward pass", "hfu-like", "hardware flops", "dlperf",
                                   "narayanan et al. 2021", "2104.04473"))


def _unmodelled_architecture(name: str, notes: str) -> str | None:
    text = f"{name} {notes}"
    if re.search(r"\bMLA\b", text) or re.search(r"multi[- ]latent", text, re.IGNORECASE):
        return "MLA (multi-latent attention) is not modelled"
    if re.search(r"linear[- ]attention|mamba", text, re.IGNORECASE):
        return "linear-attention / Mamba layers are not modelled"
    if re.search(r"\blora\b", text, re.IGNORECASE):
        return "LoRA fine-tuning (frozen base weights) is not modelled"
    return None


def _dims(m: ModelArch) -> tuple[Any, ...]:
    """What a CSV row can say about an architecture: the keys for preset matching and `matches`."""
    topk = m.moe_router_topk if m.is_moe else None
    ffn = m.expert_ffn if m.is_moe else m.ffn_hidden_size
    return (m.num_layers, m.hidden_size, m.num_attention_heads, m.groups, ffn, m.vocab_size,
            m.num_experts if m.is_moe else None, topk)


def matching_preset(m: ModelArch) -> ModelArch | None:
    """The preset with the same dimensions as `m` (e.g. Llama3-8B rows -> llama3-8b), if any."""
    for preset in PRESETS.values():
        if _dims(preset) == _dims(m):
            return preset
    return None


# -- rows ----------------------------------------------------------------------------------------

def _build_model(cells: dict[str, str], ints: dict[str, int | None], args: dict[str, str] | None,
                 defaults: ReplayDefaults) -> ModelArch:
    name = cells.get("model", "").strip() or "custom"
    hidden, heads = ints["hidden_size"], ints["num_attention_heads"]
    ffn = ints["ffn_hidden_size"] or defaults.ffn_hidden_ratio * hidden
    groups = ints["num_query_groups"]
    experts = ints["num_experts"] if (ints["num_experts"] or 1) > 1 else None
    text = f"{name} {cells.get('notes', '')}"
    if "swiglu" in text.lower():
        swiglu = True
    else:
        swiglu = not (ffn == 4 * hidden or _ungated_name(name))
    explicit: dict[str, Any] = {}  # facts the run's own arguments state; they beat presets and rules
    if args is not None:
        explicit["untie_embeddings_and_output_weights"] = _is_true(args.get("untie-embeddings-and-output-weights"))
        for flag, field in (("kv-channels", "kv_channels"),
                            ("moe-shared-expert-intermediate-size", "moe_shared_expert_intermediate_size")):
            if args.get(flag, "").isdigit():
                explicit[field] = int(args[flag])
    data: dict[str, Any] = dict(
        name=name, num_layers=ints["num_layers"], hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=groups if groups and groups != heads else None, ffn_hidden_size=ffn,
        vocab_size=ints["vocab_size"], swiglu=swiglu, num_experts=experts,
        moe_router_topk=ints["topk"] if experts else 2,
        untie_embeddings_and_output_weights=not _gpt3_style(name))
    arch = ModelArch.model_validate({**data, **explicit})
    preset = matching_preset(arch)
    if preset is not None:
        return ModelArch.model_validate({**preset.model_dump(), **explicit})
    return arch


def _build_strategy(cells: dict[str, str], ints: dict[str, int | None], args: dict[str, str] | None,
                    is_moe: bool, defaults: ReplayDefaults, problems: list[str]) -> Strategy | None:
    recompute = parse_recompute(cells.get("recompute", ""), defaults.recompute)
    if recompute is None:
        problems.append(f"recompute {cells.get('recompute')!r} is not none/selective/full")
        return None
    granularity, method, layers = recompute
    tp, ep = ints["tp"], ints["ep"] or defaults.expert_model_parallel_size
    recipe = defaults.recipe_flags and _from_recipe(cells.get("source", ""))
    sp_default = defaults.sequence_parallel or (is_moe and ep > 1 and tp > 1) or (recipe and tp > 1)
    dist_opt_cell = cells.get("distributed_optimizer", "").strip().lower()
    if "fsdp" in dist_opt_cell:
        problems.append(f"distributed_optimizer {dist_opt_cell!r}: Megatron-FSDP is not a Strategy option")
        return None
    data: dict[str, Any] = dict(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=ints["pp"],
        context_parallel_size=ints["cp"] or defaults.context_parallel_size,
        expert_model_parallel_size=ep,
        virtual_pipeline_model_parallel_size=ints["vpp"] or defaults.virtual_pipeline_model_parallel_size,
        micro_batch_size=ints["mbs"],
        sequence_parallel=_bool(cells.get("sequence_parallel", ""), "sequence_parallel", sp_default, problems),
        recompute_granularity=granularity, recompute_method=method, recompute_num_layers=layers,
        use_distributed_optimizer=_bool(dist_opt_cell, "distributed_optimizer",
                                        defaults.distributed_optimizer, problems),
    )
    if recipe:
        data["overlap_grad_reduce"] = data["overlap_param_gather"] = data["use_distributed_optimizer"]
    if args:
        for flag in ("overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap", "moe-grouped-gemm",
                     "cross-entropy-loss-fusion"):
            if flag in args:
                data[flag.replace("-", "_")] = _is_true(args[flag])
        for flag in ("decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers"):
            if args.get(flag, "").isdigit():
                data[flag.replace("-", "_")] = int(args[flag])
        if args.get("moe-token-dispatcher-type") in ("allgather", "alltoall", "flex"):
            data["moe_token_dispatcher_type"] = args["moe-token-dispatcher-type"]
    if tp == 1:
        # Megatron-LM's validate_args turns SP off with a warning at TP 1, so such a run had none.
        data["sequence_parallel"] = False
    return Strategy.model_validate(data).normalized()


def _from_recipe(source: str) -> bool:
    """NeMo, Megatron-Bridge and DGX Cloud benchmark recipes (their performance configurations)."""
    return bool(re.search(r"NeMo|Megatron-Bridge|dgxc-benchmarking", source))


def _cluster(gpu_key: str, num_gpus: int) -> Cluster:
    per_node = 72 if gpu_key in NVL72_GPUS else 8
    return Cluster(gpu=gpu_key, gpus_per_node=per_node, nodes=-(-num_gpus // per_node), num_gpus=num_gpus)


def parse_row(cells: dict[str, str], file: str, line: int, defaults: ReplayDefaults) -> ReplayRow:
    """One CSV record -> ReplayRow. Raises ValueError (naming file:line) only for a result cell
    that is not ok/oom/error; every other problem becomes the row's skip_reason."""
    where = f"{file}:{line}"
    result = cells.get("result", "").strip().lower()
    if result not in ("ok", "oom", "error"):
        raise ValueError(f"{where}: result {cells.get('result')!r} must be ok, oom or error")
    name, notes, source = (cells.get(k, "").strip() for k in ("model", "notes", "source"))
    problems: list[str] = []  # why the row cannot be used, in the order found
    ints = {k: _int(cells, k, problems) for k in _INT_CELLS}
    blocking = bool(problems)  # a bad integer cell: no workload or strategy can be built
    missing = [k for k in REQUIRED if not cells.get(k, "").strip()]
    if missing:
        problems.insert(0, f"missing required input(s): {', '.join(missing)}")
    if (ints["num_experts"] or 1) > 1 and not ints["topk"]:
        problems.append("missing topk for an MoE row")
        blocking = True
    measured = {k: _float(cells, k, problems) for k in MEASURED}
    gpu_key = normalize_gpu_name(cells["gpu"]) if cells.get("gpu", "").strip() else None
    if gpu_key is not None and gpu_key not in GPUS:
        problems.append(f"unknown GPU {cells['gpu']!r}")
    precision = parse_precision(cells.get("precision", ""), defaults.precision)
    if precision is None:
        problems.append(f"precision {cells['precision']!r} is not modelled (we model bf16, fp16, fp8)")
    arch_reason = _unmodelled_architecture(name, notes)
    if arch_reason:
        problems.append(arch_reason)

    workload: Workload | None = None
    strategy: Strategy | None = None
    if not missing and not blocking:
        args = _megatron_args(notes)
        try:
            model = _build_model(cells, ints, args, defaults)
            strategy = _build_strategy(cells, ints, args, model.is_moe, defaults, problems)
            if precision is not None and gpu_key in GPUS:
                recipe = defaults.recipe_flags and _from_recipe(source)
                workload = Workload(model=model, seq_length=ints["seq_length"], global_batch_size=ints["gbs"],
                                    precision=precision, cluster=_cluster(gpu_key, ints["num_gpus"]),
                                    grad_reduce_in_fp32=False if recipe else None)
        except (ValidationError, ValueError) as err:
            problems.append(f"inconsistent architecture or layout: {_first_error(err)}")
    if workload is not None and strategy is not None:
        problems += _layout_problems(workload, strategy, ints["dp"])

    return ReplayRow(file=file, line=line, model_name=name, source=source, notes=notes, workload=workload,
                     strategy=strategy, result=result, counts_recompute=counts_recompute_flops(source, notes),
                     skip_reason="; ".join(problems) or None, **measured)


def _first_error(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        return str(first.get("ctx", {}).get("error") or first["msg"])
    return str(err)


def _layout_problems(w: Workload, s: Strategy, dp_cell: int | None) -> list[str]:
    """The dp cell is derived by the transcriber: check it, never use it. Then Megatron-LM's checks."""
    out: list[str] = []
    world, mp = w.world_size, s.model_parallel_size
    if dp_cell is not None and world % mp == 0 and dp_cell != world // mp:
        out.append(f"layout inconsistent: dp {dp_cell} but num_gpus/(TP·PP·CP) = {world}/({s.tp}·{s.pp}·{s.cp})"
                   f" = {world // mp}")
    out += [f"rejected by optico.rules: {v.message}" for v in violations(w, s)]
    return out


def read_replay_csv(path: str | Path, defaults: ReplayDefaults | None = None) -> list[ReplayRow]:
    """Every row of a replay CSV, skipped ones included (see `ReplayRow.skip_reason`).

    Raises ValueError naming the file and the missing columns when the header lacks a column of
    the DESIGN.md format (extra columns are fine), and for a result cell not ok/oom/error."""
    path = Path(path)
    defaults = defaults or ReplayDefaults()
    rows: list[ReplayRow] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        absent = [c for c in COLUMNS if c not in header]
        if absent:
            raise ValueError(f"{path}: missing column(s) {', '.join(absent)} of the replay CSV format (DESIGN.md)")
        start = reader.line_num + 1
        for cells in reader:
            rows.append(parse_row({k: v or "" for k, v in cells.items() if k is not None}, path.name, start,
                                  defaults))
            start = reader.line_num + 1
    return rows


# -- what a row measured -------------------------------------------------------------------------

def peak_tflops(row: ReplayRow) -> float | None:
    """Dense peak TFLOP/s of the row's GPU at the row's precision (the catalog's)."""
    return row.workload.peak_tflops if row.workload else None


def tuned_throughput(row: ReplayRow) -> bool:
    """False for rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs
    in deterministic mode, per the data README): their memory and fit/OOM outcome still count."""
    return "not tuned" not in row.notes.lower()


def measured_mfu(row: ReplayRow) -> float | None:
    """MFU on Megatron-LM's model FLOPs (optico.perfmodel.flops), comparable across sources.

    - From step_time_s when given: flops_per_iteration / (step_time · world · peak). This is the
      only figure computed with our own FLOPs formula, so it is preferred.
    - Else the mfu column, else tflops_per_gpu / peak. When the row counts the recompute forward
      pass (`counts_recompute`) and recomputes fully, these are hardware FLOPs: forward +
      recompute + backward = 4 forward-equivalents against the model's 3, so divide by 4/3.
      (Approximate: Narayanan's Eq. 3 does not recompute the logits, so its true ratio is a
      little below 4/3 for small models.)
    None for rows that did not run (oom/error), skipped rows and rows with no throughput figure.
    """
    if row.result != "ok" or not row.usable or row.workload is None or row.strategy is None:
        return None
    w, s = row.workload, row.strategy
    peak = w.peak_tflops
    if row.step_time_s:
        return flops_per_iteration(w, s.tp) / (row.step_time_s * w.world_size * peak * 1e12)
    hfu = FULL_RECOMPUTE_HFU_RATIO if row.counts_recompute and s.recompute == "full" else 1.0
    if row.mfu is not None:
        return row.mfu / hfu
    if row.tflops_per_gpu is not None:
        return row.tflops_per_gpu / peak / hfu
    return None


def matches(row: ReplayRow, workload: Workload) -> bool:
    """Does `row` measure `workload`? Compares only what a CSV row can say: layers, hidden, heads,
    query groups, (per-expert) FFN, vocabulary, experts, top-k, sequence, global batch, precision,
    GPU and world size. Names, kv_channels, SwiGLU and tied embeddings are not compared."""
    w = row.workload
    if w is None:
        return False
    return (_dims(w.model) == _dims(workload.model)
            and w.seq_length == workload.seq_length
            and w.global_batch_size == workload.global_batch_size
            and w.precision == workload.precision
            and w.cluster.gpu == workload.cluster.gpu
            and w.world_size == workload.world_size)

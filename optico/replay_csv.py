"""The replay CSV format (DESIGN.md, "Replay CSV format") read into typed rows — tolerantly.

One row is one measured run. The replay launcher answers from these rows, the
performance model is evaluated against them, and the tuner benchmark replays them as
landscapes, so all three must read a cell the same way. This module is that one reading:
headers and cells as sources write them (`optico.replay_cells`: "TP", "Micro Batch Size",
"zero-1 (deepspeed)", "true (zero1)", "none stated", "45 %", "850 ms"), what an empty cell
means (`ReplayDefaults`), what the row still tells when a cell is unknown (`ReplayRow.unknown`,
`variants`), which rows cannot be used at all and why (`ReplayRow.skip_reason`), a report per
file (`FileReport`), and how the sources' different throughput figures become one comparable
MFU (`measured_mfu`). A bad row is skipped with its file:line reason, never fatal — unless
`strict`, which raises `ReplayError` at the first one.

Rules that are decisions rather than parsing, in one place:

- Unknown, not guessed: a cell the source does not give and for which neither Megatron-LM
  nor the source has a default (micro-batch, TP, PP, number of GPUs, global batch, vocabulary,
  sequence length) is kept as unknown with its plausible values; the row is read, and each
  figure it could inform (fit/OOM, memory, MFU) is scored only where those values agree on it
  (`optico.perfmodel.evaluate`). It is never replayed (`ReplayRow.usable` is False).
- Derived, not guessed: num_gpus = dp·TP·PP·CP when the dp cell is given; mbs =
  gbs / (DP·GA) when the notes state the gradient accumulation (GA=8); ETP from the notes
  ("ETP=4"); the architecture from a preset (`optico.workload.PRESETS`) whose name the model
  name contains when the row gives no dimensions (MLA and hybrid models need one: their
  ranks and layer patterns are no column); when the layers do not divide by PP, the split
  Megatron needs (`ParallelDims.infer_split`: the embedding and loss counted in the split if
  that makes it even, as the 405B recipes do, else uneven first/last stages).
- Gated MLP (SwiGLU): the run's own arguments decide ("args: swiglu=True", as OptiCo's rows
  say); else a row is SwiGLU when its model name or notes say "swiglu" or its model name is of
  a gated family (Llama, Qwen, Mistral, Mixtral, DeepSeek, Gemma: Llama-3.2-1B's FFN is
  exactly 4·hidden); else it is not when ffn_hidden_size == 4·hidden_size (GPT-3's GeLU MLP,
  Megatron-LM's default width) or when the model name is a GPT-3-style or Nemotron name
  ("GPT", "gpt3", "MT-NLG", "Nemotron"; GeLU / squared-ReLU MLPs) but not GPT-OSS (gated);
  every other row is SwiGLU. A row that matches a preset takes the preset's flag instead.
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
- Full-attention counts (`counts_full_attention`): Megatron-LM's FLOPs formula counted the whole
  attention score matrix until core v0.12 (2025-03; halved for the causal mask since), NeMo's
  until 2025-08, and so does Narayanan et al. 2021's Eq. 3. A row whose source names such a
  version ("Megatron-Core r0.8.0", "container NeMo 24.03.01", "NeMo 25.04.rc2") or that paper
  states figures on that count; a source naming no version is taken on our (causal) count.
  A stated MFU or TFLOP/s is brought to our count by `stated_flops_ratio`; a step time needs
  nothing (it is converted with our formula).
- gpus_per_node: 8 (DGX/HGX A100, H100, H200, B200, B300 and the V100 servers), except
  GB200/GB300 where a "node" is the 72-GPU NVL72 rack: what gpus_per_node decides in
  OptiCo is which traffic stays on NVLink, and in an NVL72 rack all 72 GPUs share one
  NVLink fabric (a compute tray has 4 GPUs, but the tray is not the NVLink boundary). A job
  over several racks is read as using 64 GPUs of each (`NVL72_GPUS_USED`): the tables' power-of-two
  layouts fit 64, not 72, and their measured throughput says such groups stayed on NVLink.
  `Cluster.num_gpus` is the job's world size, which may be less than one node.
- Precision: anything naming fp8 (FP8, MXFP8, FP8-CS, FP8-MX, FP8 blockwise, "fp8 (hybrid)
  over bf16") trains in fp8; else bf16, else fp16 ("fp16/mixed"). fp4 (NVFP4) and fp32 are
  not modelled: the row is skipped.
- Layout: the dp cell is derived by the transcriber, so it is checked against
  num_gpus / (TP·PP·CP), never used otherwise. A 'true' SP cell at TP 1 reads as no SP
  (Megatron-LM turns it off there). The row must then pass `optico.rules.violations`; each
  broken rule is quoted in the skip reason. A split no first/last pair can express (Megatron's
  --pipeline-model-parallel-layout) is read with stage sizes approximated (as even as the count
  allows, as such layouts are written), and says so.
- Notes that carry "args: name=value, ..." add what they state: any knob flag of the
  registry (`optico.knobs`), kv-channels, untied embeddings, expert and shared-expert FFN
  widths. A knob flag named elsewhere in the notes ("--tp-comm-overlap") was passed, unless
  negated just before; the args list wins. A stated knob brings the switches Megatron refuses
  it without (TP comm overlap: SP) where the row leaves them empty; at TP 1 nothing that needs
  SP applies.
- Skipped, with the reason: no architecture (no dimensions and no preset), an unknown GPU,
  an unmodelled precision, MLA or Mamba layers without a preset, LoRA fine-tuning,
  Megatron-FSDP / ZeRO-2/3, an MoE row without topk, no result and no measurement, a layout
  inconsistent with num_gpus or rejected by the rules.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from optico.errors import SpecError, loc_fields
from optico.flops import (
    core_attention_flops_per_token,
    flops_per_iteration,
    flops_per_token,
    logits_flops_per_token,
)
from optico.gpus import GPUS, Precision, normalize_gpu_name
from optico.input_files import read_text
from optico.knobs import BY_NAME, KNOBS
from optico.parallel import ParallelDims
from optico.replay_cells import (
    UNKNOWN,
    CellError,
    NotFinite,
    WrongNumber,
    ZeroCount,
    canonical_header,
    header_unit,
    is_unknown,
    parse_bool,
    parse_dispatcher,
    parse_distributed_optimizer,
    parse_int,
    parse_number,
    parse_result,
)
from optico.replay_cells import parse_precision as _parse_precision_cell
from optico.replay_cells import parse_recompute as _parse_recompute_cell
from optico.redact import clip
from optico.rules import violations
from optico.strategy import Strategy
from optico.workload import PRESETS, AttentionBackend, Cluster, ModelArch, Workload

Result = Literal["ok", "oom", "error"]

# The columns of DESIGN.md's format, in its order. A file may have more, or fewer: a missing
# column reads as empty cells and the file's report lists it.
COLUMNS: tuple[str, ...] = (
    "model", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
    "vocab_size", "seq_length", "num_experts", "topk", "gpu", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
    "mbs", "gbs", "recompute", "precision", "sequence_parallel", "distributed_optimizer", "result",
    "tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib", "source", "notes",
)
# Bounds on a replay CSV, wherever it is read (a spec's launcher.data, --data, --landscape).
MAX_CSV_BYTES = 8 * 1024 * 1024  # 8x the largest published table we ship
MAX_CSV_ROWS = 20_000  # 30x the largest published table; parsing a row costs ~25 us
# A cell longer than this is no table's: its row is malformed, and the cell is not parsed (a cell may
# hold 128 KiB, and reading figures out of a long run of digits or spaces grows with its square).
MAX_CELL_CHARS = 256  # the longest shipped configuration or measurement cell: 136
MAX_TEXT_CELL_CHARS = 8192  # source and notes; the longest shipped: 1,620 (a run's arguments)
_TEXT_COLUMNS = frozenset({"source", "notes"})
# Optional knob columns the registry names (etp, first_pp_layers, last_pp_layers, ...).
KNOB_COLUMNS: tuple[str, ...] = tuple(k.csv for k in KNOBS if k.csv and k.csv not in COLUMNS)
# The architecture: without these (and with no preset by name) a row says nothing we can model.
ARCHITECTURE: tuple[str, ...] = ("num_layers", "hidden_size", "num_attention_heads")
# Widths no column holds, stated in the notes' args (Megatron-LM flag -> ModelArch field): a model cut
# from a preset (fewer layers) matches none, so its row is the only place they are said.
WIDTH_ARGS: dict[str, str] = {"kv-channels": "kv_channels", "moe-ffn-hidden-size": "moe_ffn_hidden_size",
                              "moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size"}
_INT_CELLS: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
    "seq_length", "num_experts", "topk", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs",
    "etp", "first_pp_layers", "last_pp_layers",
)
# Counts a table writes as 0 for 'none' (no interleaving, no experts, no GQA): read as unknown. A 0 in
# any other count (layers, GPUs, TP, batch) is a wrong cell: nothing ran with it.
_ZERO_IS_NONE: frozenset[str] = frozenset({"num_query_groups", "num_experts", "topk", "cp", "ep", "vpp", "etp",
                                           "first_pp_layers", "last_pp_layers"})
MEASURED: tuple[str, ...] = ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib")
_MEASURED_UNITS = {"mfu": "fraction", "step_time_s": "s", "mem_max_gib": "gib"}

# Plausible values of a cell the source does not give (see the module docstring).
UNKNOWN_DOMAINS: dict[str, tuple[int, ...]] = {
    "mbs": (1, 2, 4), "tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8), "gbs_per_dp": (1, 8, 64),
    "dp": (1, 2, 4, 8, 16, 32), "vocab_size": (32000, 50304, 128256, 151936, 256000),
    "seq_length": (2048, 4096, 8192),
}

# GPUs whose "node" is an NVL72 rack (see the module docstring).
NVL72_GPUS = frozenset({"gb200", "gb300"})
# GPUs a job over several NVL72 racks is read to use per rack: 16 of the 18 trays, so groups of a power
# of two ranks stay inside one rack's NVLink. Read as all 72, a 16-, 32- or 64-rank group straddled two
# racks and was costed on the network (Megatron-Bridge's multi-rack GB200/GB300 rows: MFU MdAPE 14.1 ->
# 20.9 %).
NVL72_GPUS_USED = 64

# Full recompute runs each layer's forward twice: forward + recompute + backward (2x forward)
# = 4 forward-equivalents where model FLOPs count 3 (the output layer is not recomputed).
FULL_RECOMPUTE_HFU_RATIO = 4.0 / 3.0


class ReplayError(ValueError):
    """A file that is not a replay table, or (with `strict`) the first row that cannot be read."""


class ReplayDefaults(BaseModel):
    """What an EMPTY cell means. An empty cell is a value the source does not give
    (data README); these are the values Megatron-LM or the published recipes use then.
    Unknown markers ("none stated", "n/a", "?") read like empty cells.

    Fixed rules that are not settings: empty num_query_groups = num_attention_heads
    (multi-head attention, Megatron-LM's default); empty num_experts = dense model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    precision: Precision = Field("bf16", description="The training precision of every recent recipe; "
                                                     "the H100 README table's MFU only fits the BF16 peak. "
                                                     "fp16 on a GPU without bf16 tensor cores (V100).")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="Megatron-LM's default: no activation recompute.")
    sequence_parallel: bool = Field(
        False, description="Megatron-LM's default. Exception, not a setting: an MoE row with TP > 1 ran, and "
                           "Megatron-LM refuses that layout without SP, so SP was on. (A 'true' cell "
                           "at TP 1 reads as False: Megatron-LM turns SP off there.)")
    distributed_optimizer: bool = Field(
        True, description="All published performance recipes in shared/data run the distributed optimizer; "
                          "the OptiCo table's memory figures only fit with it.")
    recipe_flags: bool = Field(
        True, description="Rows from NeMo, Megatron-Bridge and DGX Cloud recipes (named in their source) take "
                          "those recipes' settings for knobs the table leaves out: sequence parallel with TP > 1, "
                          "overlapped grad reduce and param gather, gradients reduced in bf16 "
                          "(their performance scripts set grad_reduce_in_fp32 = False), and for MoE models "
                          "their expert settings: ETP 1 (experts folded), grouped GEMM, the all-to-all dispatcher.")
    ffn_hidden_ratio: PositiveInt = Field(
        4, description="ffn_hidden_size = ratio x hidden_size: Megatron-LM's default without --ffn-hidden-size.")
    context_parallel_size: PositiveInt = 1
    expert_model_parallel_size: PositiveInt = 1
    virtual_pipeline_model_parallel_size: PositiveInt = Field(1, description="Chunks per pipeline rank; 1 = none.")


class ReplayRow(BaseModel):
    """One measured run, parsed.

    `workload` and `strategy` are filled whenever the cells allow, even on a skipped row, so a
    report can show what the row was. A row is `read` when its `skip_reason` is None; it is
    `usable` (replayable, comparable value for value) when it is read and nothing is `unknown`.
    An unknown cell holds the first of its plausible values in `workload`/`strategy`; `variants`
    gives all of them. Measured values are as the source gives them (see `counts_recompute`)."""

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
    counts_full_attention: bool = Field(False, description="tflops_per_gpu and mfu count attention without its "
                                                           "causal mask (the whole score matrix), as older "
                                                           "formulas did; see `full_attention_count`.")
    memory_measure: Literal["", "allocated", "reserved"] = Field(
        "", description="What the memory column's header says it measured (torch's max allocated or reserved).")
    skip_reason: str | None = Field(None, description="Why the row cannot be used at all; None = read.")
    unknown: dict[str, list[Any]] = Field(default_factory=dict, description="Cells the source does not give, with "
                                                                            "their plausible values.")
    inferred: list[str] = Field(default_factory=list, description="What was derived, not read: from the notes, "
                                                                  "a preset, the layout.")
    malformed: list[str] = Field(default_factory=list, description="Cells that are wrong, not vague: a count that "
                                 "is no count ('-16', 5,000 digits), a result that is none, more fields than the "
                                 "header. The tolerant reading skips the row; a spec's own replay file is refused.")

    @property
    def read(self) -> bool:
        return self.skip_reason is None

    @property
    def usable(self) -> bool:
        """Read and complete: a replay answers from it, a value-for-value comparison uses it."""
        return self.skip_reason is None and not self.unknown

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


# -- cells (kept for callers of the old names) ---------------------------------------------------

def parse_precision(text: str, default: Precision) -> Precision | None:
    """'BF16' -> bf16, 'MXFP8' -> fp8; `default` for an empty cell; None for an unmodelled one."""
    try:
        value = _parse_precision_cell(text)
    except CellError:
        return None
    return default if value is UNKNOWN else value


def parse_recompute(text: str, default: str) -> tuple[str | None, str | None, int | None] | None:
    """(granularity, method, num_layers); `default` for an empty cell; None when unreadable."""
    try:
        value = _parse_recompute_cell(text)
        if value is UNKNOWN:
            value = _parse_recompute_cell(default)
    except CellError:
        return None
    return None if value[0] == "offload" else value


def _megatron_args(notes: str) -> dict[str, str] | None:
    """The 'args: name=value, ...' list some notes carry (the run's non-default Megatron-LM
    arguments); None when the notes carry none."""
    found = re.search(r"\bargs:\s*(.*)", notes)
    if not found:
        return None
    return dict(re.findall(r"(?<![a-z0-9-])([a-z][a-z0-9-]*)=([^,;\s]+)", found.group(1)))


# A knob flag named in free-text notes ("comm overlap flags --overlap-grad-reduce --tp-comm-overlap")
# states that the run passed it, unless a negation comes just before ("without --tp-comm-overlap").
_KNOB_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)(?![\w-])")
_NEGATED = re.compile(r"(?i)\b(?:no|not|without|disabled?|off)\W*$")


_KNOB_FLAG_NAMES = frozenset(flag[2:] for knob in KNOBS for flag in knob.flags)


def _notes_flags(notes: str) -> dict[str, str]:
    """Knob flags the notes name as passed, outside an 'args:' list, as `name=true` arguments."""
    text = notes.split("args:", 1)[0]
    return {m.group(1): "true" for m in _KNOB_FLAG.finditer(text)
            if m.group(1) in _KNOB_FLAG_NAMES and not _NEGATED.search(text[max(0, m.start() - 12):m.start()])}


def _says_oom(cell: str | None) -> bool:
    """A measurement cell that holds the run's outcome, out of memory, instead of a figure."""
    try:
        return parse_result(cell) == "oom"
    except CellError:
        return False


def _moe_columns(p: _Parse, args: dict[str, str] | None) -> dict[str, str] | None:
    """The row's Megatron arguments with what its MoE columns state (a dispatcher, grouped GEMM) over
    them; a cell neither can read makes the row wrong."""
    stated: dict[str, str] = {}
    try:
        dispatcher = parse_dispatcher(p.cells.get("moe_token_dispatcher_type"))
        grouped = parse_bool(p.cells.get("moe_grouped_gemm"))
    except CellError as err:
        p.wrong(f"MoE setting {err}")
        return args
    if dispatcher is not UNKNOWN:
        stated["moe-token-dispatcher-type"] = dispatcher
    if grouped is not UNKNOWN:
        stated["moe-grouped-gemm"] = str(grouped).lower()
    return {**(args or {}), **stated} if stated else args


def _attention_backend(args: dict[str, str] | None) -> AttentionBackend:
    """The run's attention backend as its arguments state it ('auto', Megatron-LM's default, if not)."""
    args = args or {}
    if args.get("transformer-impl") == "local":
        return "local"
    backend = args.get("attention-backend", "auto")
    return backend if backend in get_args(AttentionBackend) else "auto"


def _note_int(notes: str, name: str) -> int | None:
    """'ETP=4; GA=8' -> 4 for ETP."""
    found = re.search(rf"\b{name}\s*=\s*(\d+)\b", notes)
    return int(found.group(1)) if found else None


def _count(text: str) -> int | None:
    """An argument's value as a count: ASCII digits only ('²' is a digit to str.isdigit, not to int),
    and few enough of them to be one."""
    return int(text) if re.fullmatch(r"[0-9]{1,9}", text) else None


def _is_true(text: str | None) -> bool:
    return (text or "").lower() == "true"


_GPT3_STYLE = re.compile(r"gpt(?![-_ ]?oss)|mt-nlg", re.IGNORECASE)  # GPT-OSS is a gated MoE


def _gpt3_style(name: str) -> bool:
    """GPT-3-family names (Megatron's GPT, MT-NLG): GeLU MLP, tied embeddings."""
    return bool(_GPT3_STYLE.search(name))


_GATED_FAMILY = re.compile(r"llama|qwen|mistral|mixtral|deepseek|gemma", re.IGNORECASE)


def _gated_name(name: str) -> bool:
    """Families whose every model has a gated (SwiGLU / GeGLU) MLP, whatever its width."""
    return bool(_GATED_FAMILY.search(name))


def _ungated_name(name: str) -> bool:
    """GPT-3-family and Nemotron names: ungated (GeLU / squared-ReLU) MLPs."""
    return _gpt3_style(name) or "nemotron" in name.lower()


def counts_recompute_flops(source: str, notes: str) -> bool:
    """The rule in the module docstring: does this row's TFLOP/s count the recompute pass?"""
    text = f"{source} {notes}".lower()
    return any(k in text for k in ("recompute forward pass", "hfu-like", "hardware flops", "dlperf",
                                   "narayanan et al. 2021", "2104.04473"))


# Versions whose FLOPs formula counted the whole attention score matrix: Megatron-LM's
# num_floating_point_operations until core v0.12 (commit 8873b55d6a, 2025-03-06, halved it for the
# causal mask) and NeMo's flops_formulas until 2025-08-09 (commit 6251117f4c); NeMo 1.x containers had
# no formula, and their published TFLOP/s match the full count.
_MEGATRON_CORE_RELEASE = re.compile(r"(?i)\b(?:megatron[- _]core|mcore|core)[ _=]*[rv]?0\.(\d+)\b")
_NEMO_RELEASE = re.compile(r"(?i)\bnemo(?:[\s:]+container)?[\s:]+v?(\d{2})\.(\d{2})")


def full_attention_count(source: str, notes: str) -> bool:
    """Whether the row's stated TFLOP/s and MFU count attention without the causal mask: Narayanan et
    al. 2021's Eq. 3; Megatron-LM's own figures before core v0.12 (a source naming 'Megatron-Core
    r0.8.0'); NeMo's before its 25.09 release ('container NeMo 24.03.01', 'NeMo 25.04.rc2'). A source
    that names no version is taken at its word, on our (causal) count."""
    text = f"{source} {notes}"
    if "2104.04473" in text or re.search(r"(?i)narayanan et al\.? 2021", text):
        return True
    core = _MEGATRON_CORE_RELEASE.search(text)
    if core:
        return int(core.group(1)) < 12
    nemo = _NEMO_RELEASE.search(text)
    return bool(nemo) and (int(nemo.group(1)), int(nemo.group(2))) < (25, 9)


def _special_architecture(name: str, notes: str) -> str | None:
    """MLA / Mamba (modelled only through a preset) and LoRA (not modelled), by the row's words."""
    text = f"{name} {notes}"
    if re.search(r"\blora\b", text, re.IGNORECASE):
        return "LoRA fine-tuning (frozen base weights) is not modelled"
    if re.search(r"\bMLA\b", text) or re.search(r"multi[- ]latent", text, re.IGNORECASE):
        return "MLA (multi-latent attention)"
    if re.search(r"linear[- ]attention|mamba|hybrid", text, re.IGNORECASE):
        return "linear-attention / Mamba layers"
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


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def preset_by_name(name: str) -> ModelArch | None:
    """The preset whose name the model name contains ('Nemotron-H 56b FP8' -> nemotron-h-56b,
    'DeepSeekV3' -> deepseek-v3); the longest such name wins. Else the one preset of the name's
    family and size ('LLAMA3-405B' -> llama3.1-405b, 'Qwen3 MoE 30B' -> qwen3-30b-a3b), or of its family
    without the generation when only one preset of any generation has that size ('Nemotron-15B', as
    NeMo's tables name Nemotron-4 15B -> nemotron4-15b)."""
    squashed = _squash(name)
    found = [p for key, p in PRESETS.items() if _squash(key) and _squash(key) in squashed]
    if found:
        return max(found, key=lambda p: len(_squash(p.name)))
    sizes = set(re.findall(r"(?<![\d.])(\d+(?:\.\d+)?b)(?![a-z\d])", name.lower()))
    sized = {key: named for key in PRESETS if (named := _family_and_size(key)) and named[1] in sizes}
    alike = [PRESETS[key] for key, (family, _) in sized.items() if family in squashed]
    if not alike:  # the family without its generation ('Nemotron-15B' -> nemotron4-15b), if only one
        alike = [PRESETS[key] for key, (family, _) in sized.items() if family.rstrip("0123456789") in squashed]
    return alike[0] if len(alike) == 1 else None


_PRESET_SIZE = re.compile(r"-(\d+(?:\.\d+)?b)(?:-|$)")  # 'qwen3-30b-a3b' -> 30b; 'mixtral-8x7b': none


def _family_and_size(key: str) -> tuple[str, str] | None:
    """A preset's name before its size, without a minor version, and the size: 'llama3.1-405b' ->
    ('llama3', '405b'), 'gpt-oss-20b' -> ('gptoss', '20b'); None for a name without a size."""
    found = _PRESET_SIZE.search(key)
    return (_squash(re.sub(r"\.\d+", "", key[:found.start()])), found.group(1)) if found else None


def _sharded(cell: str) -> bool:
    """Whether an FSDP column's cell says the row ran sharded: a degree above 0, or yes."""
    if is_unknown(cell):
        return False
    try:
        return parse_number(cell) > 0
    except CellError:
        try:
            return parse_bool(cell) is True
        except CellError:
            return False


# -- rows ----------------------------------------------------------------------------------------

@dataclass
class _Parse:
    """The state of one row being read: its cells, what is unknown, what went wrong."""

    cells: dict[str, str]
    units: dict[str, str]
    defaults: ReplayDefaults
    problems: list[str] = field(default_factory=list)  # why the row cannot be used
    malformed: list[str] = field(default_factory=list)  # the problems that are a wrong cell (see ReplayRow)
    unknown: dict[str, list[Any]] = field(default_factory=dict)
    inferred: list[str] = field(default_factory=list)

    def text(self, name: str) -> str:
        return self.cells.get(name, "").strip()

    def wrong(self, problem: str) -> None:
        """A problem that is a wrong cell, not a vague one: the row is skipped, and it is malformed."""
        self.problems.append(problem)
        self.malformed.append(problem)

    def _paired(self, name: str) -> None:
        """'31737 (30341)', '1 (2)': two figures in one cell; the first is read, and the row says so."""
        cell = self.cells.get(name) or ""
        if figure_pair(cell):
            self.inferred.append(f"{name} {cell.strip()[:40]!r}: {_FIRST_OF_PAIR}")

    def integer(self, name: str) -> int | None:
        self._paired(name)
        try:
            value = parse_int(self.cells.get(name))
        except WrongNumber as err:
            self.wrong(f"{name} {err}")
            return None
        except ZeroCount as err:
            if name in _ZERO_IS_NONE:
                self.inferred.append(f"{name} {err} (read as unknown)")
            else:
                self.wrong(f"{name} {err}")
            return None
        except CellError as err:  # a word: 'auto', 'n/a'
            self.inferred.append(f"{name} {err} (read as unknown)")
            return None
        return None if value is UNKNOWN else value

    def number(self, name: str) -> float | None:
        self._paired(name)
        unit = _MEASURED_UNITS.get(name, "")
        given = self.units.get(name, "")
        try:
            value = parse_number(self.cells.get(name), unit, given)
        except NotFinite:  # '1e999', 'inf': a measurement no run had, refused as impossible, not unknown
            return math.inf
        except CellError as err:
            self.inferred.append(f"{name} {err} (read as unknown)")
            return None
        return None if value is UNKNOWN else value


def _build_model(p: _Parse, ints: dict[str, int | None], args: dict[str, str] | None) -> ModelArch | None:
    name = p.text("model") or "custom"
    special = _special_architecture(name, p.text("notes"))
    if special and "LoRA" in special:
        p.problems.append(special)
        return None
    by_name = preset_by_name(name)
    if any(ints[k] is None for k in ARCHITECTURE):
        if by_name is None:
            missing = [k for k in ARCHITECTURE if ints[k] is None]
            named = f"no preset matches the model name {name!r}" if p.text("model") else "no model name to find a " \
                                                                                         "preset by"
            p.problems.append(f"missing required input(s): {', '.join(missing)} (and {named})")
            return None
        p.inferred.append(f"architecture from preset {by_name.name}")
        return by_name
    hidden, heads = ints["hidden_size"], ints["num_attention_heads"]
    ffn = ints["ffn_hidden_size"] or p.defaults.ffn_hidden_ratio * hidden
    groups = ints["num_query_groups"]
    experts = ints["num_experts"] if (ints["num_experts"] or 1) > 1 else None
    if experts and not ints["topk"]:
        p.problems.append("missing topk for an MoE row")
        return None
    vocab = ints["vocab_size"]
    if vocab is None:
        if by_name is not None and by_name.num_layers == ints["num_layers"] and by_name.hidden_size == hidden:
            vocab = by_name.vocab_size
            p.inferred.append(f"vocab_size from preset {by_name.name}")
        else:
            vocab = UNKNOWN_DOMAINS["vocab_size"][0]
            p.unknown["vocab_size"] = list(UNKNOWN_DOMAINS["vocab_size"])
    text = f"{name} {p.text('notes')}"
    swiglu = ("swiglu" in text.lower() or _gated_name(name)) or not (ffn == 4 * hidden or _ungated_name(name))
    explicit: dict[str, Any] = {}  # facts the run's own arguments state; they beat presets and rules
    if args is not None:
        explicit["untie_embeddings_and_output_weights"] = _is_true(args.get("untie-embeddings-and-output-weights"))
        for flag, key in WIDTH_ARGS.items():
            if (number := _count(args.get(flag, ""))) is not None:
                explicit[key] = number
        if "swiglu" in args:
            explicit["swiglu"] = _is_true(args["swiglu"])
    data: dict[str, Any] = dict(
        name=name, num_layers=ints["num_layers"], hidden_size=hidden, num_attention_heads=heads,
        num_query_groups=groups if groups and groups != heads else None, ffn_hidden_size=ffn,
        vocab_size=vocab, swiglu=swiglu, num_experts=experts,
        moe_router_topk=ints["topk"] if experts else 2,
        untie_embeddings_and_output_weights=not _gpt3_style(name))
    arch = ModelArch.model_validate({**data, **explicit})
    preset = matching_preset(arch)
    if preset is None and by_name is not None and by_name.multi_latent_attention + by_name.is_hybrid \
            and (by_name.num_layers, by_name.hidden_size) == (arch.num_layers, arch.hidden_size):
        preset = by_name  # MLA / hybrid rows: the dimensions agree, the ranks and patterns come from the preset
    if special and (preset is None or not (preset.multi_latent_attention or preset.is_hybrid)):
        p.problems.append(f"{special} without a preset that matches the row (add one to optico.workload.PRESETS)")
        return None
    if preset is not None:
        if preset.multi_latent_attention or preset.is_hybrid or preset.mtp_num_layers:
            p.inferred.append(f"architecture details (MLA ranks, layer pattern, MTP) from preset {preset.name}")
        return ModelArch.model_validate({**preset.model_dump(), **explicit})
    return arch


# The one flag whose value is not the knob's: layers per virtual stage, from which VPP follows.
_LAYERS_PER_VIRTUAL_STAGE = "--num-layers-per-virtual-pipeline-stage"


def _knob_args(args: dict[str, str], num_layers: int, pp: int | None) -> dict[str, Any]:
    """Knob values the notes' Megatron arguments state, read through the registry's flags."""
    out: dict[str, Any] = {}
    for k in KNOBS:
        for flag in k.flags:
            value = args.get(flag[2:])
            if value is None:
                continue
            if flag == _LAYERS_PER_VIRTUAL_STAGE:
                per_stage = _count(value) or 0
                if per_stage and pp and num_layers % (pp * per_stage) == 0:
                    out[k.name] = num_layers // (pp * per_stage)
            elif k.is_bool:
                out[k.name] = _is_true(value) != k.negates(flag)
            elif (number := _count(value)) is not None:
                out[k.name] = number
            elif value in k.choices:  # recompute-method=block, moe-token-dispatcher-type=alltoall
                out[k.name] = value
    return out


def _build_strategy(p: _Parse, ints: dict[str, int | None], args: dict[str, str] | None, model: ModelArch
                    ) -> Strategy | None:
    d = p.defaults
    try:
        recompute = _parse_recompute_cell(p.cells.get("recompute"))
    except CellError as err:
        p.problems.append(f"recompute {err}")
        return None
    if recompute is UNKNOWN:
        recompute = _parse_recompute_cell(d.recompute)
    offload = None
    if recompute[0] == "offload":
        offload = recompute[2] or max(1, model.num_layers // 2)
        if recompute[2] is None:
            p.unknown["cpu_offloading_num_layers"] = [offload, max(1, model.num_layers // 4), model.num_layers - 1]
        recompute = (None, None, None)
    granularity, method, layers = recompute
    _derive_missing_degree(p, ints)
    for name in ("tp", "pp"):
        if ints[name] is None:
            ints[name] = UNKNOWN_DOMAINS[name][0]
            p.unknown[name] = list(UNKNOWN_DOMAINS[name])
    tp, ep = ints["tp"], ints["ep"] or d.expert_model_parallel_size
    recipe = d.recipe_flags and _from_recipe(p.text("source"))
    # An MoE model with TP > 1 runs with sequence parallelism (Megatron-LM refuses it otherwise).
    sp_default = d.sequence_parallel or (model.is_moe and tp > 1) or (recipe and tp > 1)
    try:
        sp = parse_bool(p.cells.get("sequence_parallel"))
        dist_opt = parse_distributed_optimizer(p.cells.get("distributed_optimizer"))
    except CellError as err:
        which = "distributed_optimizer" if "FSDP" in str(err) or "ZeRO" in str(err) else "sequence_parallel"
        p.problems.append(f"{which} {err}")
        return None
    if _sharded(p.text("fsdp")):
        p.problems.append(f"fsdp {p.text('fsdp')[:40]!r}: Megatron-FSDP / FSDP2 shard more than the optimizer; "
                          f"not a Strategy option")
        return None
    data: dict[str, Any] = dict(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=ints["pp"],
        context_parallel_size=ints["cp"] or d.context_parallel_size,
        expert_model_parallel_size=ep,
        virtual_pipeline_model_parallel_size=ints["vpp"] or d.virtual_pipeline_model_parallel_size,
        micro_batch_size=ints["mbs"] or 1,
        sequence_parallel=sp_default if sp is UNKNOWN else sp,
        recompute_granularity=granularity, recompute_method=method, recompute_num_layers=layers,
        use_distributed_optimizer=d.distributed_optimizer if dist_opt is UNKNOWN else dist_opt,
        cpu_offloading_num_layers=offload or 0,
    )
    if recipe:
        data["overlap_grad_reduce"] = data["overlap_param_gather"] = data["use_distributed_optimizer"]
        if model.is_moe:  # the recipes' MoE settings: experts folded (ETP 1), grouped GEMM, all-to-all
            data.update(expert_tensor_parallel_size=1, moe_grouped_gemm=True, moe_token_dispatcher_type="alltoall")
    etp = ints["etp"] or _note_int(p.text("notes"), "ETP")
    if etp and model.is_moe:
        data["expert_tensor_parallel_size"] = etp
    for column, key in (("first_pp_layers", "decoder_first_pipeline_num_layers"),
                        ("last_pp_layers", "decoder_last_pipeline_num_layers")):
        if ints[column]:
            data[key] = ints[column]
    if args:
        stated = _knob_args(args, model.num_layers, ints["pp"])
        # A dense model has no experts to dispatch: a table's 'All-to-All' on its row says nothing.
        stated = {name: value for name, value in stated.items() if model.is_moe or not BY_NAME[name].moe_only}
        data.update(stated)
        given = set(stated) | ({"sequence_parallel"} if sp is not UNKNOWN else set()) \
            | ({"use_distributed_optimizer"} if dist_opt is not UNKNOWN else set())
        data.update(_required_switches(stated, given))
    if tp == 1:
        # Megatron-LM's validate_args turns SP off with a warning at TP 1, so such a run had none, and
        # nothing that needs SP (a table-wide note names --tp-comm-overlap for every row): no TP traffic.
        data["sequence_parallel"] = False
        data.update({name: BY_NAME[name].default for name in data if name in BY_NAME
                     and any("sequence_parallel" in rule.involves for rule in BY_NAME[name].requires)})
    return Strategy.model_validate(data)


def _required_switches(stated: dict[str, Any], given: set[str]) -> dict[str, bool]:
    """Switches a run must have had on, since Megatron-LM refuses a stated knob without them (TP
    communication overlap without sequence parallelism): each switch a stated knob's requirement
    involves, where the row does not say otherwise."""
    out: dict[str, bool] = {}
    for name, value in stated.items():
        knob = BY_NAME[name]
        if value == knob.default:
            continue
        for rule in knob.requires:
            out.update({other: True for other in rule.involves
                        if other not in given and other in BY_NAME and BY_NAME[other].is_bool})
    return out


def _derive_missing_degree(p: _Parse, ints: dict[str, int | None]) -> None:
    """TP or PP left empty in a row that gives num_gpus and dp (a paper that states the GPU count, the
    data-parallel size and one model-parallel degree): the missing one is num_gpus/(dp·other·CP)."""
    missing = [name for name in ("tp", "pp") if ints[name] is None]
    world, dp = ints["num_gpus"], ints["dp"]
    if len(missing) != 1 or not world or not dp:
        return
    name = missing[0]
    other = ints["pp" if name == "tp" else "tp"] or 1
    cp = ints["cp"] or p.defaults.context_parallel_size
    degree, left = divmod(world, dp * other * cp)
    if degree >= 1 and not left:
        ints[name] = degree
        p.inferred.append(f"{name} = num_gpus/(dp·{'PP' if name == 'tp' else 'TP'}·CP) = {degree}")


def _from_recipe(source: str) -> bool:
    """NeMo, Megatron-Bridge and DGX Cloud benchmark recipes (their performance configurations)."""
    return bool(_RECIPE_SOURCE.search(source))


# Any spelling of the recipes' names, their docs' URLs included ('docs.nvidia.com/nemo-framework/...'),
# but not a word that only starts like one ('Nemotron').
_RECIPE_SOURCE = re.compile(r"\bnemo\b|megatron[-_ ]?bridge|dgxc[-_ ]?benchmarking|\bdgx[-_ ]?cloud\b", re.IGNORECASE)


def _cluster(gpu_key: str, num_gpus: int) -> Cluster:
    per_node = (72 if num_gpus <= 72 else NVL72_GPUS_USED) if gpu_key in NVL72_GPUS else 8
    return Cluster(gpu=gpu_key, gpus_per_node=per_node, nodes=-(-num_gpus // per_node), num_gpus=num_gpus)


def _world_and_batch(p: _Parse, ints: dict[str, int | None], s: Strategy) -> tuple[int, int, int]:
    """(num_gpus, gbs, mbs): read, derived (dp cell, GA in the notes), or unknown with plausible values."""
    mp = s.model_parallel_size
    world = ints["num_gpus"]
    if world is None and ints["dp"]:
        world = ints["dp"] * mp
        p.inferred.append(f"num_gpus = dp·TP·PP·CP = {world}")
    if world is None:
        choices = [mp * k for k in UNKNOWN_DOMAINS["dp"]]
        p.unknown["num_gpus"] = choices
        world = choices[0]
    dp = max(1, world // mp)
    gbs, mbs = ints["gbs"], ints["mbs"]
    if mbs is None and gbs and _note_int(p.text("notes"), "GA"):
        ga = _note_int(p.text("notes"), "GA")
        if gbs % (dp * ga) == 0 and "num_gpus" not in p.unknown:
            mbs = gbs // (dp * ga)
            p.inferred.append(f"mbs = gbs / (DP·GA) = {mbs}")
    if mbs is None:
        p.unknown["mbs"] = list(UNKNOWN_DOMAINS["mbs"])
        mbs = UNKNOWN_DOMAINS["mbs"][0]
    if gbs is None:
        choices = [dp * mbs * k for k in UNKNOWN_DOMAINS["gbs_per_dp"]]
        p.unknown["gbs"] = choices
        gbs = choices[0]
    return world, gbs, mbs


def _uneven(p: _Parse, w: Workload, s: Strategy) -> Strategy:
    """The split Megatron needs when the layers do not divide by PP and the row states none
    (`ParallelDims.infer_split`); a split nothing expresses is approximated, and said so."""
    if s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers or s.pp == 1 \
            or s.account_for_embedding_in_pipeline_split or s.account_for_loss_in_pipeline_split:
        return s
    split = ParallelDims.of(s, w.world_size).infer_split(w.model.num_layers)
    if split:
        p.inferred.append("pipeline split inferred: " + ", ".join(f"{k}={v}" for k, v in split.items()))
        return s.changed(**split)
    if ParallelDims.of(s, w.world_size).split_errors(w.model.num_layers):
        p.inferred.append("pipeline layout not expressible by first/last stages or the embedding/loss split "
                          "(Megatron's --pipeline-model-parallel-layout): stage sizes approximated")
    return s


def parse_row(cells: dict[str, str], file: str, line: int, defaults: ReplayDefaults,
              units: dict[str, str] | None = None) -> ReplayRow:
    """One CSV record (keys: replay columns) -> ReplayRow; every problem becomes the row's skip_reason."""
    p = _Parse(cells=cells, units=units or {}, defaults=defaults)
    name, notes, source = p.text("model"), p.text("notes"), p.text("source")
    measured = {k: p.number(k) for k in MEASURED}
    try:
        result = parse_result(cells.get("result"))
    except CellError as err:
        p.wrong(f"result {err}")
        result = "error"
    said_oom = next((k for k in MEASURED if _says_oom(cells.get(k))), None)
    if result is UNKNOWN and said_oom:  # BLOOM's logs: 'OOM' where the memory would be
        result = "oom"
        p.inferred.append(f"result oom (its {said_oom} cell says so)")
    if result is UNKNOWN:
        if any(measured[k] is not None for k in ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu")):
            result = "ok"
            p.inferred.append("result ok (the row reports throughput)")
        else:
            p.problems.append("no result and no measurement")
            result = "error"
    ints = {k: p.integer(k) for k in _INT_CELLS}
    gpu_key = normalize_gpu_name(p.text("gpu")) if p.text("gpu") else None
    if gpu_key is None:
        p.problems.append("missing required input(s): gpu")
    elif gpu_key not in GPUS:
        p.problems.append(f"unknown GPU {p.text('gpu')!r}")
    try:
        precision = _parse_precision_cell(cells.get("precision"))
        if precision is UNKNOWN:
            # The default, unless the GPU has no tensor cores for it: a V100 table trained in fp16.
            peaks = GPUS[gpu_key].peak_tflops if gpu_key in GPUS else {}
            precision = defaults.precision if defaults.precision in peaks or not peaks else "fp16"
    except CellError as err:
        p.problems.append(f"precision {err}")
        precision = None

    workload: Workload | None = None
    strategy: Strategy | None = None
    args = _megatron_args(notes)
    if named := _notes_flags(notes):
        args = {**named, **(args or {})}  # an 'args:' list is the run's own: it wins
    args = _moe_columns(p, args)
    try:
        model = _build_model(p, ints, args)
        if model is not None:
            strategy = _build_strategy(p, ints, args, model)
        if model is not None and strategy is not None:
            seq = ints["seq_length"]
            if seq is None:
                p.unknown["seq_length"] = list(UNKNOWN_DOMAINS["seq_length"])
                seq = UNKNOWN_DOMAINS["seq_length"][0]
            world, gbs, mbs = _world_and_batch(p, ints, strategy)
            if mbs != strategy.mbs:
                strategy = strategy.changed(micro_batch_size=mbs)
            if precision is not None and gpu_key in GPUS:
                recipe = defaults.recipe_flags and _from_recipe(source)
                workload = Workload(model=model, seq_length=seq, global_batch_size=gbs, precision=precision,
                                    cluster=_cluster(gpu_key, world), grad_reduce_in_fp32=False if recipe else None,
                                    attention_backend=_attention_backend(args))
                strategy = _uneven(p, workload, strategy)
    except (ValidationError, ValueError) as err:
        p.problems.append(f"inconsistent architecture or layout: {_first_error(err)}")
    if workload is not None and strategy is not None and not p.problems:
        p.problems += _layout_problems(workload, strategy, ints["dp"], p)
    row = ReplayRow(file=file, line=line, model_name=name, source=source, notes=notes, workload=workload,
                    strategy=strategy, result=result, counts_recompute=counts_recompute_flops(source, notes),
                    counts_full_attention=full_attention_count(source, notes),
                    skip_reason="; ".join(p.problems) or None, unknown=p.unknown, inferred=p.inferred,
                    malformed=p.malformed, **measured)
    problem = impossible_measurement(row) if row.usable else None
    if problem:
        return row.model_copy(update={"skip_reason": f"{IMPOSSIBLE}: {problem}"})
    set_aside = _figures_set_aside(row)
    return row.model_copy(update={"inferred": [*row.inferred, *set_aside]}) if set_aside else row


# A stated MFU or TFLOP/s further than this from the step time's MFU is named in the file report.
SET_ASIDE_TOLERANCE = 0.03
# Unknown cells that leave a row's FLOP count as it is (flops_per_iteration reads the workload and TP).
_FLOPS_UNCHANGED_BY = frozenset({"mbs", "pp", "cpu_offloading_num_layers"})


def _figures_set_aside(row: ReplayRow) -> list[str]:
    """The MFU and TFLOP/s cells of a row that also gives its step time, where they differ from the step
    time's MFU by more than `SET_ASIDE_TOLERANCE`: the step time is used (`measured_mfu`), and the report
    says the cell was not (the source counted FLOPs otherwise: full attention, the recompute pass)."""
    if not row.read or not row.step_time_s or row.result != "ok" or set(row.unknown) - _FLOPS_UNCHANGED_BY:
        return []
    used = measured_mfu(row)
    out = []
    for column, other in (("mfu", "tflops_per_gpu"), ("tflops_per_gpu", "mfu")):
        # The cell's MFU as `measured_mfu` reads it when the row has no step time (hardware FLOPs included).
        if getattr(row, column) is None:
            continue
        stated = measured_mfu(row.model_copy(update={"step_time_s": None, other: None}))
        if stated and used and abs(stated / used - 1) > SET_ASIDE_TOLERANCE:
            out.append(f"{column}: the step time's MFU used, the cell differs by over {SET_ASIDE_TOLERANCE:.0%}")
    return out


IMPOSSIBLE = "impossible measurement"


def impossible_measurement(row: ReplayRow) -> str | None:
    """Why a complete row's numbers cannot have been measured on its GPU (`optico.plausible`), or None:
    such a row is no data point for a replay, a fit or a score (the reader skips it)."""
    from optico.plausible import measurement_problem

    assert row.workload is not None
    return measurement_problem(
        row.workload, mfu=measured_mfu(row), mem_max_gib=row.mem_max_gib, step_time_s=row.step_time_s,
        tokens_per_s_per_gpu=row.tokens_per_s_per_gpu, tflops_per_gpu=row.tflops_per_gpu, mfu_column=row.mfu)


def _first_error(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        where = ".".join(loc_fields(first["loc"]))
        message = str(first.get("ctx", {}).get("error") or first["msg"])
        return f"{where}: {message}" if where else message
    return str(err)


def _layout_problems(w: Workload, s: Strategy, dp_cell: int | None, p: _Parse) -> list[str]:
    """The dp cell is derived by the transcriber: check it, never use it. Then Megatron's checks, on
    the first assignment of unknown cells that passes them (unknowns with no valid value fail)."""
    out: list[str] = []
    world, mp = w.world_size, s.model_parallel_size
    if dp_cell is not None and world % mp == 0 and dp_cell != world // mp and "num_gpus" not in p.unknown:
        out.append(f"layout inconsistent: dp {dp_cell} but num_gpus/(TP·PP·CP) = {world}/({s.tp}·{s.pp}·{s.cp})"
                   f" = {world // mp}")
    approximate = any("stage sizes approximated" in x for x in p.inferred)
    broken = [v for v in violations(w, s) if not (approximate and "pipeline_model_parallel_size" in v.params
                                                   and "divisible by PP" in v.message)]
    if broken and p.unknown:
        # The unknowns may still have a valid value (`variants` keeps only those); if none does, say so.
        probe = ReplayRow(file="", line=0, model_name="", workload=w, strategy=s, result="ok", unknown=p.unknown)
        if variants(probe, limit=1):
            return out
        return out + [f"no value of the unknown cell(s) {', '.join(p.unknown)} passes Megatron's checks "
                      f"(e.g. rejected by optico.rules: {broken[0].message})"]
    out += [f"rejected by optico.rules: {v.message}" for v in broken]
    return out


def variants(row: ReplayRow, limit: int = 64) -> list[tuple[Workload, Strategy]]:
    """The (workload, strategy) pairs a read row may have been: every combination of its unknown
    cells' plausible values that Megatron accepts (at most `limit`). One pair for a complete row."""
    if row.workload is None or row.strategy is None:
        return []
    if not row.unknown:
        return [(row.workload, row.strategy)]
    names = list(row.unknown)
    out = []
    for values in itertools.product(*(row.unknown[n] for n in names)):
        pair = _apply(row.workload, row.strategy, dict(zip(names, values)))
        if pair is not None:
            out.append(pair)
            if len(out) >= limit:
                break
    return out


def _apply(w: Workload, s: Strategy, values: dict[str, Any]) -> tuple[Workload, Strategy] | None:
    knob = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "mbs": "micro_batch_size",
            "cpu_offloading_num_layers": "cpu_offloading_num_layers"}
    try:
        s = s.changed(**{knob[k]: v for k, v in values.items() if k in knob})
        model = w.model.model_copy(update={"vocab_size": values["vocab_size"]}) if "vocab_size" in values else w.model
        world = values.get("num_gpus", w.world_size)
        w = w.model_copy(update={
            "model": model, "seq_length": values.get("seq_length", w.seq_length),
            "global_batch_size": values.get("gbs", w.global_batch_size),
            "cluster": _cluster(w.cluster.gpu, world)})
    except (ValidationError, ValueError):
        return None
    if violations(w, s) and not _split_only(w, s):
        return None
    return w, s


def _split_only(w: Workload, s: Strategy) -> bool:
    """Only the even-split rule breaks (a layout first/last cannot express, approximated)."""
    return all("divisible by PP" in v.message for v in violations(w, s))


# -- files ---------------------------------------------------------------------------------------

# A cell quoted in a reason ("fsdp '1 (0)': ..."): its text is the row's, not the kind of problem.
_QUOTED_CELL = re.compile(r"""\s*(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def reason_kind(reason: str) -> str:
    """A skip reason's kind, to count rows by: its first clause up to a colon or a parenthesis, without
    the cells it quotes ("fsdp '1 (0)': Megatron-FSDP ..." -> 'fsdp'; it read "fsdp '1")."""
    return _QUOTED_CELL.sub("", reason.split(";")[0]).split(":")[0].split(" (")[0].strip()


@dataclass
class FileReport:
    """What was read from one file."""

    file: str
    rows: int = 0
    read: int = 0
    complete: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)  # skip reason (first clause) -> rows
    unknown: Counter = field(default_factory=Counter)  # cell -> rows where it is unknown
    inferred: Counter = field(default_factory=Counter)  # what was derived -> rows
    missing_columns: list[str] = field(default_factory=list)
    renamed_columns: dict[str, str] = field(default_factory=dict)  # header as written -> replay column
    ignored_columns: list[str] = field(default_factory=list)
    # A second header naming a column already read (the first is kept): header as written -> column.
    repeated_columns: dict[str, str] = field(default_factory=dict)
    skipped_rows: list[str] = field(default_factory=list)  # "file:line: reason"
    hardware_flops: int = 0  # rows read whose TFLOP/s count the recompute pass (see counts_recompute)
    full_attention: int = 0  # rows read whose TFLOP/s count attention without its mask (counts_full_attention)

    def add(self, row: ReplayRow) -> None:
        self.rows += 1
        if row.read:
            self.read += 1
            self.hardware_flops += int(row.counts_recompute and row.strategy is not None
                                       and row.strategy.recompute == "full"
                                       and (row.tflops_per_gpu is not None or row.mfu is not None))
            self.full_attention += int(row.counts_full_attention and not row.step_time_s
                                       and (row.tflops_per_gpu is not None or row.mfu is not None))
            self.complete += int(not row.unknown)
            self.unknown.update(row.unknown.keys())
        else:
            self.skipped += 1
            self.reasons[reason_kind(row.skip_reason)] += 1
            self.skipped_rows.append(f"{row.where}: {row.skip_reason}")
        self.inferred.update(_QUOTED_CELL.sub("", x) for x in row.inferred)  # counted by kind, not by cell

    def text(self, max_rows: int = 5) -> str:
        lines = [f"{self.file}: {self.rows} rows, {self.read} read ({self.complete} complete, "
                 f"{self.read - self.complete} with unknown cells), {self.skipped} skipped"]
        if self.renamed_columns:
            lines.append("  columns read as: " + ", ".join(f"{a!r} -> {b}" for a, b in self.renamed_columns.items()))
        if self.missing_columns:
            lines.append("  columns absent (read as empty): " + ", ".join(self.missing_columns))
        if self.repeated_columns:
            lines.append("  columns read twice (the first kept, these ignored): "
                         + ", ".join(f"{a!r} -> {b}" for a, b in self.repeated_columns.items()))
        if self.ignored_columns:
            lines.append("  columns ignored: " + ", ".join(self.ignored_columns))
        if self.unknown:
            lines.append("  unknown cells: " + ", ".join(f"{k} ({n})" for k, n in self.unknown.most_common()))
        if self.hardware_flops:
            lines.append(f"  TFLOP/s and MFU read as hardware FLOPs (the recompute pass counted, as the source or "
                         f"notes say) on {self.hardware_flops} rows")
        if self.full_attention:
            lines.append(f"  TFLOP/s and MFU brought to the causal attention count (the source's software counted the "
                         f"whole score matrix) on {self.full_attention} rows")
        if self.inferred:
            lines.append("  derived or assumed: " + "; ".join(f"{clip(k, 100)} ({n})"
                                                           for k, n in self.inferred.most_common(8)))
        for reason, n in self.reasons.most_common():
            lines.append(f"  skipped {n}: {reason}")
        lines += [f"    {x}" for x in self.skipped_rows[:max_rows]]
        if len(self.skipped_rows) > max_rows:
            lines.append(f"    ... {len(self.skipped_rows) - max_rows} more")
        return "\n".join(lines)


def read_replay_file(path: str | Path, defaults: ReplayDefaults | None = None, *, strict: bool = False
                     ) -> tuple[list[ReplayRow], FileReport]:
    """Every row of a replay CSV, skipped ones included (see `ReplayRow.skip_reason`), and the file's
    report. Headers are matched by synonym ('TP', 'Micro Batch Size'); absent columns read as empty.

    Raises ReplayError when the file has no model column nor any architecture column (not a replay
    table), and with `strict` at the first row that is skipped, naming file:line and the reason."""
    path = Path(path)
    defaults = defaults or ReplayDefaults()
    try:  # bounded, a regular file, UTF-8 without NULs: a CSV swapped for /dev/zero or a FIFO since the spec
        text = read_text(path, "", "replay CSV", MAX_CSV_BYTES)  # was checked must not hang the launcher
    except SpecError as exc:
        raise ReplayError(exc.reason) from None
    try:
        return _read_rows(path, text, defaults, strict)
    except csv.Error as exc:  # a cell beyond csv's field limit (128 KiB)
        raise ReplayError(f"{path}: not a readable CSV: {exc}") from None


def _memory_measure(header: str) -> Literal["", "allocated", "reserved"]:
    """'Max memory allocated (MiB)' -> allocated; 'max_memory_reserved' -> reserved; else unsaid."""
    words = header.lower()
    return "allocated" if "allocated" in words else "reserved" if "reserved" in words else ""


def _read_rows(path: Path, text: str, defaults: ReplayDefaults, strict: bool) -> tuple[list[ReplayRow], FileReport]:
    report = FileReport(file=path.name)
    rows: list[ReplayRow] = []
    with io.StringIO(text, newline="") as handle:
        # csv.reader, not DictReader: it yields blank lines (so file:line stays right after them) and
        # leaves a record's extra fields visible (an unquoted "4,064" shifts every cell after it).
        reader = csv.reader(handle)
        header = next((record for record in reader if record), [])
        columns: list[str | None] = []  # per field of a record: its replay column, or None
        units: dict[str, str] = {}
        memory_measure = ""
        for h in header:
            column = canonical_header(h)
            if column is not None and column in columns:
                if strict:
                    first = header[columns.index(column)]
                    raise ReplayError(f"{path}: columns {first!r} and {h!r} both read as {column}; keep one")
                report.repeated_columns[h] = column
                columns.append(None)
                continue
            if column is None:
                report.ignored_columns.append(h)
                columns.append(None)
                continue
            columns.append(column)
            units[column] = header_unit(h)
            if column == "mem_max_gib":
                memory_measure = _memory_measure(h)
            if h != column:
                report.renamed_columns[h] = column
        known = set(columns) - {None}
        if "model" not in known and not known & set(ARCHITECTURE):
            raise ReplayError(f"{path}: not a replay table: no model or architecture column among "
                              f"{', '.join(header) or 'no header'} (DESIGN.md, 'Replay CSV format')")
        report.missing_columns = [c for c in COLUMNS if c not in known]
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if not any(cell.strip() for cell in record):
                continue  # a blank line
            cells = {column: value for column, value in zip(columns, record) if column is not None}
            too_long = _blank_long_cells(cells)
            for row in _runs_of(cells, path.name, start, defaults, units):
                if len(rows) >= MAX_CSV_ROWS:
                    raise ReplayError(f"{path}: more than {MAX_CSV_ROWS:,} rows; a replay CSV may have at most that")
                rows.append(_checked(row, record, header, memory_measure, strict, too_long))
                report.add(rows[-1])
    return rows, report


def _blank_long_cells(cells: dict[str, str]) -> list[str]:
    """Empties each cell over its length bound, in place; says which were, and how long."""
    out = []
    for column, value in cells.items():
        bound = MAX_TEXT_CELL_CHARS if column in _TEXT_COLUMNS else MAX_CELL_CHARS
        if len(value) > bound:
            cells[column] = ""
            out.append(f"{column} cell of {len(value):,} characters: longer than a table's (at most {bound:,})")
    return out


def _checked(row: ReplayRow, record: list[str], header: list[str], memory_measure: str, strict: bool,
             too_long: list[str]) -> ReplayRow:
    """`row` with what its record's shape says: more fields than the header (shifted cells) or a cell
    too long to be a table's skip it, fewer mark it malformed; with `strict` a row that cannot be used
    is an error."""
    if memory_measure:
        row = row.model_copy(update={"memory_measure": memory_measure})
    wrong = too_long.copy()
    if any(cell.strip() for cell in record[len(header):]):  # empty ones: a trailing comma, harmless
        wrong.append(f"{len(record)} fields against the header's {len(header)} (an unquoted comma in a "
                     f"cell shifts every cell after it)")
    if wrong:
        row = row.model_copy(update={"skip_reason": "; ".join(filter(None, [*wrong, row.skip_reason])),
                                     "malformed": [*wrong, *row.malformed]})
    elif len(record) < len(header):  # read with its missing cells unknown, but not a whole record
        row = row.model_copy(update={"malformed": [
            f"{len(record)} fields against the header's {len(header)} (a row cut short, or a quote "
            f"left open)", *row.malformed]})
    if strict and not row.read:
        raise ReplayError(f"{row.where}: {row.skip_reason}")
    return row


def figure_pair(cell: str) -> tuple[str, str] | None:
    """A cell holding two runs' figures, NeMo's way ('1 (0)', '31737 (30341)'): (first, second), else None.
    Read with string operations: the pattern this was took minutes on a cell of spaces and digits."""
    text = cell.strip()
    if not text.endswith(")") or text.count("(") != 1 or text.count(")") != 1:
        return None
    first, _, second = text[:-1].partition("(")
    first, second = first.strip(), second.strip()
    unsigned = second[1:] if second.startswith(("+", "-")) else second
    if not any(ch.isdigit() for ch in first) or not unsigned[:1].isdigit():
        return None
    return first, second


# The cells that say what a run measured, and those that say what ran: only these pair two runs
# (a model name 'Llama3 (8B)' is one name).
_MEASUREMENTS = frozenset({*_MEASURED_UNITS, "tflops_per_gpu", "tokens_per_s_per_gpu"})
_LAYOUT_COUNTS = frozenset({*_INT_CELLS, "fsdp"})
_FIRST_OF_PAIR = "the first figure read, the one in parentheses not"


def _runs_of(cells: dict[str, str], file: str, line: int, defaults: ReplayDefaults, units: dict[str, str]
             ) -> list[ReplayRow]:
    """The row, or two when a configuration cell pairs two runs (NeMo's summaries: FSDP '1 (0)', TP
    '1 (2)', tokens/s '4066 (2605)'): the first run's figures, then the second's — each paired cell's
    figure in parentheses, the cells it shares, and none of the first run's single measurements (a
    step time given once belongs to the first). Measurements alone paired, or layout cells pairing a
    figure with itself, are one configuration measured twice: one row, its first figures."""
    paired = {column: found for column, cell in cells.items()
              if column in _MEASUREMENTS | _LAYOUT_COUNTS and (found := figure_pair(cell or ""))}
    first = parse_row(cells, file, line, defaults, units)
    if all(paired[c][0] == paired[c][1] for c in paired.keys() & _LAYOUT_COUNTS):
        return [first]  # no layout cell differs between the runs (or none pairs): one configuration
    second = {column: paired[column][1] if column in paired else "" if column in _MEASUREMENTS else cell
              for column, cell in cells.items()}
    row = parse_row(second, file, line, defaults, units)
    said = [note.replace(_FIRST_OF_PAIR, "the figure of the first run (the second run is the next row)")
            for note in first.inferred]
    return [first.model_copy(update={"inferred": said}),
            row.model_copy(update={"inferred": ["the second run of its paired cells (the figures in parentheses)",
                                                *row.inferred]})]


def read_replay_csv(path: str | Path, defaults: ReplayDefaults | None = None, *, strict: bool = False
                    ) -> list[ReplayRow]:
    """Every row of a replay CSV (see `read_replay_file`)."""
    return read_replay_file(path, defaults, strict=strict)[0]


# -- what a row measured -------------------------------------------------------------------------

def peak_tflops(row: ReplayRow) -> float | None:
    """Dense peak TFLOP/s of the row's GPU at the row's precision (the catalog's)."""
    return row.workload.peak_tflops if row.workload else None


def tuned_throughput(row: ReplayRow) -> bool:
    """False for rows whose notes say their times are not tuned throughput (Megatron-LM's CI runs
    in deterministic mode, per the data README): their memory and fit/OOM outcome still count."""
    return "not tuned" not in row.notes.lower()


def stated_flops_ratio(row: ReplayRow, w: Workload, s: Strategy) -> float:
    """Our model FLOPs over the FLOPs the row's source counted for its stated TFLOP/s and MFU: 1 for a
    source on our count; below 1 for one that counted attention without its causal mask
    (`counts_full_attention`: 0.89 for Llama-3 8B at 8K tokens, 0.51 at 1M) or, under full recompute,
    the recompute forward pass (`counts_recompute`: the layers' FLOPs × 4/3, the output layer's once —
    Narayanan et al.'s Eq. 3 exactly for their GPT models)."""
    recomputed = row.counts_recompute and s.recompute == "full"
    if not (row.counts_full_attention or recomputed):
        return 1.0
    m, tp = w.model, s.tp
    ours = flops_per_token(m, w.seq_length, tp)
    theirs = ours + (core_attention_flops_per_token(m, w.seq_length) if row.counts_full_attention else 0.0)
    if recomputed:
        logits = logits_flops_per_token(m, tp)
        theirs = (theirs - logits) * FULL_RECOMPUTE_HFU_RATIO + logits
    return ours / theirs


def measured_mfu(row: ReplayRow, workload: Workload | None = None, strategy: Strategy | None = None) -> float | None:
    """MFU on Megatron-LM's model FLOPs (optico.flops), comparable across sources; for a row with
    unknown cells, as one of its `variants` (`workload`, `strategy`) would have it.

    - From step_time_s when given: flops_per_iteration / (step_time · world · peak). This is the
      only figure computed with our own FLOPs formula, so it is preferred.
    - Else the mfu column, else tflops_per_gpu / peak, brought to our FLOPs count by
      `stated_flops_ratio` (a source that counted the recompute pass or attention without its
      causal mask states a larger figure for the same run).
    - Else tokens_per_s_per_gpu, through our FLOPs per token.
    None for rows that did not run (oom/error), skipped rows and rows with no throughput figure.
    """
    w, s = workload or row.workload, strategy or row.strategy
    if row.result != "ok" or not row.read or w is None or s is None:
        return None
    peak = w.peak_tflops
    if row.step_time_s:
        return flops_per_iteration(w, s.tp) / (row.step_time_s * w.world_size * peak * 1e12)
    if row.mfu is not None:
        return row.mfu * stated_flops_ratio(row, w, s)
    if row.tflops_per_gpu is not None:
        return row.tflops_per_gpu / peak * stated_flops_ratio(row, w, s)
    if row.tokens_per_s_per_gpu is not None:
        return row.tokens_per_s_per_gpu * flops_per_iteration(w, s.tp) / (w.global_batch_size * w.seq_length) \
            / (peak * 1e12)
    return None


_SOFTWARE = re.compile(r"\brelease\s+[\w.]+|\bcontainer\s+[^;,()]+|\bNeMo\s+\d+\.\d+[\w.]*|golden_values_\w+|"
                       r"\bcommit\s+[0-9a-f]{7,}", re.IGNORECASE)


def software(row: ReplayRow) -> str:
    """The software a row was measured with, as its source or notes name it ('release 26.08',
    'container NeMo 24.07', a golden-values file, a commit); '' when they do not say. Rankings
    compare configurations measured with the same software: a newer release of the same recipe
    is faster without any knob changing."""
    found = _SOFTWARE.search(f"{row.notes} {row.source}")
    return found.group(0).strip().lower() if found else ""


def replayable(row: ReplayRow) -> bool:
    """A row the replay launcher can answer from: complete, and either it ran with a throughput
    figure or it failed (an ok row with memory only tells nothing a replay could return)."""
    return row.usable and (row.result != "ok" or measured_mfu(row) is not None)


def matches(row: ReplayRow, workload: Workload) -> bool:
    """Does `row` measure `workload`? Compares only what a CSV row can say: layers, hidden, heads,
    query groups, (per-expert) FFN, vocabulary, experts, top-k, sequence, global batch, precision,
    GPU and world size. Names, kv_channels, SwiGLU and tied embeddings are not compared."""
    w = row.workload
    if w is None or row.unknown:
        return False
    return (_dims(w.model) == _dims(workload.model)
            and w.seq_length == workload.seq_length
            and w.global_batch_size == workload.global_batch_size
            and w.precision == workload.precision
            and w.cluster.gpu == workload.cluster.gpu
            and w.world_size == workload.world_size)


def check_replay_csv(path: Path, workload, space, field: str = "launcher.data") -> None:
    """Reads the replay CSV at spec load and refuses what the replay launcher would choke on or
    silently trust: a file that is not the format, a row it cannot parse, no usable row for this
    workload, none inside the search space, or a measurement impossible on the declared GPU
    (MFU above 100 % of its peak, peak memory above its capacity, a time or rate that is not
    positive). Errors name the file and, for a row, its line."""
    text = read_text(path, field, "replay CSV", MAX_CSV_BYTES)
    try:
        records = csv.reader(io.StringIO(text, newline=""))  # "\r" alone ends a line too (old Mac exports)
        header = next(records, [])
        count = sum(1 for _ in itertools.islice(records, MAX_CSV_ROWS + 1))
    except csv.Error as exc:
        raise SpecError(field, f"{path.name} is not a CSV file: {exc}") from None
    if count > MAX_CSV_ROWS:
        raise SpecError(field, f"{path.name} has more than {MAX_CSV_ROWS:,} rows; a replay CSV may have at most "
                               f"{MAX_CSV_ROWS:,}")
    named = {canonical_header(h) for h in header}  # 'Model', 'TP' as the reader takes them
    present = [c for c in COLUMNS if c in named]
    if not present:
        raise SpecError(field, f"{path.name} is not a replay CSV: its first line names none of the format's "
                               f"columns ({', '.join(COLUMNS[:4])}, ...; see docs/launchers.md)")
    try:  # the text already read, not the file again
        rows, report = _read_rows(path, text, ReplayDefaults(), strict=False)
    except (ValueError, csv.Error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(field, reason.replace(str(path), path.name)) from None
    if report.repeated_columns:  # which of the two a spec's own file means is not for the reader to guess
        header_text, column = next(iter(report.repeated_columns.items()))
        raise SpecError(field, f"{path.name}: column {header_text!r} is read as {column} a second time; keep one")
    # The tolerant reading skips a wrong row (published tables have them); a spec's own file must not:
    # a cell that is no count or no result, or a row shifted by an unquoted comma, is a broken file.
    broken = next((r for r in rows if r.malformed), None)
    if broken is not None:
        raise SpecError(field, f"{broken.where}: {broken.malformed[0]}")
    # A row of this workload whose numbers no GPU produces is a mistake in the table, not a row to skip.
    impossible = next((r for r in rows if (r.skip_reason or "").startswith(IMPOSSIBLE) and r.workload is not None
                       and matches(r, workload)), None)
    if impossible is not None:
        raise SpecError(field, f"{impossible.where}: {(impossible.skip_reason or '').removeprefix(IMPOSSIBLE + ': ')}")
    measuring = [r for r in rows if r.usable and matches(r, workload)]
    if not measuring:
        usable = sum(r.usable for r in rows)
        raise SpecError(field, f"{path.name}: none of its {len(rows)} rows ({usable} usable) measures this "
                               f"workload ({workload.describe()})")
    if not any(space.contains(r.strategy) for r in measuring):
        raise SpecError(field, f"{path.name}: none of the {len(measuring)} configurations it measures for this "
                               f"workload lies inside the search space")

"""The vocabulary of replay-CSV cells and headers as sources write them, read into values.

Every parser returns a value, or `UNKNOWN` for a cell that says nothing ("", "none stated",
"n/a", "?"), or raises `CellError` with the reason for a cell it cannot read. Synonym tables
are data, one per vocabulary, so a new spelling is one line here.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

from optico.knobs import KNOBS


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:
        return False


UNKNOWN: Any = _Unknown()


class CellError(ValueError):
    """A cell that holds something, but nothing this vocabulary can read."""


class NotFinite(CellError):
    """A number too large to be finite ('1e999', 5,000 digits): no measurement or count is."""


# Cells that say the source does not give the value: read like an empty cell.
UNKNOWN_MARKERS = frozenset({
    "", "?", "-", "--", "—", "–", "n/a", "na", "n.a.", "none stated", "not stated", "not given", "unknown",
    "unspecified", "not specified", "not reported", "unreported", "tbd", "nan", "null", "nil", "not available",
    "see notes", "varies",
})

_TRUE = frozenset({"true", "yes", "y", "1", "on", "enabled", "enable", "used", "✓", "x", "t"})
_FALSE = frozenset({"false", "no", "n", "0", "off", "disabled", "disable", "none", "not used", "f", "✗"})
# The distributed optimizer is ZeRO stage 1 (optimizer state sharded over DP).
_DISTRIBUTED_OPTIMIZER = frozenset({"zero1", "zero-1", "zero 1", "zero stage 1", "zero-stage-1", "stage 1", "stage1",
                                    "distributed optimizer", "distributed", "distopt", "dist-opt", "dist opt",
                                    "sharded optimizer", "sharded", "megatron distributed optimizer"})
_NOT_SHARDED = frozenset({"zero0", "zero-0", "zero 0", "stage 0", "ddp", "plain ddp", "replicated"})
_FSDP = re.compile(r"fsdp|zero[- ]?(stage[- ]?)?[23]\b|stage[- ]?[23]\b")

_RECOMPUTE_NONE = frozenset({"none", "no", "off", "false", "disabled", "0", "no recompute", "no ac"})
_RECOMPUTE_SELECTIVE = re.compile(r"^(selective|sel|partial|core[_ ]?attn|attention|recompute[- ]activations)")
# '--checkpoint-activations': Megatron-LM's flag for full recompute before --recompute-granularity.
_RECOMPUTE_FULL = re.compile(r"^(?:--)?(full|yes|true|on|all|uniform|block|activation checkpointing|checkpoint)")
_OFFLOAD = re.compile(r"offload")

_RESULT = {
    "ok": ("ok", "success", "succeeded", "successful", "pass", "passed", "completed", "complete", "done", "ran",
           "fit", "fits", "yes", "trained", "good", "✓", "✔", "✅"),
    "oom": ("oom", "out of memory", "cuda oom", "oom error", "memory error", "cuda out of memory", "outofmemory",
            "out-of-memory"),
    "error": ("error", "fail", "failed", "failure", "crash", "crashed", "nan", "hang", "hung", "timeout",
              "diverged", "invalid", "✗", "✘", "❌"),
}


def _text(cell: str | None) -> str:
    return (cell or "").strip()


def is_unknown(cell: str | None) -> bool:
    return _text(cell).lower() in UNKNOWN_MARKERS


def _main(cell: str) -> str:
    """The cell without a parenthetical remark: 'true (zero1)' -> 'true'."""
    return re.sub(r"\s*[\(\[].*?[\)\]]\s*", " ", cell).strip().lower()


def parse_bool(cell: str | None) -> Any:
    text = _text(cell)
    if is_unknown(text):
        return UNKNOWN
    value = _main(text)
    if value in _TRUE or value.startswith(("true", "yes", "enabled")):
        return True
    if value in _FALSE or value.startswith(("false", "no ", "disabled")):
        return False
    raise CellError(f"{text!r} is not true/false")


def parse_distributed_optimizer(cell: str | None) -> Any:
    """True/False, ZeRO-1 spellings ('zero-1 (deepspeed)', 'true (zero1)') -> True; ZeRO-2/3 and FSDP
    raise CellError (parameters sharded: not a Strategy option)."""
    text = _text(cell)
    low = text.lower()
    if is_unknown(text):
        return UNKNOWN
    if _FSDP.search(low):
        raise CellError(f"{text!r}: Megatron-FSDP / ZeRO-2/3 shard more than the optimizer; not a Strategy option")
    main = _main(text)
    if re.search(r"zero[- _]?(stage[- _]?)?1\b|^stage[- _]?1\b", main):
        return True
    if re.search(r"zero[- _]?(stage[- _]?)?0\b|^stage[- _]?0\b", main) or main in _NOT_SHARDED:
        return False
    if main in _DISTRIBUTED_OPTIMIZER or any(main.startswith(s) for s in _DISTRIBUTED_OPTIMIZER):
        return True
    return parse_bool(text)


def parse_recompute(cell: str | None) -> Any:
    """(granularity, method, num_layers), or ('offload', None, layers or None) for activation offloading:
    'full' -> full/uniform/1, 'full (method=block, num_layers=4)', 'block 4', 'selective', 'none',
    'true' -> full. UNKNOWN for an empty cell."""
    text = _text(cell)
    if is_unknown(text):
        return UNKNOWN
    value = text.lower()
    if _OFFLOAD.search(value):
        layers = re.search(r"([0-9]+)", value)
        return "offload", None, int(layers.group(1)) if layers else None
    if value in _RECOMPUTE_NONE:
        return None, None, None
    if _RECOMPUTE_SELECTIVE.match(value):
        return "selective", None, None
    if _RECOMPUTE_FULL.match(value):
        method = re.search(r"(uniform|block)", value)
        layers = re.search(r"(?:num_layers\s*=\s*|layers?\s*[=:]?\s*|(?:uniform|block)\s*[,=:]?\s*)([0-9]+)", value)
        return "full", method.group(1) if method else "uniform", int(layers.group(1)) if layers else 1
    raise CellError(f"{text!r} is not none/selective/full")


# How tables write a token dispatcher ('All-to-All', 'AllGather', 'DeepEP'), squashed -> the knob's value.
_DISPATCHERS = {"alltoall": "alltoall", "a2a": "alltoall", "allgather": "allgather", "ag": "allgather",
                "flex": "flex", "deepep": "flex", "hybridep": "flex"}


def parse_dispatcher(cell: str | None) -> Any:
    """'All-to-All' -> alltoall, 'allgather' -> allgather, 'DeepEP' / 'flex' -> flex."""
    text = _text(cell)
    if is_unknown(text):
        return UNKNOWN
    value = _DISPATCHERS.get(re.sub(r"[^a-z0-9]", "", _main(text)))
    if value is None:
        raise CellError(f"{text[:40]!r} is not allgather, alltoall or flex (DeepEP)")
    return value


def parse_result(cell: str | None) -> Any:
    text = _text(cell)
    if is_unknown(text):
        return UNKNOWN
    value = _main(text)
    for result, words in _RESULT.items():
        if value in words or any(value.startswith(w) for w in words if len(w) > 3):
            return result
    raise CellError(f"{text!r} is not ok, oom or error")


def parse_precision(cell: str | None) -> Any:
    """'BF16' -> bf16, 'fp16/mixed' -> fp16, 'MXFP8' / 'FP8-CS' / 'fp8 (hybrid) over bf16' -> fp8;
    CellError for a precision the model does not cover (NVFP4, any fp4, fp32/tf32)."""
    text = _text(cell)
    if is_unknown(text):
        return UNKNOWN
    value = text.lower()
    if "fp4" in value or "int4" in value:
        raise CellError(f"{text!r} is not modelled (we model bf16, fp16, fp8)")
    if "fp8" in value or "e4m3" in value:  # before bf16: "fp8 (hybrid, ...) over bf16" trains in fp8
        return "fp8"
    if "bf16" in value or "bfloat16" in value:
        return "bf16"
    if "fp16" in value or "float16" in value or value in ("half", "mixed", "amp"):
        return "fp16"
    raise CellError(f"{text!r} is not modelled (we model bf16, fp16, fp8)")


# ASCII digits only, as the spec reader takes them: '٢' and '２' are digits to `\d` and float() alike.
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", re.ASCII)
_INFINITE = re.compile(r"[-+]?(?:inf|infinity|∞)")
# Digits with commas between them: thousands separators ('1,234.5') or a decimal comma ('38,4').
_DIGIT_COMMAS = re.compile(r"\d+(?:,\d+)+(?:\.\d*)?", re.ASCII)
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d*)?", re.ASCII)


def _comma_read(found: re.Match) -> str:
    """'1,234.5' -> '1234.5'; '38,4' -> '38.4' (no group of three digits after the comma: a decimal
    comma, as European tables write one); anything else ('1,23,4') names no one number."""
    digits = found.group(0)
    if _THOUSANDS.fullmatch(digits):
        return digits.replace(",", "")
    if digits.count(",") == 1 and "." not in digits:
        return digits.replace(",", ".")
    raise CellError(f"{digits[:40]!r} is neither a number with thousands separators nor one decimal comma")
_SCALE = {"k": 1e3, "m": 1e6, "b": 1e9}
# A count's scale is binary: '2K' tokens or samples, '16K' GPUs, '128K' context are 2048, 16384, 131072.
_COUNT_SCALE = {"k": 2**10, "m": 2**20, "b": 1e9}
# Digit groups of three after a space, a narrow or no-break space or an apostrophe: thousands separators
# ('250 880', "14'336"), joined before the number is read (it was read as its first group: 250).
_SEPARATORS = re.compile(r"[ \u00a0\u2009\u202f'\u2019]")
_GROUPED = re.compile(rf"(?<![0-9.,])[0-9]{{1,3}}(?:{_SEPARATORS.pattern}[0-9]{{3}})+(?![0-9])")
# A clock time, m:ss or h:mm:ss ('2:03.69' is 123.69 s).
_CLOCK = re.compile(r"(?:([0-9]+):)?([0-9]+):([0-5][0-9](?:\.[0-9]*)?)", re.ASCII)
# What no decimal is followed by: another decimal point ('1.2.3', a version), a colon (a clock time
# where no time is read) or a radix ('0x10', 0b1).
_GLUED = re.compile(r"[.:][0-9]", re.ASCII)
_RADIX = re.compile(r"[xob][0-9a-f]", re.ASCII)


@lru_cache(maxsize=4096)  # a table repeats its cells; 20,000 rows took 6 s
def parse_number(cell: str | None, unit: str = "", header_unit: str = "", *, count: bool = False) -> Any:
    """A number as tables write it: '1,234.5', '250 880', '~12', '45%', '39.9k', '850 ms', '2:03.69',
    '80 GB', '1.2 TB'. `unit` says what the column holds ('s', 'gib', 'fraction', 'tflops'); a unit
    in the cell is converted to it, else the unit its header states (`header_unit`: 'Step time
    (ms)', 'MFU (%)'), once: a cell '850 ms' under 'Step time (ms)' is 0.85 s, not 0.00085. A
    `count`'s K and M are binary ('2K' is 2048)."""
    text = _GROUPED.sub(lambda m: _SEPARATORS.sub("", m.group(0)), _text(cell)).replace("\u2212", "-")  # and − is -
    if is_unknown(text):
        return UNKNOWN
    cleaned = _DIGIT_COMMAS.sub(_comma_read, text).replace(",", " ").replace("≈", "").replace("~", "").strip().lower()
    if _INFINITE.fullmatch(cleaned):
        raise NotFinite(f"{text[:40]!r} is not a finite number")
    clock = _CLOCK.fullmatch(cleaned) if unit == "s" else None
    if clock:
        hours, minutes, seconds = clock.groups()
        return int(hours or 0) * 3600.0 + int(minutes) * 60.0 + float(seconds)
    found = _NUMBER.search(cleaned)
    if not found:
        raise CellError(f"{text!r} is not a number")
    if _GLUED.match(cleaned, found.end()) or (found.group(0) == "0" and _RADIX.match(cleaned, found.end())):
        raise CellError(f"{text[:40]!r} is not one decimal number")
    value = float(found.group(0))
    if not math.isfinite(value):  # '1e999', or 400 digits: no measurement or count is that large
        raise NotFinite(f"{text[:40]!r} is not a finite number")
    rest = cleaned[found.end():].strip()
    scales = _COUNT_SCALE if count else _SCALE
    if rest[:1] in scales and not rest.startswith(("mb", "ms", "min", "gb", "gib", "mib", "b/")):
        value *= scales[rest[0]]
        rest = rest[1:].strip()
    if not rest:
        rest = header_unit.strip().lower()
    if unit == "s":
        if rest.startswith("ms"):
            value /= 1000.0
        elif rest.startswith(("min", "m ")):
            value *= 60.0
    elif unit == "gib":
        if rest.startswith(("mib", "mb")):
            value /= 1024.0
        elif rest.startswith("gb") and not rest.startswith("gib"):
            value *= 1e9 / 2**30 if "decimal" in rest else 1.0  # tables mean GiB by "GB" almost always
        elif rest.startswith(("tb", "tib")):
            value *= 1024.0
    elif unit == "tflops":
        if rest.startswith("pflop"):
            value *= 1000.0
        elif rest.startswith("gflop"):
            value /= 1000.0
    elif unit == "fraction":
        # A percentage by its cell or header; a bare number above 1.5 can only be one (a fraction
        # that large is impossible). Under a '%' header 0.97 is 0.97 %: Megatron-LM's CI tables of
        # small models on large GPUs sit below 1 %.
        if rest.startswith("%") or (not rest and value > 1.5):
            value /= 100.0
    return value


class WrongNumber(CellError):
    """A cell that is a number, but no count: too large to be finite, negative, or a fraction. A row
    with one is wrong, not vague: unlike a word ('auto'), it is never read as unknown."""


class ZeroCount(CellError):
    """A count of 0: 'none' in some columns (VPP, experts), wrong in the others; the reader decides."""


# The largest count read exactly (2^53): past it a float has lost digits, and no layer, GPU or batch
# count comes near it.
MAX_COUNT = 2**53


def parse_int(cell: str | None, *, binary: bool = True) -> Any:
    """A positive count ('8K' is 8192 unless not `binary`). A 0 raises ZeroCount: some columns write 0
    for 'none' (VPP, experts), and the reader decides by column."""
    try:
        value = parse_number(cell, count=binary)
    except NotFinite as err:  # a preset's value must not stand in for it
        raise WrongNumber(str(err)) from None
    if value is UNKNOWN:
        return UNKNOWN
    if value < 0 or value != int(value):
        raise WrongNumber(f"{_text(cell)[:40]!r} is not a positive integer")
    if value > MAX_COUNT:  # read through a float: its last digits are already lost
        raise WrongNumber(f"{_text(cell)[:40]!r} is larger than any count a table holds")
    if value == 0:
        raise ZeroCount(f"{_text(cell)!r} is not a positive integer")
    return int(value)


# -- headers -----------------------------------------------------------------------------------

_HEADER_SYNONYMS: dict[str, tuple[str, ...]] = {
    "model": ("model_name", "name", "model_size", "arch", "architecture"),
    "num_layers": ("layers", "n_layers", "num_hidden_layers", "nlayers"),
    "hidden_size": ("hidden", "d_model", "hidden_dim", "emb_size", "nhidden"),
    "num_attention_heads": ("heads", "attention_heads", "n_heads", "num_heads", "nheads"),
    "num_query_groups": ("query_groups", "kv_heads", "num_kv_heads", "num_key_value_heads", "gqa_groups", "groups"),
    "ffn_hidden_size": ("ffn", "ffn_size", "intermediate_size", "mlp_hidden_size", "ffn_dim"),
    "vocab_size": ("vocab", "vocabulary", "vocabulary_size", "padded_vocab_size"),
    # NeMo's fine-tuning tables give the length of the packed samples ("Packed Sequence Length").
    "seq_length": ("seq_len", "sequence_length", "seqlen", "seq", "context_length", "packed_sequence_length"),
    "num_experts": ("experts", "n_experts", "num_moe_experts", "moe_experts"),
    "topk": ("top_k", "moe_topk", "moe_router_topk", "router_topk"),
    "gpu": ("gpu_type", "accelerator", "device", "hardware", "system"),
    "num_gpus": ("gpus", "n_gpus", "num_gpu", "world_size", "ngpus", "gpu_count", "#_gpus", "#gpus", "number_of_gpus",
                 "num_of_gpus", "total_gpus"),
    "dp": ("data_parallel", "data_parallel_size", "dp_size"),
    "gbs": ("global_batch_size", "global_batch", "batch_size", "glob_bs"),
    "mbs": ("micro_batch_size", "micro_batch", "mic_bs"),
    # Gradient accumulation: micro-batches per step and data-parallel rank (NeMo's and Megatron-Bridge's
    # 'GA' column); GBS = MBS·DP·GA, so with the others it derives or checks the layout.
    "ga": ("gradient_accumulation", "gradient_accumulation_steps", "grad_accum", "grad_accumulation",
           "grad_accum_steps", "grad_acc", "accumulation_steps", "num_microbatches", "num_micro_batches"),
    "precision": ("dtype", "data_type", "fp_format"),
    "distributed_optimizer": ("dist_opt", "distopt", "zero", "zero_stage", "use_distributed_optimizer",
                              "distributed_opt"),
    "recompute": ("ac", "activation_checkpointing", "recompute_granularity", "activation_recompute",
                  "checkpointing", "recomputation"),
    "sequence_parallel": ("sp",),
    "result": ("status", "outcome", "ran", "success"),
    "tflops_per_gpu": ("tflops", "tflops_gpu", "model_tflops_per_gpu", "tflop_s_gpu", "tflops_per_sec_per_gpu",
                       "model_tflop_sec_gpu", "model_tflops_sec_gpu", "tflops_sec_gpu", "throughput_tflops"),
    # 'Percentage of theoretical peak FLOP/s' (Megatron-LM's README table): model FLOPs over the peak.
    "mfu": ("model_flops_utilization", "percentage_of_theoretical_peak_flop_s", "percentage_of_theoretical_peak",
            "percentage_of_peak", "percent_of_peak", "of_peak", "of_theoretical_peak"),
    "step_time_s": ("step_time", "iteration_time", "latency_per_iteration", "seconds_per_iteration", "sec_it", "s_it",
                    "sec_iter", "s_iter", "secs_per_iter", "time_per_step", "iter_time", "step_time_sec",
                    "time_per_iteration", "elapsed_time_per_iteration", "latency", "iteration_latency",
                    "step_latency", "time_per_global_step", "global_step_time"),
    "tokens_per_s_per_gpu": ("tgs", "tokens_per_sec_per_gpu", "tokens_s_gpu", "tokens_per_second_per_gpu",
                             "throughput_per_gpu", "tokens_sec_gpu", "tokens_second_gpu", "tok_s_gpu"),
    "mem_max_gib": ("memmax", "max_memory", "peak_memory", "mem_max", "memory", "mem_gib", "max_mem", "mem_max_gb",
                    "peak_mem", "mem", "max_memory_allocated", "max_memory_reserved", "peak_memory_usage", "memory_usage"),
    # Parallel sizes as tables spell them out ("Tensor Parallel", "VP"); the knob registry names the rest.
    "tp": ("tensor_parallel", "tensor_parallelism", "tensor_parallel_size", "tp_size"),
    "pp": ("pipeline_parallel", "pipeline_parallelism", "pipeline_parallel_size", "pp_size"),
    "cp": ("context_parallel", "context_parallelism", "context_parallel_size", "cp_size"),
    "ep": ("expert_parallel", "expert_parallelism", "expert_parallel_size", "ep_size"),
    "vpp": ("vp", "virtual_pipeline", "virtual_pipeline_parallel", "virtual_pipeline_size", "vp_size"),
    # MoE settings tables state beside the layout (NeMo's 'Dispatcher' column); read as the row's
    # Megatron arguments would state them, and over them.
    "moe_token_dispatcher_type": ("dispatcher", "token_dispatcher", "moe_dispatcher", "moe_token_dispatcher"),
    "moe_grouped_gemm": ("grouped_gemm",),
    # Read to refuse the row: Megatron-FSDP / FSDP2 shard more than the distributed optimizer.
    "fsdp": ("fsdp_size", "fsdp_degree", "megatron_fsdp", "fsdp2", "fully_sharded"),
    "source": ("reference", "ref", "citation", "url"),
    "notes": ("note", "comment", "comments", "remarks"),
}


def _key(header: str) -> str:
    text = re.sub(r"\(.*?\)|\[.*?\]|%", "", header).strip().lower()
    return re.sub(r"[\s\-/.]+", "_", text).strip("_")


def canonical_header(header: str) -> str | None:
    """The replay column a header names ('TP' -> tp, 'Micro Batch Size' -> mbs, 'MFU (%)' -> mfu,
    'expert_tensor_parallel_size' -> etp), or None for a column the format does not know."""
    key = _key(header)
    if key == "throughput":  # by what its unit counts: 'Throughput (TFLOP/s/GPU)', 'Throughput (tokens/s/GPU)'
        unit = header_unit(header)
        return "tflops_per_gpu" if "flop" in unit else "tokens_per_s_per_gpu" if "tok" in unit and "gpu" in unit \
            else None
    for form in _header_forms(key):
        if form in _HEADER_SYNONYMS:
            return form
        for column, names in _HEADER_SYNONYMS.items():
            if form in names:
                return column
        for k in KNOBS:  # knob columns: the registry's csv name, field name, aliases, paper name
            if k.csv and form in (k.csv, k.name, k.paper.lower(), *k.aliases):
                return k.csv
    return None


# How papers and READMEs spell what the synonyms name: a unit spelled out ('teraFLOP/s', 'TFLOP/sec'),
# a qualifier before the quantity ('Achieved', 'total', 'paper-reported'), a count as 'Number of X'.
_SPELLINGS = ((re.compile(r"teraflop"), "tflop"), (re.compile(r"tflops?_s(?:ec)?(?=_|$)"), "tflops"),
              (re.compile(r"_iter$"), "_iteration"), (re.compile(r"flop_utili[sz]ation"), "flops_utilization"),
              (re.compile(r"^(?:seconds|latency|time)_per_(?:iteration|step)$"), "step_time"))
# Not before memory: an average is no peak, and a 'total memory' is the GPU's.
_QUALIFIER = re.compile(r"^(?:achieved|measured|reported|paper_reported|observed|average|avg|mean|total|training|"
                        r"overall|effective)_(?!mem)")
_COUNT_OF = re.compile(r"^(?:number_of|num_of|no_of|#_of|#|count_of)_")


def _header_forms(key: str) -> list[str]:
    """`key` as written, then with units spelled as the synonyms spell them, qualifiers dropped and
    'number of X' read as X, in that order; the first form a column names wins."""
    forms = [key]
    form = key
    for _ in range(3):  # 'total num. of GPUs': a qualifier, then a count
        form = _QUALIFIER.sub("", form)
        for pattern, replacement in _SPELLINGS:
            form = pattern.sub(replacement, form)
        form = _COUNT_OF.sub("", form)
        forms.append(form)
    return forms


def header_unit(header: str) -> str:
    """The unit a header states in parentheses or brackets ('step time (ms)' -> 'ms', 'Peak memory
    [GiB]' -> 'gib'), or '%' for 'MFU %'; lower-cased."""
    found = re.search(r"\(([^)]*)\)|\[([^\]]*)\]", header)
    if found:
        return (found.group(1) if found.group(1) is not None else found.group(2)).strip().lower()
    return "%" if "%" in header else ""


# A figure of a pair: a number (separators, a sign, an exponent) and what follows it, a unit or nothing.
_PAIRED_FIGURE = re.compile(r"[-+]?[0-9][0-9., ]*(?:[eE][-+]?[0-9]+)?\s*([%a-zA-Z/]{0,12})", re.ASCII)


def figure_pair(cell: str) -> tuple[str, str] | None:
    """A cell holding two runs' figures, NeMo's way ('1 (0)', '31737 (30341)'): (first, second), else None.
    Read with string operations: the pattern this was took minutes on a cell of spaces and digits."""
    text = cell.strip()
    if not text.endswith(")") or text.count("(") != 1 or text.count(")") != 1:
        return None
    first, _, second = text[:-1].partition("(")
    first, second = first.strip(), second.strip()
    # Two figures of one unit ('850 ms (900 ms)', '31737 (30341)'): '384 (48x8)' and '384 (48 nodes)'
    # are one count with a note.
    one, two = _PAIRED_FIGURE.fullmatch(first), _PAIRED_FIGURE.fullmatch(second)
    if not one or not two or two.group(1).lower() not in ("", one.group(1).lower()):
        return None
    return first, second

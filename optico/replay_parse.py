"""One replay row's cells read into a `ReplayRow` — tolerantly.

One row is one measured run. The replay launcher answers from these rows, the
performance model is evaluated against them, and the tuner benchmark replays them as
landscapes, so all three must read a cell the same way. The reading is in six modules, one job
each: the cells as sources write them (`optico.replay_cells`: "TP", "Micro Batch Size",
"zero-1 (deepspeed)", "true (zero1)", "none stated", "45 %", "850 ms"); the format, what an
empty cell means and a parsed row (`optico.replay_format`); what names and words say
(`optico.replay_names`); this module, a row: what it still tells when a cell is unknown
(`ReplayRow.unknown`, `variants`) and which rows cannot be used at all and why
(`ReplayRow.skip_reason`); what a row measured, as one comparable MFU
(`optico.replay_measured.measured_mfu`); and whole files with a report each (`optico.replay_csv`),
where a bad row is skipped with its file:line reason, never fatal — unless `strict`.

Rules that are decisions rather than parsing, in one place:

- Unknown, not guessed: a cell the source does not give and for which neither Megatron-LM
  nor the source has a default (micro-batch, TP, PP, number of GPUs, global batch, vocabulary,
  sequence length) is kept as unknown with its plausible values; the row is read, and each
  figure it could inform (fit/OOM, memory, MFU) is scored only where those values agree on it
  (`optico.perfmodel.evaluate`). It is never replayed (`ReplayRow.usable` is False).
- Derived, not guessed: num_gpus = dp·TP·PP·CP when the dp cell is given; from the gradient
  accumulation (a GA column, or GA=8 in the notes), num_gpus = gbs / (MBS·GA)·TP·PP·CP or
  mbs = gbs / (DP·GA), whichever the row leaves out (a GA the other cells contradict is said in
  `inferred` and not used: the figures rest on the batch and layout, not on it); ETP from the notes
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

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, get_args

from pydantic import ValidationError

from optico.errors import loc_fields
from optico.gpus import GPUS, Precision, normalize_gpu_name
from optico.knobs import BY_NAME, KNOBS
from optico.parallel import ParallelDims
from optico.replay_cells import (
    UNKNOWN,
    CellError,
    NotFinite,
    WrongNumber,
    ZeroCount,
    figure_pair,
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
from optico.replay_format import (
    ARCHITECTURE,
    INT_CELLS,
    MEASURED,
    MEASURED_UNITS,
    UNKNOWN_DOMAINS,
    WIDTH_ARGS,
    ZERO_IS_NONE,
    ReplayDefaults,
    ReplayRow,
)
from optico.replay_measured import IMPOSSIBLE, figures_set_aside, impossible_measurement
from optico.replay_names import (
    counts_recompute_flops,
    full_attention_count,
    gated_name,
    gpt3_style,
    matching_preset,
    preset_by_name,
    special_architecture,
    ungated_name,
)
from optico.rules import violations
from optico.strategy import Strategy
from optico.workload import AttentionBackend, Cluster, CrossEntropyFusionImpl, ModelArch, Workload

# GPUs whose "node" is an NVL72 rack (see the module docstring).
NVL72_GPUS = frozenset({"gb200", "gb300"})
# GPUs a job over several NVL72 racks is read to use per rack: 16 of the 18 trays, so groups of a power
# of two ranks stay inside one rack's NVLink. Read as all 72, a 16-, 32- or 64-rank group straddled two
# racks and was costed on the network (Megatron-Bridge's multi-rack GB200/GB300 rows: MFU MdAPE 14.1 ->
# 20.9 %).
NVL72_GPUS_USED = 64
# Said of a cell pairing two runs' figures ('31737 (30341)'): the first is read.
FIRST_OF_PAIR = "the first figure read, the one in parentheses not"


# -- cells (kept for callers of the old names) ---------------------------------------------------

def parse_precision(text: str, default: Precision) -> Precision | None:
    """'BF16' -> bf16, 'MXFP8' -> fp8; `default` for an empty cell; None for an unmodelled one."""
    try:
        value = _parse_precision_cell(text)
    except CellError:
        return None
    return default if value is UNKNOWN else value


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


def _cross_entropy_fusion_impl(args: dict[str, str] | None) -> CrossEntropyFusionImpl:
    """The fused cross entropy's kernel as the run's arguments state it ('native', megatron-core's
    default, if not)."""
    impl = (args or {}).get("cross-entropy-fusion-impl", "native")
    return impl if impl in get_args(CrossEntropyFusionImpl) else "native"


def _note_int(notes: str, name: str) -> int | None:
    """'ETP=4; GA=8' -> 4 for ETP; 'GA (grad accumulation) = 16' -> 16 for GA. The first statement wins:
    the transcriber's own comes before a quoted source row, whose 'GA=1 (16)' is its first run's."""
    found = re.search(rf"\b{name}(?:[ \t]*\([^()]{{0,40}}\))?[ \t]*=[ \t]*(\d+)\b", notes)
    return int(found.group(1)) if found else None


def _count(text: str) -> int | None:
    """An argument's value as a count: ASCII digits only ('²' is a digit to str.isdigit, not to int),
    and few enough of them to be one."""
    return int(text) if re.fullmatch(r"[0-9]{1,9}", text) else None


def _is_true(text: str | None) -> bool:
    return (text or "").lower() == "true"


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
            self.inferred.append(f"{name} {cell.strip()[:40]!r}: {FIRST_OF_PAIR}")

    def integer(self, name: str) -> int | None:
        self._paired(name)
        try:
            # A vocabulary's K is decimal ("32K": Llama 2's 32,000); a layer, batch or GPU count's binary.
            value = parse_int(self.cells.get(name), binary=name != "vocab_size")
        except WrongNumber as err:
            self.wrong(f"{name} {err}")
            return None
        except ZeroCount as err:
            if name in ZERO_IS_NONE:
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
        unit = MEASURED_UNITS.get(name, "")
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
    special = special_architecture(name, p.text("notes"))
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
    swiglu = ("swiglu" in text.lower() or gated_name(name)) or not (ffn == 4 * hidden or ungated_name(name))
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
        untie_embeddings_and_output_weights=not gpt3_style(name))
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
    cell = "sequence_parallel"  # the column read when a cell is refused: the error names it
    try:
        sp = parse_bool(p.cells.get(cell))
        cell = "distributed_optimizer"
        dist_opt = parse_distributed_optimizer(p.cells.get(cell))
    except CellError as err:
        p.problems.append(f"{cell} {err}")
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
    """(num_gpus, gbs, mbs): read, derived (dp cell, gradient accumulation), or unknown with plausible
    values. Gradient accumulation (a GA column, or GA=8 in the notes) derives what is missing of
    GBS = MBS·DP·GA (Megatron runs no other layout); when nothing is missing, a GA that disagrees is said."""
    mp = s.model_parallel_size
    world, gbs, mbs = ints["num_gpus"], ints["gbs"], ints["mbs"]
    ga = ints["ga"] or _note_int(p.text("notes"), "GA")
    if world is None and ints["dp"]:
        world = ints["dp"] * mp
        p.inferred.append(f"num_gpus = dp·TP·PP·CP = {world}")
    if world is None and gbs and mbs and ga and gbs % (mbs * ga) == 0:
        world = gbs // (mbs * ga) * mp
        p.inferred.append(f"num_gpus = gbs / (MBS·GA)·TP·PP·CP = {world}")
    if world is None:
        choices = [mp * k for k in UNKNOWN_DOMAINS["dp"]]
        p.unknown["num_gpus"] = choices
        world = choices[0]
    dp = max(1, world // mp)
    if mbs is None and gbs and ga:
        if gbs % (dp * ga) == 0 and "num_gpus" not in p.unknown:
            mbs = gbs // (dp * ga)
            p.inferred.append(f"mbs = gbs / (DP·GA) = {mbs}")
    elif gbs and mbs and ga and "num_gpus" not in p.unknown and world % mp == 0 and gbs != mbs * dp * ga:
        # Published tables have such rows (Megatron-Bridge's, 3 of 200): the redundant cell is the
        # suspect one, not the layout and batch the figures rest on, so the row is read and says so.
        p.inferred.append(f"GA disagrees, not used: gbs {gbs} but MBS·DP·GA = {mbs}·{dp}·{ga} = {mbs * dp * ga}")
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
    ints = {k: p.integer(k) for k in INT_CELLS}
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
                                    attention_backend=_attention_backend(args),
                                    cross_entropy_fusion_impl=_cross_entropy_fusion_impl(args))
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
    set_aside = figures_set_aside(row)
    return row.model_copy(update={"inferred": [*row.inferred, *set_aside]}) if set_aside else row


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

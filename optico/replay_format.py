"""The replay CSV format (docs/perfmodel.md, "Reading measured tables"): its columns, what an empty cell means
(`ReplayDefaults`) and a parsed row (`ReplayRow`). `optico.replay_parse` reads one row into it,
`optico.replay_csv` whole files, `optico.replay_measured` says what a row measured, and
`optico.replay_rows` writes rows."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from optico.gpus import Precision
from optico.strategy import Strategy
from optico.workload import Workload

Result = Literal["ok", "oom", "error"]

# The columns of the format, in its order. A file may have more, or fewer: a missing
# column reads as empty cells and the file's report lists it.
COLUMNS: tuple[str, ...] = (
    "model", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
    "vocab_size", "seq_length", "num_experts", "topk", "gpu", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp",
    "mbs", "gbs", "recompute", "precision", "sequence_parallel", "distributed_optimizer", "result",
    "tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib", "source", "notes",
)
# The architecture: without these (and with no preset by name) a row says nothing we can model.
ARCHITECTURE: tuple[str, ...] = ("num_layers", "hidden_size", "num_attention_heads")
# Widths no column holds, stated in the notes' args (Megatron-LM flag -> ModelArch field): a model cut
# from a preset (fewer layers) matches none, so its row is the only place they are said.
WIDTH_ARGS: dict[str, str] = {"kv-channels": "kv_channels", "moe-ffn-hidden-size": "moe_ffn_hidden_size",
                              "moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size"}
INT_CELLS: tuple[str, ...] = (
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size", "vocab_size",
    "seq_length", "num_experts", "topk", "num_gpus", "tp", "pp", "dp", "cp", "ep", "vpp", "mbs", "gbs",
    "etp", "first_pp_layers", "last_pp_layers", "ga",
)
# Counts a table writes as 0 for 'none' (no interleaving, no experts, no GQA): read as unknown. A 0 in
# any other count (layers, GPUs, TP, batch) is a wrong cell: nothing ran with it.
ZERO_IS_NONE: frozenset[str] = frozenset({"num_query_groups", "num_experts", "topk", "cp", "ep", "vpp", "etp",
                                           "first_pp_layers", "last_pp_layers"})
MEASURED: tuple[str, ...] = ("tflops_per_gpu", "mfu", "step_time_s", "tokens_per_s_per_gpu", "mem_max_gib")
MEASURED_UNITS = {"mfu": "fraction", "step_time_s": "s", "mem_max_gib": "gib", "tflops_per_gpu": "tflops"}

# Plausible values of a cell the source does not give (see `optico.replay_parse`).
UNKNOWN_DOMAINS: dict[str, tuple[int, ...]] = {
    "mbs": (1, 2, 4), "tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8), "gbs_per_dp": (1, 8, 64),
    "dp": (1, 2, 4, 8, 16, 32), "vocab_size": (32000, 50304, 128256, 151936, 256000),
    "seq_length": (2048, 4096, 8192),
}


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

"""The Megatron-LM adapter: the user's own training command with the strategy's flags in
place of theirs, and the metrics read back from Megatron-LM's log lines.

Rendering (`render_args`): every flag a Strategy controls is removed from the user's
command, with its value, in either spelling (`--flag value` or `--flag=value`), and the
strategy's flags (`Strategy.megatron_args`) are appended; so are the workload's global batch
size, a short run (`--train-iters`, or `--train-samples` for a sample-based command),
`--log-interval`, `--eval-iters 0` and `--log-throughput`. Flags in `drop_flags` (checkpoint
`--save`/`--load` by default) are removed. The model shape, sequence length and fused
cross entropy's kernel (`--cross-entropy-fusion-impl`) stay the user's, but must agree with the
workload: a mismatch is a configuration error, raised; the kernel is then written as
`Strategy.run_args` writes it (`te` with the fusion on; nothing for Megatron-LM's default, `native`).

Parsing (`parse_log`, `metrics_from_log`): the two lines Megatron-LM prints, tolerant of
fields it adds or drops between versions and of any prefix (timestamps, torchrun's
``[default0]:``)::

     [2025-01-01 12:00:00.000000] iteration        5/      20 | consumed samples: 40 |
       elapsed time per iteration (ms): 812.3 | throughput per GPU (TFLOP/s/GPU): 401.2 |
       learning rate: 1.0E-04 | global batch size:     8 | lm loss: 9.1E+00 | loss scale: 1.0 |
       grad norm: 3.2 | number of skipped iterations:   0 | number of nan iterations:   0 |
    [Rank 0] (after 5 iterations) memory (MB) | allocated: 1024.0 | max allocated: 2048.0 |
       reserved: 3072.0 | max reserved: 3072.0

(each one line). Iteration lines come from the last rank, memory lines from each rank of
data-parallel rank 0.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from optico.knobs import owned_flags
from optico.strategy import Strategy
from optico.workload import Workload

# Flags a Strategy owns (every knob's, from the registry: both VPP spellings, the old switch for
# selective recompute), and the flags of the run itself.
_KNOB_VALUE_FLAGS, _KNOB_SWITCHES = owned_flags()
VALUE_FLAGS = tuple(sorted(_KNOB_VALUE_FLAGS)) + (
    "--global-batch-size", "--train-iters", "--train-samples", "--log-interval", "--eval-iters",
    "--cross-entropy-fusion-impl")  # checked against the workload, then written by `Strategy.run_args`
BOOL_FLAGS = tuple(sorted(_KNOB_SWITCHES)) + ("--log-throughput",)
# Workload facts the user's command states; they must agree with the spec's workload.
_SHAPE_FLAGS = {
    "--seq-length": lambda w: w.seq_length,
    "--num-layers": lambda w: w.model.num_layers,
    "--hidden-size": lambda w: w.model.hidden_size,
    "--num-attention-heads": lambda w: w.model.num_attention_heads,
    "--cross-entropy-fusion-impl": lambda w: w.cross_entropy_fusion_impl,
}


def _flag_name(token: str) -> str:
    return token.split("=", 1)[0] if token.startswith("--") else token


def _is_value(token: str) -> bool:
    """A token that is an option's value rather than the next option (negative numbers are values)."""
    return not token.startswith("-") or bool(re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?", token))


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """Every `--flag`'s values in `argv` (the last occurrence wins for repeated flags)."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        if token.startswith("--"):
            name = _flag_name(token)
            if "=" in token:
                out[name] = [token.split("=", 1)[1]]
                i += 1
                continue
            values = []
            j = i + 1
            while j < len(argv) and _is_value(argv[j]):
                values.append(argv[j])
                j += 1
            out[name] = values
            i = j
        else:
            i += 1
    return out


def strip_flags(argv: list[str], value_flags: set[str], bool_flags: set[str],
                other_flags: set[str] = frozenset()) -> list[str]:
    """`argv` without the given flags: value flags with one value, bool flags alone, other
    flags with every value up to the next option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = _flag_name(token)
        if name in value_flags:
            i += 1 if "=" in token else 2
        elif name in bool_flags:
            i += 1
        elif name in other_flags:
            i += 1
            if "=" not in token:
                while i < len(argv) and _is_value(argv[i]):
                    i += 1
        else:
            out.append(token)
            i += 1
    return out


def strategy_flags(workload: Workload, strategy: Strategy, vpp_flag: str = "stages") -> list[str]:
    """The strategy as Megatron-LM flags on `workload` (`Strategy.run_args`); `vpp_flag='layers'` writes
    VPP the old way (--num-layers-per-virtual-pipeline-stage) for Megatron-LM before the flag was renamed."""
    args = strategy.run_args(workload)
    if vpp_flag == "layers" and "--num-virtual-stages-per-pipeline-rank" in args:
        i = args.index("--num-virtual-stages-per-pipeline-rank")
        s = strategy
        if s.decoder_first_pipeline_num_layers or s.decoder_last_pipeline_num_layers:
            raise ValueError("launcher.program.vpp_flag: 'layers' cannot state VPP with uneven first/last pipeline "
                             "stages (Megatron-LM needs --num-virtual-stages-per-pipeline-rank there)")
        counted = s.account_for_embedding_in_pipeline_split + s.account_for_loss_in_pipeline_split
        per_stage = (workload.model.num_layers + counted) // (s.pp * s.vpp)
        args[i:i + 2] = ["--num-layers-per-virtual-pipeline-stage", str(per_stage)]
    return args


def render_args(user_argv: list[str], workload: Workload, strategy: Strategy, *, train_iters: int | None,
                log_interval: int | None, skip_eval: bool, drop_flags: list[str], vpp_flag: str) -> list[str]:
    """The user's command with the strategy's flags replacing theirs; see the module docstring.

    Raises ValueError when the command states a model shape or sequence length other than
    the workload's, or is a torchrun command line (the launcher runs torchrun)."""
    if not user_argv:
        raise ValueError("launcher.program.command: empty; give the training script and its flags")
    head = user_argv[0].rsplit("/", 1)[-1]
    if head == "torchrun" or "torch.distributed.run" in user_argv[:3] or "torch.distributed.launch" in user_argv[:3]:
        raise ValueError("launcher.program.command: give the training script and its flags (e.g. "
                         "[pretrain_gpt.py, --num-layers, ...]) without torchrun; the launcher runs torchrun")
    given = flag_values(user_argv)
    for flag, want in _SHAPE_FLAGS.items():
        values = given.get(flag)
        if values and values[0] != str(want(workload)):
            raise ValueError(f"launcher.program.command: {flag} {values[0]} disagrees with the workload "
                             f"({want(workload)}); the workload must describe the command")
    sample_based = "--train-samples" in given and "--train-iters" not in given
    out = strip_flags(user_argv, set(VALUE_FLAGS), set(BOOL_FLAGS), set(drop_flags))
    out += strategy_flags(workload, strategy, vpp_flag)
    out += ["--global-batch-size", str(workload.global_batch_size)]
    if train_iters is not None:
        if sample_based:  # iteration-based flags would trip Megatron-LM's sample-based checks
            out += ["--train-samples", str(train_iters * workload.global_batch_size)]
        else:
            out += ["--train-iters", str(train_iters)]
    else:
        for flag in ("--train-iters", "--train-samples"):
            if flag in given:
                out += [flag, *given[flag]]
    if log_interval is not None:
        out += ["--log-interval", str(log_interval)]
    elif "--log-interval" in given:
        out += ["--log-interval", *given["--log-interval"]]
    if skip_eval:
        out += ["--eval-iters", "0"]
    elif "--eval-iters" in given:
        out += ["--eval-iters", *given["--eval-iters"]]
    return out + ["--log-throughput"]


# ---------------------------------------------------------------------------------------
# the log

_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MEMORY = re.compile(r"\[Rank\s+(\d+)\]\s*\(after\s+(\d+)\s+iterations?\)\s*memory\s*\(MB\)\s*\|(.*)$", re.I)
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf", re.I)


def _fields(rest: str) -> dict[str, str]:
    """'a: 1 | b c (x): 2 |' -> {'a': '1', 'b c (x)': '2'}; keys lower-cased."""
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    m = _NUMBER.search(text)
    return float(m.group(0)) if m else None


@dataclass(frozen=True)
class IterationLine:
    iteration: int
    train_iters: int
    step_time_s: float | None
    tflops_per_gpu: float | None
    global_batch_size: int | None
    loss: float | None
    skipped: int
    nan: int
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryLine:
    rank: int
    after: int
    allocated_mb: float | None
    max_allocated_mb: float | None
    reserved_mb: float | None
    max_reserved_mb: float | None


@dataclass
class MegatronLMLog:
    iterations: list[IterationLine] = field(default_factory=list)
    memory: list[MemoryLine] = field(default_factory=list)


def _lookup(fields: dict[str, str], *needles: str, exclude: tuple[str, ...] = ()) -> tuple[str, str] | None:
    for key, value in fields.items():
        if all(n in key for n in needles) and not any(x in key for x in exclude):
            return key, value
    return None


def parse_iteration(line: str) -> IterationLine | None:
    m = _ITERATION.search(line)
    if not m:
        return None
    fields = _fields(m.group(3))
    step = None
    found = _lookup(fields, "elapsed time per iteration")
    if found:
        value = _number(found[1])
        if value is not None:
            step = value / 1000.0 if "(ms)" in found[0] or "(s)" not in found[0] else value
    tflops = None
    found = _lookup(fields, "tflop") or _lookup(fields, "throughput", exclude=("token",))
    if found:
        tflops = _number(found[1])
    gbs = _number((_lookup(fields, "global batch size") or ("", None))[1])
    loss = _number((_lookup(fields, "lm loss") or _lookup(fields, "loss", exclude=("scale",)) or ("", None))[1])
    skipped = _number((_lookup(fields, "skipped iterations") or ("", None))[1])
    nan = _number((_lookup(fields, "nan iterations") or ("", None))[1])
    return IterationLine(iteration=int(m.group(1)), train_iters=int(m.group(2)), step_time_s=step,
                         tflops_per_gpu=tflops, global_batch_size=int(gbs) if gbs is not None else None,
                         loss=loss, skipped=int(skipped or 0), nan=int(nan or 0), fields=fields)


def parse_memory(line: str) -> MemoryLine | None:
    m = _MEMORY.search(line)
    if not m:
        return None
    fields = _fields(m.group(3))

    def get(name: str) -> float | None:
        value = fields.get(name)
        return _number(value) if value is not None else None

    return MemoryLine(rank=int(m.group(1)), after=int(m.group(2)), allocated_mb=get("allocated"),
                      max_allocated_mb=get("max allocated"), reserved_mb=get("reserved"),
                      max_reserved_mb=get("max reserved"))


def is_log_line(line: str) -> bool:
    """Whether `line` is one of the two lines this module reads (cheap pre-filter)."""
    return ("iteration" in line and "|" in line) or "memory (MB)" in line


def parse_log(text: str | list[str]) -> MegatronLMLog:
    log = MegatronLMLog()
    for line in text.splitlines() if isinstance(text, str) else text:
        it = parse_iteration(line)
        if it is not None:
            log.iterations.append(it)
            continue
        mem = parse_memory(line)
        if mem is not None:
            log.memory.append(mem)
    return log


def measured(log: MegatronLMLog, workload: Workload, warmup_iters: int) -> dict[str, Any] | None:
    """Step time, TFLOP/s/GPU, tokens/s/GPU and memory from the log; None without a usable
    iteration line. Iterations up to `warmup_iters`, and ones Megatron-LM skipped (fp16
    overflow) or found NaN in, are not timed; when nothing is left the last line counts."""
    lines = [it for it in log.iterations if it.step_time_s]
    if not lines:
        return None
    # A line whose skipped/nan counter is non-zero covers a skipped iteration.
    timed = [it for it in lines if it.iteration > warmup_iters and not it.skipped and not it.nan] or lines[-1:]
    step = statistics.fmean(it.step_time_s for it in timed)
    reported = [it.tflops_per_gpu for it in timed if it.tflops_per_gpu is not None]
    gbs = timed[-1].global_batch_size or workload.global_batch_size
    world = workload.world_size
    out: dict[str, Any] = {
        "step_time_s": step,
        "tflops_per_gpu": statistics.fmean(reported) if reported else None,
        "tokens_per_s_per_gpu": gbs * workload.seq_length / step / world,
        "global_batch_size": gbs,
        "timed_iterations": [it.iteration for it in timed],
        "loss_last": timed[-1].loss,
    }
    peaks = [m.max_reserved_mb if m.max_reserved_mb is not None else m.max_allocated_mb for m in log.memory]
    peaks = [p for p in peaks if p is not None]
    if peaks:
        out["mem_max_gib"] = max(peaks) / 1024.0
        out["mem_avg_gib"] = statistics.fmean(peaks) / 1024.0
    return out

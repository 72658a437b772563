"""From a finished run's output to a LaunchResult: metrics on success, else a log whose first
recognisable error line is the run's root cause.

The output of every node and stream goes through one `OutputCollector`, which keeps the
lines a result needs (the driver's OPTICO_RESULT / OPTICO_ERROR lines, Megatron-LM's
iteration and memory lines, error lines) and a tail of everything.

Failure logs are written for the failure-analysis agent, whose rules take the *first* line
they recognise (`optico.agents.failure.first_error`) and which sees only the last 4000
characters the loop stores. So a failure log is: one line naming the root cause first, the
failing rank's traceback, then the tail of the run's output, all within `LOG_LIMIT`.

Categories: the driver classifies its exceptions (oom, invalid_config, comm, unknown); its
oom and invalid_config become category hints, and so does comm — COMM_TIMEOUT when the text
says the collective timed out, else INFRASTRUCTURE (a peer or the network went away). Hints
only decide when the log's text is not recognised. A run the launcher killed for its
wall-clock limit or for printing nothing for `hang_s` is HANG, for certain.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from optico.launchers.megatron import report
from optico.launchers.megatron_lm import is_log_line, measured, parse_log
from optico.trial import FailureCategory, LaunchResult, Metrics
from optico.workload import Workload

LOG_LIMIT = 3800  # the loop keeps the last 4000 characters of a log
TAIL_LINES = 400

_EXCEPTION = re.compile(r"(?:^|[\s:\]])((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt))(?::\s|$)")
_NOT_ROOT = ("ChildFailedError", "SignalException", "CalledProcessError")
_TIMEOUT = re.compile(r"time(d)?[ -]?out|watchdog", re.I)
_RENDEZVOUS = re.compile(r"DistNetworkError|DistStoreError|RendezvousError|address already in use", re.I)
_PORT_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.I)

Reason = Literal["timeout", "hang"]


def port_was_taken(collector: "OutputCollector", port: int) -> bool:
    """Whether the run failed because `port` (the rendezvous master's) was already bound: torchrun's
    "The server socket has failed to listen on any local network address. port: P, ... EADDRINUSE"
    (older torch: "failed to bind to [::]:P (errno: 98 - Address already in use)")."""
    number = re.compile(rf"(?<!\d){port}(?!\d)")
    return any(_PORT_IN_USE.search(line) and number.search(line)
               for block in collector.errors for line in block.splitlines()[-1:])


class OutputCollector:
    """Every line of a run (from any node, either stream): what results need, kept whole."""

    def __init__(self, tail_lines: int = TAIL_LINES):
        self.tail: deque[tuple[int, str]] = deque(maxlen=tail_lines)  # (line number, line)
        self.ours: list[str] = []  # OPTICO_RESULT / OPTICO_ERROR lines
        self.steps = 0
        self.megatron_lm: list[str] = []  # iteration and memory lines
        self.errors: list[str] = []  # lines naming an exception, with a little context before each
        self._context: deque[str] = deque(maxlen=12)
        self.lines = 0

    def add(self, line: str, node: int = 0) -> None:
        self.lines += 1
        shown = line if node == 0 else f"[node{node}] {line}"
        # Ranks' lines can run together, so a step line may also carry another rank's error.
        if report.STEP_PREFIX in line:
            self.steps += 1
        if report.RESULT_PREFIX in line or report.ERROR_PREFIX in line:
            self.ours.append(line)
        elif is_log_line(line):
            self.megatron_lm.append(line)
        if _EXCEPTION.search(line) and len(self.errors) < 200:
            self.errors.append("\n".join([*self._context, shown]))
        self._context.append(shown)
        self.tail.append((self.lines, shown))

    def tail_text(self, limit: int, upto: int | None = None) -> str:
        """The last lines within `limit` characters; with `upto`, only lines numbered up to it."""
        out, size = [], 0
        for number, line in reversed(self.tail):
            if upto is not None and number > upto:
                continue
            if len(line) > 600:
                line = line[:300] + " ... " + line[-300:]
            size += len(line) + 1
            if size > limit:
                break
            out.append(line)
        return "\n".join(reversed(out))


@dataclass
class RunEnd:
    """How a run ended: its exit status (the first non-zero of all nodes), or the launcher
    killed it."""

    exit_code: int | None
    duration_s: float
    killed: Reason | None = None
    detail: str = ""
    lines_before_kill: int | None = None  # what the run had printed when the launcher stopped it
    notes: list[str] = field(default_factory=list)


def _compose(head: str, collector: OutputCollector, log_path: str | None, upto: int | None = None) -> str:
    head = head.strip()
    if len(head) > LOG_LIMIT // 2:
        head = head[: LOG_LIMIT // 2] + " ..."
    where = f" ({log_path})" if log_path else ""
    banner = f"--- last lines of the run{' before it was stopped' if upto is not None else ''}{where} ---"
    tail = collector.tail_text(max(200, LOG_LIMIT - len(head) - len(banner) - 2), upto)
    return f"{head}\n{banner}\n{tail}\n"


def _rendezvous_hint(block: str | None) -> FailureCategory | None:
    """INFRASTRUCTURE when the root error is torchrun's rendezvous failing to bind or reach its store:
    the network, not the configuration."""
    return FailureCategory.INFRASTRUCTURE if block and _RENDEZVOUS.search(block) else None


def _killed(end: RunEnd, collector: OutputCollector, log_path: str | None) -> tuple[str, FailureCategory]:
    if end.killed == "timeout":
        head = (f"run killed: wall-clock limit of {end.detail} reached (timeout); the whole process group "
                f"was stopped")
    else:
        head = f"run killed: no output for {end.detail} (hang); the whole process group was stopped"
    # what it printed before the kill tells where it stopped; torchrun's reaction to SIGTERM does not
    return _compose(head, collector, log_path, end.lines_before_kill), FailureCategory.HANG


def _driver_category(err: dict[str, Any]) -> FailureCategory:
    category = err.get("category")
    if category == "oom":
        return FailureCategory.OOM
    if category == "invalid_config":
        return FailureCategory.INVALID_CONFIG
    if category == "comm":
        text = f"{err.get('exception_type', '')} {err.get('message', '')}"
        return FailureCategory.COMM_TIMEOUT if _TIMEOUT.search(text) else FailureCategory.INFRASTRUCTURE
    return FailureCategory.UNKNOWN


def _driver_error_head(err: dict[str, Any]) -> str:
    rank = err.get("rank", "?")
    etype = str(err.get("exception_type") or "Error").rsplit(".", 1)[-1]
    message = str(err.get("message") or "").strip()
    first = message.splitlines()[0] if message else ""
    lines = [f"{etype}: {first} [rank {rank}]",
             f"(benchmark driver: {err.get('exception_type')}, category {err.get('category')}, phase {err.get('phase')}"
             + (f", parameters {', '.join(err['params'])}" if err.get("params") else "") + ")"]
    tb = str(err.get("traceback_tail") or "").splitlines()[-12:]
    lines += [f"[rank{rank}]: {t}" for t in tb]
    return "\n".join(lines)


def _root_error(collector: OutputCollector) -> str | None:
    """The first exception line that is a cause rather than a consequence: torchrun's
    ChildFailedError and a peer's lost connection or timeout come after the error that
    caused them, so a first error of another kind wins."""
    from optico.logscan import first_error

    candidates = []
    for block in collector.errors:
        last = block.splitlines()[-1]
        if any(n in last for n in _NOT_ROOT):
            continue
        category, _, _ = first_error(last)
        candidates.append((category, block))
    for category, block in candidates:
        if category not in (FailureCategory.COMM_TIMEOUT, FailureCategory.INFRASTRUCTURE):
            return block
    return candidates[0][1] if candidates else None


def _head_first(block: str) -> str:
    """The error line first (what failure analysis reads), then the lines before it."""
    lines = block.splitlines()
    return "\n".join([lines[-1], *lines[:-1]])


def _metrics(workload: Workload, step: float, tflops: float | None, mfu: float | None, tokens: float | None,
             tp: int = 1, **mem: float | None) -> Metrics:
    from optico.flops import flops_per_iteration

    if tflops is None:  # Megatron-LM without --log-throughput: its model FLOPs, ours
        tflops = flops_per_iteration(workload, tp) / (step * 1e12 * workload.world_size)
    if mfu is None:
        mfu = tflops / workload.peak_tflops
    if tokens is None:
        tokens = workload.global_batch_size * workload.seq_length / step / workload.world_size
    limit = mem.pop("mem_limit_gib", None) or workload.cluster.spec.memory_gib
    return Metrics(step_time_s=step, tflops_per_gpu=tflops, mfu=mfu, tokens_per_s_per_gpu=tokens,
                   mem_limit_gib=limit, **mem)


def driver_result(collector: OutputCollector, end: RunEnd, workload: Workload, *, gpu_seconds: float,
                  fingerprint: dict[str, Any], log_path: str | None) -> LaunchResult:
    """The megatron-core driver's run as a LaunchResult."""
    parsed = report.parse_output("\n".join(collector.ours))
    base = dict(exit_code=end.exit_code, duration_s=end.duration_s, gpu_seconds=gpu_seconds, log_path=log_path)
    if end.killed:
        log, hint = _killed(end, collector, log_path)
        return LaunchResult(ok=False, log=log, category_hint=hint, fingerprint=fingerprint, **base)
    result = parsed["result"]
    if result is not None and end.exit_code == 0 and result.get("ok"):
        metrics = _metrics(workload, result["step_time_s"], result.get("tflops_per_gpu"), result.get("mfu"),
                           result.get("tokens_per_s_per_gpu"), mem_max_gib=result.get("mem_max_reserved_gib"),
                           mem_avg_gib=result.get("mem_avg_allocated_gib"), mem_limit_gib=result.get("mem_limit_gib"),
                           gpu_util_avg=result.get("gpu_util_avg"), gpu_util_max=result.get("gpu_util_max"))
        fp = {**fingerprint, **(result.get("fingerprint") or {}),
              "driver": {k: result.get(k) for k in ("steps", "stop_reason", "stable", "cv", "loss_first", "loss_last",
                                                    "host_max_rss_gib", "layer_spec", "device", "peak_tflops")}}
        summary = (f"megatron-core driver: {result.get('steps')} timed steps ({result.get('stop_reason')}), "
                   f"step {result['step_time_s']:.4f} s, {metrics.tflops_per_gpu:.4g} TFLOP/s/GPU, "
                   f"MFU {metrics.mfu:.4g}, loss {result.get('loss_first')} -> {result.get('loss_last')}")
        return LaunchResult(ok=True, metrics=metrics, log=_compose(summary, collector, log_path),
                            fingerprint=fp, **base)
    err = report.primary_error(parsed["errors"])
    if err is not None:
        head, hint = _driver_error_head(err), _driver_category(err)
    else:
        block = _root_error(collector)
        head = _head_first(block) if block else (
            f"the run exited with status {end.exit_code} without a result line"
            + (" (torchrun or the interpreter failed before the driver started)" if not collector.steps else ""))
        hint = _rendezvous_hint(block)
    hint = None if hint == FailureCategory.UNKNOWN else hint
    return LaunchResult(ok=False, log=_compose(head, collector, log_path), category_hint=hint,
                        fingerprint=fingerprint, **base)


def megatron_lm_result(collector: OutputCollector, end: RunEnd, workload: Workload, *, warmup_iters: int,
                       tp: int, gpu_seconds: float, fingerprint: dict[str, Any], log_path: str | None) -> LaunchResult:
    """The user's Megatron-LM run as a LaunchResult, its metrics from Megatron-LM's log lines."""
    base = dict(exit_code=end.exit_code, duration_s=end.duration_s, gpu_seconds=gpu_seconds, log_path=log_path)
    if end.killed:
        log, hint = _killed(end, collector, log_path)
        return LaunchResult(ok=False, log=log, category_hint=hint, fingerprint=fingerprint, **base)
    found = measured(parse_log(collector.megatron_lm), workload, warmup_iters)
    if end.exit_code == 0 and found is not None:
        metrics = _metrics(workload, found["step_time_s"], found["tflops_per_gpu"], None,
                           found["tokens_per_s_per_gpu"], tp=tp, mem_max_gib=found.get("mem_max_gib"),
                           mem_avg_gib=found.get("mem_avg_gib"))
        summary = (f"Megatron-LM: iterations {found['timed_iterations']} timed, step {found['step_time_s']:.4f} s, "
                   f"{metrics.tflops_per_gpu:.4g} TFLOP/s/GPU, MFU {metrics.mfu:.4g}"
                   + (f", max memory {metrics.mem_max_gib:.2f} GiB" if metrics.mem_max_gib else ""))
        fp = {**fingerprint, "megatron_lm": {"timed_iterations": found["timed_iterations"],
                                             "global_batch_size": found["global_batch_size"],
                                             "loss_last": found["loss_last"]}}
        return LaunchResult(ok=True, metrics=metrics, log=_compose(summary, collector, log_path), fingerprint=fp,
                            **base)
    block = _root_error(collector)
    hint = _rendezvous_hint(block)
    if block:
        head = _head_first(block)
    elif end.exit_code == 0:
        head = ("the command exited 0 but printed no Megatron-LM iteration line with a step time "
                "(is it a Megatron-LM training script? --log-interval must be at most the iterations run)")
    else:
        head = f"the command exited with status {end.exit_code}; no error line was recognised"
    return LaunchResult(ok=False, log=_compose(head, collector, log_path), category_hint=hint,
                        fingerprint=fingerprint, **base)

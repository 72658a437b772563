"""A job as a stable, machine-readable result (`--json`), and as a report a person reads.

`job_result` is the `optico tune --json` document. `job_report` adds what a performance engineer
hands on: the best configuration as Megatron-LM flags and a launch-script snippet, the
improvement over the baseline, the path of changes that led there (each as a flag diff with its
reason), the failures with their diagnoses, GPU-hours spent and saved. `report_markdown` renders it.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from optico.agents.fallback import decided_by, llm_usage
from optico.pool.contract import Store
from optico.strategy import Strategy
from optico.textsafe import markdown_text, terminal_text
from optico.trial import Trial, TrialStatus


def _metrics(t: Trial) -> dict[str, Any] | None:
    if not t.metrics:
        return None
    m = t.metrics
    return {"mfu": m.mfu, "tflops_per_gpu": m.tflops_per_gpu, "step_time_s": m.step_time_s,
            "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "mem_max_gib": m.mem_max_gib}


def _failure(t: Trial) -> dict[str, Any] | None:
    if not t.failure:
        return None
    f = t.failure
    return {"category": f.category.value, "summary": f.summary, "confidence": f.confidence,
            "described": f.described(), "params": f.params, "retry": f.retry}


def _best(trials: list[Trial]) -> Trial | None:
    ok = [t for t in trials if t.status == TrialStatus.OK and t.metrics]
    return max(ok, key=lambda t: t.metrics.mfu) if ok else None


# A best whose measured peak leaves less than this share of the GPU's memory free is flagged: a run of
# days meets batches, checkpoints and allocator fragmentation a tuning run's few steps did not.
TIGHT_MEMORY = 0.05


def _headroom(t: Trial, limit_gib: float) -> float | None:
    """The share of the GPU's memory trial `t`'s measured peak left free (None: not measured)."""
    limit = t.metrics.mem_limit_gib or limit_gib
    if t.metrics.mem_max_gib is None or not limit:
        return None
    return 1 - t.metrics.mem_max_gib / limit


def memory_note(best: Trial, trials: list[Trial], limit_gib: float) -> str | None:
    """A warning when the best configuration's measured peak leaves under TIGHT_MEMORY of the GPU's
    memory free, naming the best trial with more room (None when there is room)."""
    room = _headroom(best, limit_gib)
    if room is None or room >= TIGHT_MEMORY:
        return None
    note = (f"its measured peak, {best.metrics.mem_max_gib:.1f} GiB, leaves {max(room, 0):.1%} of the GPU's memory "
            f"free: a long run (other batches, checkpoints, allocator fragmentation) may run out")
    roomy = [t for t in trials if t.status == TrialStatus.OK and t.metrics
             and (r := _headroom(t, limit_gib)) is not None and r >= TIGHT_MEMORY]
    if roomy:
        alt = max(roomy, key=lambda t: t.metrics.mfu)
        note += (f"; the best with {TIGHT_MEMORY:.0%} free is trial {alt.index} ({alt.strategy.short()}, MFU "
                 f"{alt.metrics.mfu:.1%}, {alt.metrics.mem_max_gib:.1f} GiB)")
    return note


def _baseline(job_spec_baseline: Strategy | None, trials: list[Trial]) -> tuple[Strategy | None, Trial | None]:
    strategy = job_spec_baseline or (trials[0].strategy if trials else None)
    trial = next((t for t in trials if strategy and t.signature == strategy.signature()
                  and t.status == TrialStatus.OK), None)
    return strategy, trial


def job_result(store: Store, job_id: int) -> dict[str, Any]:
    """The `--json` document: {"job_id", "status", "baseline", "best", "trials", ...}."""
    job = store.get_job(job_id)
    trials = store.trials(job_id)
    best = _best(trials)
    baseline_strategy, baseline_trial = _baseline(job.spec.baseline, trials)
    messages = store.messages(job_id)
    decisions = decided_by(messages, job.spec.reasoner, trials)
    return {
        "job_id": job.id,
        "name": job.name,
        "status": job.status.value,
        "stop_reason": job.stop_reason,
        "workload": job.spec.workload.describe(),
        "baseline": {
            "source": "spec" if job.spec.baseline else "seed",
            "strategy": baseline_strategy.model_dump(mode="json") if baseline_strategy else None,
            "mfu": baseline_trial.metrics.mfu if baseline_trial else None,
        },
        "best": None if best is None else {
            "trial": best.index,
            "strategy": best.strategy.model_dump(mode="json"),
            "mfu": best.metrics.mfu,
            "tflops_per_gpu": best.metrics.tflops_per_gpu,
            "megatron_args": best.strategy.run_args(job.spec.workload),
            "memory_note": memory_note(best, trials, job.spec.workload.cluster.spec.memory_gib),
        },
        "reasoner": {**job.spec.reasoner.model_dump(mode="json"), "llm": llm_usage(messages)},
        "gpu_hours": sum(t.gpu_seconds for t in trials) / 3600,
        "failed_trials": sum(1 for t in trials if t.status == TrialStatus.FAILED),
        "trials": [{
            "index": t.index,
            "strategy": t.strategy.model_dump(mode="json"),
            "status": t.status.value,
            "metrics": _metrics(t),
            "failure": _failure(t),
            "rationale": t.rationale,
            "log_path": t.log_path,
            "decided_by": decisions.get(t.index),
        } for t in trials],
    }


# -- flags ------------------------------------------------------------------------------------

def flag_groups(args: list[str]) -> list[str]:
    """Megatron-LM arguments grouped per flag: ['--tensor-model-parallel-size 2', '--sequence-parallel']."""
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return [" ".join(g) for g in groups]


def flag_diff(before: Strategy | None, after: Strategy) -> dict[str, list[str]]:
    """What changed between two configurations, as Megatron-LM flags: {"removed": [...], "added": [...]}."""
    new = flag_groups(after.megatron_args())
    if before is None:
        return {"removed": [], "added": new}
    old = flag_groups(before.megatron_args())
    return {"removed": [g for g in old if g not in new], "added": [g for g in new if g not in old]}


def flag_changes(before: Strategy | None, after: Strategy) -> list[str]:
    """The diff as lines a person reads: '--tensor-model-parallel-size 4 → 2', '+ --sequence-parallel',
    '− --overlap-grad-reduce'."""
    diff = flag_diff(before, after)
    removed = {g.split(" ")[0]: g for g in diff["removed"]}
    lines = []
    for group in diff["added"]:
        flag = group.split(" ")[0]
        if flag in removed:
            old = removed.pop(flag)
            lines.append(f"{flag} {old[len(flag):].strip()} → {group[len(flag):].strip()}")
        else:
            lines.append(f"+ {group}")
    return lines + [f"− {g}" for g in removed.values()]


def launch_script(job_name: str, workload_text: str, args: Sequence[str], *, global_batch_size: int,
                  seq_length: int, gpus_per_node: int, nodes: int, note: str = "") -> str:
    """A torchrun snippet for the user's own Megatron-LM training with the tuned flags (`args`,
    `Strategy.run_args`)."""
    flags = flag_groups(list(args))
    lines = [
        "#!/usr/bin/env bash",
        f"# OptiCo: {terminal_text(job_name, one_line=True)} — {workload_text}",  # a comment line: nothing can end it
        *([f"# {note}"] if note else []),
        "# Add your model, data, tokenizer and checkpoint flags where marked.",
        "set -euo pipefail",
        f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} \\",
        '    --node-rank "${NODE_RANK:-0}" --master-addr "${MASTER_ADDR:-localhost}" '
        '--master-port "${MASTER_PORT:-6000}" \\',
        "    pretrain_gpt.py \\",
        '    "${MODEL_ARGS[@]}" "${DATA_ARGS[@]}" \\',
        f"    --global-batch-size {global_batch_size} --seq-length {seq_length} \\",
    ]
    lines += [f"    {' '.join(shlex.quote(p) for p in g.split(' '))} \\" for g in flags]
    lines[-1] = lines[-1].removesuffix(" \\")
    return "\n".join(lines) + "\n"


# -- the report --------------------------------------------------------------------------------

def _gpu_hours_for(tokens: float, tokens_per_s_per_gpu: float | None) -> float | None:
    """GPU-hours to train `tokens` at this per-GPU throughput (every GPU processes its share)."""
    if not tokens_per_s_per_gpu:
        return None
    return tokens / tokens_per_s_per_gpu / 3600


def job_report(store: Store, job_id: int, *, tokens: float | None = None) -> dict[str, Any]:
    """Everything `report_markdown` shows, as JSON. `tokens`: a training budget in tokens, for the
    GPU-hours it would take with the baseline and with the best configuration."""
    job = store.get_job(job_id)
    trials = store.trials(job_id)
    workload = job.spec.workload
    best = _best(trials)
    baseline_strategy, baseline_trial = _baseline(job.spec.baseline, trials)

    path, incumbent = [], None
    for t in trials:
        if t.status is TrialStatus.OK and t.metrics and (incumbent is None or t.metrics.mfu > incumbent.metrics.mfu):
            before = incumbent.strategy if incumbent else None
            path.append({"trial": t.index, "mfu": t.metrics.mfu, "strategy": t.strategy.short(),
                         "changes": flag_diff(before, t.strategy),
                         "change_lines": flag_changes(before, t.strategy) if before else [],
                         "reason": t.rationale})
            incumbent = t
    failures = [{"trial": t.index, "strategy": t.strategy.short(), "status": t.status.value,
                 **(_failure(t) or {"category": "unknown", "summary": "", "confidence": 0,
                                    "described": "not diagnosed", "params": [], "retry": False})}
                for t in trials if t.status in (TrialStatus.FAILED, TrialStatus.LOST)]
    spent = sum(t.gpu_seconds for t in trials) / 3600
    improvement = (best.metrics.mfu / baseline_trial.metrics.mfu - 1) if best and baseline_trial else None
    savings = None
    if tokens is not None and best and baseline_trial:
        before = _gpu_hours_for(tokens, baseline_trial.metrics.tokens_per_s_per_gpu)
        after = _gpu_hours_for(tokens, best.metrics.tokens_per_s_per_gpu)
        if before is not None and after is not None:
            savings = {"tokens": tokens, "gpu_hours_baseline": before, "gpu_hours_best": after,
                       "gpu_hours_saved": before - after, "gpu_hours_saved_net_of_tuning": before - after - spent}
    script = None
    args = best.strategy.run_args(workload) if best else []
    if best:
        cluster = workload.cluster
        script = launch_script(job.name, workload.describe(), args,
                               global_batch_size=workload.global_batch_size, seq_length=workload.seq_length,
                               gpus_per_node=cluster.gpus_per_node, nodes=cluster.nodes_used,
                               note=f"best of job {job.id}, trial {best.index}: MFU {best.metrics.mfu:.1%}")
    return {
        "job_id": job.id, "name": job.name, "status": job.status.value, "stop_reason": job.stop_reason,
        "workload": workload.describe(),
        "baseline": {"source": "spec" if job.spec.baseline else "seed",
                     "strategy": baseline_strategy.short() if baseline_strategy else None,
                     "mfu": baseline_trial.metrics.mfu if baseline_trial else None},
        "best": None if best is None else {
            "trial": best.index, "mfu": best.metrics.mfu, "tflops_per_gpu": best.metrics.tflops_per_gpu,
            "tokens_per_s_per_gpu": best.metrics.tokens_per_s_per_gpu, "strategy": best.strategy.short(),
            "megatron_args": args, "flags": flag_groups(args),
            "memory_note": memory_note(best, trials, workload.cluster.spec.memory_gib)},
        "improvement_over_baseline": improvement,
        "path": path,
        "failures": failures,
        "trials": len(trials),
        "gpu_hours_spent": spent,
        "savings": savings,
        "launch_script": script,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def report_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown."""
    best, base = report["best"], report["baseline"]
    out = [f"# OptiCo job {report['job_id']}: {markdown_text(report['name'])}", "",
           f"{markdown_text(report['workload'])} — **{report['status']}**: {markdown_text(report['stop_reason'])}", ""]
    if best:
        gain = report["improvement_over_baseline"]
        out += [f"Best: trial {best['trial']}, MFU **{_pct(best['mfu'])}** ({best['tflops_per_gpu']:.0f} "
                f"TFLOP/s/GPU) vs baseline {_pct(base['mfu'])} ({base['source']})"
                + (f": **{gain:+.1%}**" if gain is not None else ""), "",
                "```sh", " ".join(best["megatron_args"]), "```", ""]
        if best.get("memory_note"):
            out += [f"**Memory:** {markdown_text(best['memory_note'])}.", ""]
    else:
        out += ["No successful trial.", ""]
    out += [f"Trials: {report['trials']}, GPU-hours spent: {report['gpu_hours_spent']:.1f}", ""]
    if report["savings"]:
        s = report["savings"]
        out += [f"For {s['tokens']:.3g} training tokens: {s['gpu_hours_baseline']:.0f} GPU-hours with the baseline, "
                f"{s['gpu_hours_best']:.0f} with the best: **{s['gpu_hours_saved']:.0f} saved** "
                f"({s['gpu_hours_saved_net_of_tuning']:.0f} net of tuning).", ""]
    if report["path"]:
        out += ["## Path to the best", "", "| trial | MFU | changes | why |", "|---:|---:|---|---|"]
        for step in report["path"]:
            changes = "; ".join(step["change_lines"]) or "start"
            out.append(f"| {step['trial']} | {_pct(step['mfu'])} | {markdown_text(changes)} | {markdown_text(step['reason'])} |")
        out.append("")
    if report["failures"]:
        # No confidence column: a diagnosis is shown with it (`Failure.described`).
        out += ["## Failures", "", "| trial | configuration | category | diagnosis |", "|---:|---|---|---|"]
        for f in report["failures"]:
            out.append(f"| {f['trial']} | {markdown_text(f['strategy'])} | {f['category']} | {markdown_text(f['described'])} |")
        out.append("")
    if report["launch_script"]:
        out += ["## Launch script", "", "```sh", report["launch_script"].rstrip(), "```", ""]
    return "\n".join(out)

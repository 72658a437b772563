"""A finished (or running) job as a stable, machine-readable result and a short summary."""

from __future__ import annotations

from typing import Any

from optico.agents.fallback import decided_by, llm_usage
from optico.pool.store import Store
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
            "params": f.params, "retry": f.retry}


def job_result(store: Store, job_id: int) -> dict[str, Any]:
    """The `--json` document: {"job_id", "status", "baseline", "best", "trials", ...}."""
    job = store.get_job(job_id)
    trials = store.trials(job_id)
    ok = [t for t in trials if t.status == TrialStatus.OK and t.metrics]
    best = max(ok, key=lambda t: t.metrics.mfu) if ok else None
    baseline_strategy = job.spec.baseline or (trials[0].strategy if trials else None)
    messages = store.messages(job_id)
    decisions = decided_by(messages, job.spec.reasoner, trials)
    baseline_trial = next((t for t in trials if baseline_strategy and t.signature == baseline_strategy.signature()
                           and t.status == TrialStatus.OK), None)
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
            "megatron_args": best.strategy.megatron_args(),
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
            "decided_by": decisions.get(t.index),
        } for t in trials],
    }

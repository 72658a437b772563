"""The tuning loop as a LangGraph state machine around the pool.

    seed -> validate -> [failed: diagnose] -> record -> stop? -> analyze -> generate -> guard -> validate ...

The state is small (job id, next trial index, the candidate in hand); everything
the agents reason over lives in the pool, so a node re-run after a crash sees the
same history and decides the same. Trials are keyed (job, index) and launchers by
trial key, so a resumed job neither loses a finished trial nor runs one twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from optico.agents.analysis import RulesAnalysis
from optico.agents.contracts import (
    AnalysisInput,
    AnalysisOutput,
    AnalysisReasoner,
    FailureInput,
    FailureReasoner,
    GenerationInput,
    GenerationOutput,
    GenerationReasoner,
)
from optico.agents.generation import RulesGeneration
from optico.agents.seeding import heuristic_start
from optico.guard import Guard
from optico.launchers.base import Launcher
from optico.perfmodel.online import JobModel
from optico.pool.records import JobStatus
from optico.pool.store import Store
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import Failure, FailureCategory, Trial, TrialStatus

EventSink = Callable[[str, dict[str, Any]], None]
MAX_ATTEMPTS = 2  # a RETRY verdict re-runs a configuration once


class LoopState(TypedDict, total=False):
    job_id: int
    next_index: int
    candidate: dict | None
    rationale: str
    retry: bool
    analysis: dict | None
    proposals: list[dict]
    stop_reason: str | None


@dataclass
class LoopContext:
    """What the nodes need besides the state: run-scoped, never checkpointed."""

    store: Store
    spec: JobSpec
    launcher: Launcher
    model: JobModel
    guard: Guard
    pool: list[Strategy]
    analysis: AnalysisReasoner
    generation: GenerationReasoner
    failure: FailureReasoner
    rules_analysis: RulesAnalysis
    rules_generation: RulesGeneration
    rules_failure: FailureReasoner
    on_event: EventSink | None = None
    prior: list[Trial] = field(default_factory=list)
    candidates: list[Strategy] | None = None


# -- helpers -----------------------------------------------------------------------

def _emit(ctx: LoopContext, job_id: int, kind: str, payload: dict[str, Any]) -> None:
    ctx.store.add_event(job_id, kind, payload)
    if ctx.on_event:
        ctx.on_event(kind, payload)


def _best(trials: list[Trial]) -> Trial | None:
    ok = [t for t in trials if t.status == TrialStatus.OK and t.metrics]
    return max(ok, key=lambda t: t.metrics.mfu) if ok else None


def _reference(trials: list[Trial]) -> Strategy:
    best = _best(trials)
    return best.strategy if best else trials[-1].strategy


def _finished(trials: list[Trial]) -> list[Trial]:
    return [t for t in trials if t.status != TrialStatus.RUNNING]


# -- nodes -------------------------------------------------------------------------

def seed(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    ctx.store.set_job_status(job_id, JobStatus.RUNNING)
    ctx.model.observe(ctx.prior)
    if ctx.spec.baseline is not None:
        strategy, why = ctx.spec.baseline, "baseline from the spec (the expert's configuration)"
    else:
        strategy, why = heuristic_start(ctx.pool, ctx.model, ctx.prior)
    ctx.store.add_message(job_id, 1, "seed", "seed", {"strategy": strategy.model_dump(mode="json")}, why)
    return {"candidate": strategy.model_dump(mode="json"), "rationale": why, "retry": False, "next_index": 1}


def validate(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, index = runtime.context, state["job_id"], state["next_index"]
    strategy = Strategy.model_validate(state["candidate"])
    trial = ctx.store.start_trial(job_id, index, strategy, state.get("rationale", ""))
    ctx.store.heartbeat(job_id)
    if trial.status == TrialStatus.RUNNING:
        _emit(ctx, job_id, "trial_started", {"index": index, "strategy": strategy.short(),
                                             "rationale": state.get("rationale", "")})
        result = asyncio.run(ctx.launcher.launch(
            ctx.spec.workload, strategy, trial_key=f"job{job_id}-trial{index}",
            progress=lambda line: ctx.on_event and ctx.on_event("log", {"index": index, "line": line})))
        pending = None if result.ok else Failure(
            category=result.category_hint or FailureCategory.UNKNOWN, summary="awaiting diagnosis",
            confidence=0, log_excerpt=result.log[-4000:])
        trial = ctx.store.finish_trial(
            trial.id, status=TrialStatus.OK if result.ok else TrialStatus.FAILED, metrics=result.metrics,
            failure=pending, gpu_seconds=result.gpu_seconds, fingerprint=result.fingerprint,
            log_path=result.log_path, log_excerpt=result.log[-4000:])
    ctx.store.add_message(job_id, index, "validation", "result", {
        "status": trial.status.value, "metrics": trial.metrics.model_dump() if trial.metrics else None,
        "gpu_seconds": trial.gpu_seconds}, trial.log_excerpt[-500:])
    return {"next_index": index + 1}


def diagnose(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    trials = ctx.store.trials(job_id)
    trial = next(t for t in trials if t.index == state["next_index"] - 1)
    attempts = sum(1 for t in trials if t.signature == trial.signature and t.index <= trial.index)
    earlier = [t for t in trials if t.index < trial.index]
    inp = FailureInput(
        workload=ctx.spec.workload, strategy=trial.strategy,
        reference=_reference(earlier) if earlier else None, log=trial.log_excerpt,
        category_hint=trial.failure.category if trial.failure and trial.failure.category != FailureCategory.UNKNOWN
        else None,
        attempts=attempts, predicted_mem_fraction=ctx.model.mem_gib(trial.strategy) / ctx.model.limit_gib,
        iteration=trial.index)
    failure = ctx.failure.diagnose(inp)  # a fallback to the rules is optico.agents.fallback's
    failure = failure.model_copy(update={"log_excerpt": failure.log_excerpt or trial.log_excerpt[-500:]})
    ctx.store.set_trial_failure(trial.id, failure)
    ctx.store.add_message(job_id, trial.index, "failure", "diagnosis", failure.model_dump(mode="json"),
                          failure.summary)
    return {}


def record(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, spec = runtime.context, state["job_id"], runtime.context.spec
    trials = ctx.store.trials(job_id)
    last = trials[-1]
    best = _best(trials)
    ctx.store.set_job_status(job_id, JobStatus.RUNNING, best_trial_id=best.id if best else None)
    _emit(ctx, job_id, "trial_done", {
        "index": last.index, "strategy": last.strategy.short(), "status": last.status.value,
        "mfu": last.mfu, "mem_max_gib": last.metrics.mem_max_gib if last.metrics else None,
        "mem_limit_gib": ctx.model.limit_gib, "summary": last.failure.summary if last.failure else None,
        "rationale": last.rationale, "best_mfu": best.mfu if best else None})

    budget, gpu_hours = spec.budget, sum(t.gpu_seconds for t in trials) / 3600
    stop = None
    if len(trials) >= budget.max_trials:
        stop = f"max trials ({budget.max_trials}) reached"
    elif budget.gpu_hours is not None and gpu_hours >= budget.gpu_hours:
        stop = f"GPU-hour budget spent ({gpu_hours:.1f} of {budget.gpu_hours})"
    elif budget.target_mfu is not None and best and best.mfu >= budget.target_mfu:
        stop = f"target MFU {budget.target_mfu:.1%} reached"
    elif budget.patience is not None and best and last.index - best.index >= budget.patience:
        stop = f"no improvement in {budget.patience} trials"
    if stop:
        return {"stop_reason": stop}
    if last.failure and last.failure.retry:
        attempts = sum(1 for t in trials if t.signature == last.signature)
        if attempts < MAX_ATTEMPTS:
            return {"candidate": last.strategy.model_dump(mode="json"), "retry": True,
                    "rationale": f"RETRY of trial {last.index}: {last.failure.summary}", "stop_reason": None}
    return {"retry": False, "stop_reason": None}


def _analysis_input(ctx: LoopContext, trials: list[Trial], iteration: int) -> AnalysisInput:
    return AnalysisInput(workload=ctx.spec.workload, search_space=ctx.spec.search_space, history=trials,
                         prior=ctx.prior, reference=_reference(trials), candidates=ctx.candidates,
                         iteration=iteration)


def analyze(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    trials = _finished(ctx.store.trials(job_id))
    inp = _analysis_input(ctx, trials, iteration)
    out = ctx.analysis.analyze(inp)  # a fallback to the rules is optico.agents.fallback's
    ctx.store.add_message(job_id, iteration, "analysis", "output", out.model_dump(mode="json"),
                          "\n".join(s.text for s in out.suggestions[:5]))
    return {"analysis": out.model_dump(mode="json")}


def generate(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    trials = _finished(ctx.store.trials(job_id))
    analysis = AnalysisOutput.model_validate(state["analysis"])
    inp = GenerationInput(workload=ctx.spec.workload, search_space=ctx.spec.search_space,
                          reference=_reference(trials), analysis=analysis, history=trials, iteration=iteration)
    out = ctx.generation.generate(inp)  # a fallback to the rules is optico.agents.fallback's
    ctx.store.add_message(job_id, iteration, "generation", "output", out.model_dump(mode="json"),
                          "\n".join(p.rationale for p in out.proposals[:5]))
    return {"proposals": [p.model_dump(mode="json") for p in out.proposals]}


def _converged(ctx: LoopContext, trials: list[Trial]) -> str | None:
    """A stop reason when nothing admissible is predicted to come close to the best measured MFU."""
    budget, best = ctx.spec.budget, _best(trials)
    if budget.converge_tol is None or best is None or len(trials) < budget.min_trials:
        return None
    ctx.model.observe([*ctx.prior, *trials])
    # The same score the analysis ranks by, so convergence and suggestions never disagree.
    remaining = [ctx.model.expected_mfu(s) for s in ctx.pool if ctx.guard.admissible(s, trials, ctx.prior)]
    if not remaining:
        return None  # the guard below reports exhaustion
    top = max(remaining)
    if top < best.mfu * (1 + budget.converge_tol):
        return (f"converged: the best untried configuration is predicted at {top:.1%} MFU, no better than "
                f"the best measured {best.mfu:.1%} (+{budget.converge_tol:.0%})")
    return None


def guard(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    trials = _finished(ctx.store.trials(job_id))
    proposals = GenerationOutput.model_validate({"proposals": state.get("proposals", [])}).proposals
    rejected = []
    converged = _converged(ctx, trials)
    if converged:
        ctx.store.add_message(job_id, iteration, "guard", "verdict", {"admitted": None, "rejected": []}, converged)
        return {"candidate": None, "stop_reason": converged}
    for attempt in ("reasoner", "rules fallback"):
        for p in proposals:
            verdict = ctx.guard.check(p.strategy, trials, ctx.prior)
            if verdict.admitted:
                ctx.store.add_message(job_id, iteration, "guard", "verdict",
                                      {"admitted": p.strategy.model_dump(mode="json"), "rejected": rejected,
                                       "source": attempt}, p.rationale)
                return {"candidate": p.strategy.model_dump(mode="json"), "rationale": p.rationale,
                        "retry": False, "stop_reason": None}
            rejected.append({"strategy": p.strategy.short(), "rule": verdict.rule, "reason": verdict.reason})
        if ctx.analysis is ctx.rules_analysis and ctx.generation is ctx.rules_generation:
            break
        # Nothing the reasoner proposed is admissible: ask the offline rules before giving up.
        inp = _analysis_input(ctx, trials, iteration)
        analysis = ctx.rules_analysis.analyze(inp)
        proposals = ctx.rules_generation.generate(GenerationInput(
            workload=ctx.spec.workload, search_space=ctx.spec.search_space, reference=inp.reference,
            analysis=analysis)).proposals
    ctx.store.add_message(job_id, iteration, "guard", "verdict", {"admitted": None, "rejected": rejected},
                          "search space exhausted")
    return {"candidate": None, "stop_reason": "search space exhausted"}


def finish(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    trials = ctx.store.trials(job_id)
    best = _best(trials)
    reason = state.get("stop_reason") or "stopped"
    ctx.store.set_job_status(job_id, JobStatus.COMPLETED, stop_reason=reason, best_trial_id=best.id if best else None)
    _emit(ctx, job_id, "job_done", {"stop_reason": reason, "trials": len(trials),
                                    "best_mfu": best.mfu if best else None})
    return {}


# -- routing -----------------------------------------------------------------------

def after_validate(state: LoopState, runtime: Runtime[LoopContext]) -> Literal["diagnose", "record"]:
    trials = runtime.context.store.trials(state["job_id"])
    last = next(t for t in trials if t.index == state["next_index"] - 1)
    return "diagnose" if last.status == TrialStatus.FAILED else "record"


def after_record(state: LoopState) -> Literal["finish", "validate", "analyze"]:
    if state.get("stop_reason"):
        return "finish"
    return "validate" if state.get("retry") else "analyze"


def after_guard(state: LoopState) -> Literal["validate", "finish"]:
    return "finish" if state.get("stop_reason") else "validate"


def build_graph() -> StateGraph:
    g = StateGraph(LoopState, context_schema=LoopContext)
    for name, fn in [("seed", seed), ("validate", validate), ("diagnose", diagnose), ("record", record),
                     ("analyze", analyze), ("generate", generate), ("guard", guard), ("finish", finish)]:
        g.add_node(name, fn)
    g.add_edge(START, "seed")
    g.add_edge("seed", "validate")
    g.add_conditional_edges("validate", after_validate, {"diagnose": "diagnose", "record": "record"})
    g.add_edge("diagnose", "record")
    g.add_conditional_edges("record", after_record, {"finish": "finish", "validate": "validate",
                                                     "analyze": "analyze"})
    g.add_edge("analyze", "generate")
    g.add_edge("generate", "guard")
    g.add_conditional_edges("guard", after_guard, {"validate": "validate", "finish": "finish"})
    g.add_edge("finish", END)
    return g

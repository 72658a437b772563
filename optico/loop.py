"""The tuning loop as a LangGraph state machine around the pool.

    seed -> validate -> [failed: diagnose] -> record -> stop? -> analyze -> generate -> guard -> validate ...

The state is small (job id, next trial index, the candidate in hand); everything
the agents reason over lives in the pool, so a node re-run after a crash sees the
same history and decides the same. Trials are keyed (job, index) and launchers by
trial key, so a resumed job neither loses a finished trial nor runs one twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from optico.agents.analysis import RulesAnalysis
from optico.agent_contracts import (
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
from optico import faults
from optico.agents.seeding import start_configuration
from optico.events import (
    STORED_KINDS,
    AgentOutput,
    JobEvent,
    JobFinished,
    TrialFinished,
    TrialLog,
    TrialLost,
    TrialStarted,
)
from optico.agents.stopping import converged
from optico.guard import Guard
from optico.launchers.base import Launcher
from optico.perfmodel.online import JobModel
from optico.pool.contract import Store
from optico.pool.records import JobRecord
from optico.pool.lifecycle import JobStatus, NoNewTrial
from optico.redact import clip
from optico.spec import JobSpec
from optico.strategy import Strategy
from optico.trial import Failure, FailureCategory, Trial, TrialStatus

EventSink = Callable[[str, dict[str, Any]], None]
"""Live listener: called with (event kind, event as JSON) for every event, stored or not."""
MAX_ATTEMPTS = 2  # a RETRY verdict re-runs a configuration once
MAX_DEATHS = 2  # a trial whose worker died is re-run once under its index; a second death records it lost
# Launches its own worker interrupted cleanly (a rolling restart) are re-run too, but not for ever: a
# trial that gets its worker evicted each time would.
MAX_LAUNCHES = 6
LOG_EXCERPT_CHARS = 4000


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
    worker: str
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

def _emit(ctx: LoopContext, job_id: int, event: JobEvent) -> None:
    """Stores the event (unless it is live-only), then tells the live listener."""
    if event.kind in STORED_KINDS:
        ctx.store.add_event(job_id, event, worker=ctx.worker)
    _tell(ctx, event)


def _tell(ctx: LoopContext, event: JobEvent) -> None:
    if ctx.on_event:
        ctx.on_event(event.kind, event.model_dump(mode="json"))


def _say(ctx: LoopContext, job_id: int, iteration: int, agent: str, kind: str, content: dict[str, Any],
         text: str = "") -> None:
    """Stores an agent's message in the pool with the event announcing it (one transaction), then
    tells the live listener."""
    event = AgentOutput(iteration=iteration, agent=agent, message=kind, text=clip(text, 500))
    ctx.store.add_message(job_id, iteration, agent, kind, content, text, worker=ctx.worker, event=event)
    _tell(ctx, event)


def _best(trials: list[Trial]) -> Trial | None:
    ok = [t for t in trials if t.status == TrialStatus.OK and t.metrics]
    return max(ok, key=lambda t: t.metrics.mfu) if ok else None


def _reference(trials: list[Trial]) -> Strategy:
    best = _best(trials)
    return best.strategy if best else trials[-1].strategy


def _finished(trials: list[Trial]) -> list[Trial]:
    """The trials with a result (a running or lost trial tells the agents nothing)."""
    return [t for t in trials if t.status in (TrialStatus.OK, TrialStatus.FAILED)]


# -- nodes -------------------------------------------------------------------------

def seed(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    ctx.model.observe(ctx.prior)
    if ctx.spec.baseline is not None:
        strategy, why = ctx.spec.baseline, "baseline from the spec (the expert's configuration)"
    else:
        strategy, why = start_configuration(ctx.pool, ctx.model, ctx.prior)
    _say(ctx, job_id, 1, "seed", "seed", {"strategy": strategy.model_dump(mode="json") if strategy else None}, why)
    if strategy is None:
        return {"candidate": None, "stop_reason": why, "next_index": 1}
    return {"candidate": strategy.model_dump(mode="json"), "rationale": why, "retry": False, "next_index": 1}


async def _launch(ctx: LoopContext, job_id: int, index: int, strategy: Strategy, trial_id: int) -> Trial:
    """Runs the claimed trial through the launcher and stores its outcome. Cancelling the task that
    awaits this kills the run (the launcher contract) before the CancelledError propagates."""
    trial = ctx.store.begin_attempt(trial_id, gpus=ctx.spec.workload.world_size, worker=ctx.worker)

    def progress(line: str) -> None:
        _emit(ctx, job_id, TrialLog(index=index, line=clip(line, 500)))

    started = time.monotonic()
    run = asyncio.ensure_future(ctx.launcher.launch(ctx.spec.workload, strategy, trial_key=f"job{job_id}-trial{index}",
                                                    progress=progress))
    await asyncio.sleep(0)  # let the launch begin before a crash point can fire
    faults.point("trial")
    result = await run
    excerpt = clip(result.log, LOG_EXCERPT_CHARS, tail=True)
    pending = None if result.ok else Failure(
        category=result.category_hint or FailureCategory.UNKNOWN, summary="awaiting diagnosis",
        confidence=0, log_excerpt=excerpt)
    trial = ctx.store.finish_trial(
        trial.id, status=TrialStatus.OK if result.ok else TrialStatus.FAILED, metrics=result.metrics,
        failure=pending, gpu_seconds=result.gpu_seconds, fingerprint=result.fingerprint,
        log_path=result.log_path, log_excerpt=excerpt, wall_seconds=time.monotonic() - started, worker=ctx.worker)
    faults.point("after_trial")
    return trial


async def validate(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, index = runtime.context, state["job_id"], state["next_index"]
    strategy = Strategy.model_validate(state["candidate"])
    rationale = state.get("rationale", "")
    try:
        trial = ctx.store.start_trial(job_id, index, strategy, rationale, worker=ctx.worker)
    except NoNewTrial:
        # Stopped or cancelled while the agents chose this trial: nothing is launched, the job ends.
        return {"stop_reason": _requested_stop(ctx.store.get_job(job_id)) or "stopped"}
    deaths = trial.attempts - trial.interruptions
    if trial.status == TrialStatus.RUNNING and (deaths >= MAX_DEATHS or trial.attempts >= MAX_LAUNCHES):
        # Its worker died during every allowed launch: record it lost rather than risk another.
        reason = f"its worker died during {deaths} launches" if deaths >= MAX_DEATHS else \
            f"it was launched {trial.attempts} times and never finished (its worker stopped or died each time)"
        trial = ctx.store.lose_trial(trial.id, reason, worker=ctx.worker)
        _emit(ctx, job_id, TrialLost(index=index, reason=reason))
    elif trial.status == TrialStatus.RUNNING:
        again = "" if not trial.attempts else " (re-run: its worker died)" if deaths else \
            " (re-run: its worker stopped)"
        _emit(ctx, job_id, TrialStarted(index=index, strategy=strategy.short(), rationale=clip(rationale + again, 500)))
        trial = await _launch(ctx, job_id, index, strategy, trial.id)
    _say(ctx, job_id, index, "validation", "result", {
        "status": trial.status.value, "metrics": trial.metrics.model_dump() if trial.metrics else None,
        "gpu_seconds": trial.gpu_seconds, "attempts": trial.attempts}, trial.log_excerpt[-500:])
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
    ctx.store.set_trial_failure(trial.id, failure, worker=ctx.worker)
    _say(ctx, job_id, trial.index, "failure", "diagnosis", failure.model_dump(mode="json"), failure.summary)
    return {}


def record(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    trials = ctx.store.trials(job_id)
    job = ctx.store.get_job(job_id)  # the live budget and any stop request
    last = trials[-1]
    best = _best(trials)
    if best:
        ctx.store.set_best_trial(job_id, best.id, worker=ctx.worker)
    _emit(ctx, job_id, TrialFinished(
        index=last.index, strategy=last.strategy.short(), status=last.status.value, mfu=last.mfu,
        mem_max_gib=last.metrics.mem_max_gib if last.metrics else None, mem_limit_gib=ctx.model.limit_gib,
        summary=last.failure.summary if last.failure else None, rationale=clip(last.rationale, 500),
        best_mfu=best.mfu if best else None))

    budget, gpu_hours = ctx.spec.budget, sum(t.gpu_seconds for t in trials) / 3600
    stop = _requested_stop(job)
    if stop:
        return {"stop_reason": stop}
    if len(trials) >= job.max_trials:
        stop = f"max trials ({job.max_trials}) reached"
    elif job.gpu_hours is not None and gpu_hours >= job.gpu_hours:
        stop = f"GPU-hour budget spent ({gpu_hours:.1f} of {job.gpu_hours})"
    elif budget.target_mfu is not None and best and best.mfu >= budget.target_mfu:
        stop = f"target MFU {budget.target_mfu:.1%} reached"
    elif budget.patience is not None and best and last.index - best.index >= budget.patience:
        stop = f"no improvement in {budget.patience} trials"
    if stop:
        return {"stop_reason": stop}
    if last.failure and last.failure.retry and last.status is TrialStatus.FAILED:
        attempts = sum(1 for t in trials if t.signature == last.signature)
        if attempts < MAX_ATTEMPTS:
            return {"candidate": last.strategy.model_dump(mode="json"), "retry": True,
                    "rationale": f"RETRY of trial {last.index}: {last.failure.summary}", "stop_reason": None}
    return {"retry": False, "stop_reason": None}


def _requested_stop(job: JobRecord) -> str | None:
    """Why the job ends because someone asked (a stop, a cancel), or None."""
    if job.status is JobStatus.STOPPING:
        return job.stop_reason or "stopped on request"
    if job.status is JobStatus.CANCELLED:
        return "cancelled"
    return None


def _analysis_input(ctx: LoopContext, trials: list[Trial], iteration: int) -> AnalysisInput:
    return AnalysisInput(workload=ctx.spec.workload, search_space=ctx.spec.search_space, history=trials,
                         prior=ctx.prior, reference=_reference(trials), candidates=ctx.candidates,
                         iteration=iteration)


def analyze(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    trials = _finished(ctx.store.trials(job_id))
    inp = _analysis_input(ctx, trials, iteration)
    faults.point("analysis")
    out = ctx.analysis.analyze(inp)  # a fallback to the rules is optico.agents.fallback's
    _say(ctx, job_id, iteration, "analysis", "output", out.model_dump(mode="json"),
         "\n".join(s.text for s in out.suggestions[:5]))
    faults.point("before_checkpoint")
    return {"analysis": out.model_dump(mode="json")}


def generate(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    trials = _finished(ctx.store.trials(job_id))
    analysis = AnalysisOutput.model_validate(state["analysis"])
    inp = GenerationInput(workload=ctx.spec.workload, search_space=ctx.spec.search_space,
                          reference=_reference(trials), analysis=analysis, history=trials, iteration=iteration)
    out = ctx.generation.generate(inp)  # a fallback to the rules is optico.agents.fallback's
    _say(ctx, job_id, iteration, "generation", "output", out.model_dump(mode="json"),
         "\n".join(p.rationale for p in out.proposals[:5]))
    return {"proposals": [p.model_dump(mode="json") for p in out.proposals]}


def _converged(ctx: LoopContext, trials: list[Trial]) -> str | None:
    """A stop reason once the next launches are not expected to pay (optico.agents.stopping)."""
    return converged(ctx.model, ctx.guard, ctx.pool, trials, ctx.prior, ctx.spec.budget)


def guard(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id, iteration = runtime.context, state["job_id"], state["next_index"]
    every = ctx.store.trials(job_id)
    trials = _finished(every)
    # A lost trial tells the model nothing, but its configuration was tried: its runs took their worker
    # down (or the run broke); launching it again under the next index spends the budget on the same.
    tried = [t for t in every if t.status is not TrialStatus.RUNNING]
    proposals = GenerationOutput.model_validate({"proposals": state.get("proposals", [])}).proposals
    rejected = []
    converged = _converged(ctx, trials)
    if converged:
        _say(ctx, job_id, iteration, "guard", "verdict", {"admitted": None, "rejected": []}, converged)
        return {"candidate": None, "stop_reason": converged}
    for attempt in ("reasoner", "rules fallback"):
        for p in proposals:
            verdict = ctx.guard.check(p.strategy, tried, ctx.prior)
            if verdict.admitted:
                _say(ctx, job_id, iteration, "guard", "verdict",
                     {"admitted": p.strategy.model_dump(mode="json"), "rejected": rejected, "source": attempt},
                     p.rationale)
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
    reason = _exhausted(ctx, tried, rejected)
    _say(ctx, job_id, iteration, "guard", "verdict", {"admitted": None, "rejected": rejected}, reason)
    return {"candidate": None, "stop_reason": reason}


def _exhausted(ctx: LoopContext, tried: list[Trial], rejected: list[dict[str, Any]]) -> str:
    """The stop reason when nothing is admitted, saying why: "exhausted" after one trial reads as a
    bug when every configuration left is predicted to run out of memory."""
    left = ctx.guard.check_all(ctx.pool, tried, ctx.prior)
    admissible = sum(v.admitted for v in left)
    if admissible == 0:
        why = Counter(v.rule for v in left)
        return (f"search space exhausted: the guard admits none of its {len(left)} configurations ("
                + ", ".join(f"{n} {rule}" for rule, n in why.most_common()) + ")")
    refused = Counter(r["rule"] for r in rejected)
    return (f"search space exhausted: the agents proposed none of the {admissible} configurations the guard "
            f"still admits" + (" (they proposed " + ", ".join(f"{n} {rule}" for rule, n in refused.most_common())
                               + ")" if refused else ""))


def finish(state: LoopState, runtime: Runtime[LoopContext]) -> LoopState:
    ctx, job_id = runtime.context, state["job_id"]
    complete_job(ctx.store, job_id, ctx.worker, state.get("stop_reason") or "stopped", on_event=ctx.on_event)
    return {}


def complete_job(store: Store, job_id: int, worker: str, reason: str, *, on_event: EventSink | None = None) -> None:
    """Marks the job succeeded with `reason` (unless it was cancelled meanwhile) and says so; failed
    when no trial succeeded (nothing fits, every launch failed): a tuning job that measured nothing
    found nothing, and scripts read the status. Safe to repeat: the runner calls it again when a
    resumed graph had nothing left to run."""
    job = store.get_job(job_id)
    if job.status not in (JobStatus.RUNNING, JobStatus.STOPPING):
        return
    trials = store.trials(job_id)
    best = _best(trials)
    if best:
        store.set_best_trial(job_id, best.id, worker=worker)
    outcome = JobStatus.SUCCEEDED if best else JobStatus.FAILED
    event = JobFinished(status=outcome.value, stop_reason=reason, trials=len(trials),
                        best_mfu=best.mfu if best else None)
    store.transition(job_id, outcome, reason=reason, worker=worker, then=event)
    if on_event:
        on_event(event.kind, event.model_dump(mode="json"))


# -- routing -----------------------------------------------------------------------

def after_validate(state: LoopState, runtime: Runtime[LoopContext]) -> Literal["diagnose", "record", "finish"]:
    if state.get("stop_reason"):
        return "finish"  # no trial was started (the job was stopped meanwhile)
    trials = runtime.context.store.trials(state["job_id"], after_index=state["next_index"] - 2)
    last = next(t for t in trials if t.index == state["next_index"] - 1)
    return "diagnose" if last.status == TrialStatus.FAILED else "record"


def after_record(state: LoopState) -> Literal["finish", "validate", "analyze"]:
    if state.get("stop_reason"):
        return "finish"
    return "validate" if state.get("retry") else "analyze"


def launch_or_finish(state: LoopState) -> Literal["validate", "finish"]:
    return "finish" if state.get("stop_reason") else "validate"


def build_graph() -> StateGraph:
    g = StateGraph(LoopState, context_schema=LoopContext)
    for name, fn in [("seed", seed), ("validate", validate), ("diagnose", diagnose), ("record", record),
                     ("analyze", analyze), ("generate", generate), ("guard", guard), ("finish", finish)]:
        g.add_node(name, fn)
    g.add_edge(START, "seed")
    g.add_conditional_edges("seed", launch_or_finish, {"validate": "validate", "finish": "finish"})
    g.add_conditional_edges("validate", after_validate, {"diagnose": "diagnose", "record": "record",
                                                         "finish": "finish"})
    g.add_edge("diagnose", "record")
    g.add_conditional_edges("record", after_record, {"finish": "finish", "validate": "validate",
                                                     "analyze": "analyze"})
    g.add_edge("analyze", "generate")
    g.add_edge("generate", "guard")
    g.add_conditional_edges("guard", launch_or_finish, {"validate": "validate", "finish": "finish"})
    g.add_edge("finish", END)
    return g

"""Runs a job: builds the agents, the launcher and the guard, then drives the graph."""

from __future__ import annotations

from optico.agents.analysis import RulesAnalysis
from optico.agents.failure import NoFailureAnalysis, RulesFailureAnalysis
from optico.agents.fallback import FallbackRefused, WithFallback, pool_notifier
from optico.agents.generation import RulesGeneration
from optico.checkpoint import open_checkpointer, thread_config
from optico.guard import Guard
from optico.launchers.base import Launcher
from optico.launchers.factory import build_launcher
from optico.loop import EventSink, LoopContext, build_graph
from optico.perfmodel.constants import load_constants
from optico.perfmodel.online import JobModel
from optico.pool.records import JobStatus
from optico.pool.store import Store
from optico.spec import JobSpec
from optico.strategy import Strategy


def search_pool(spec: JobSpec, launcher: Launcher) -> tuple[list[Strategy], list[Strategy] | None]:
    """(every strategy the job may run, the launcher's finite set or None)."""
    candidates = launcher.candidates(spec.workload)
    if candidates is None:
        return list(spec.search_space.enumerate(spec.workload)), None
    inside = [s for s in candidates if spec.search_space.contains(s)]
    return inside, inside


def build_context(spec: JobSpec, store: Store, job_id: int, *, launcher: Launcher | None = None,
                  on_event: EventSink | None = None) -> LoopContext:
    constants = load_constants(spec.calibration)
    launcher = launcher or build_launcher(spec.launcher, spec.seed, constants)
    model = JobModel(spec.workload, constants)
    pool, candidates = search_pool(spec, launcher)
    model.prime(pool)
    guard = Guard(spec.workload, spec.search_space, model, candidates)
    prior = store.workload_trials(spec.workload.key(), exclude_job=job_id)
    rules_analysis = RulesAnalysis(model, guard, pool)
    rules_generation = RulesGeneration()
    rules_failure = RulesFailureAnalysis()
    analysis, generation, failure = rules_analysis, rules_generation, rules_failure
    chosen = spec.reasoner
    # Every reasoner that is not the rules is wrapped: a fallback to the rules is recorded, shown
    # and, with require_llm, an error (optico.agents.fallback).
    notify = pool_notifier(store, job_id, on_event)
    if chosen.uses_llm:
        # Imported here: a rules-only job never loads the openai package. Settings come from
        # OPTICO_LLM_*; a missing model or key raises ValueError naming the variable.
        from optico.agents.llm import build_llm_reasoners

        def record(agent: str, iteration: int, kind: str, content: dict, text: str = "") -> None:
            store.add_message(job_id, iteration, agent, kind, content, text)

        def vet(strategy: Strategy, history: list) -> str | None:
            verdict = guard.check(strategy, history, prior)
            return None if verdict.admitted else f"{verdict.rule}: {verdict.reason}"

        llm = build_llm_reasoners(spec, rules_analysis, record, vet=vet)
        wrap = {"require_llm": chosen.require_llm}
        if chosen.analysis != "rules":
            analysis = WithFallback("analysis", llm.analysis, rules_analysis, notify, **wrap)
        if chosen.generation != "rules":
            generation = WithFallback("generation", llm.generation, rules_generation, notify, **wrap)
        if chosen.failure != "rules":
            failure = WithFallback("failure", llm.failure, rules_failure, notify, **wrap)
    if chosen.ablated("failure-analysis"):
        failure = WithFallback("failure", NoFailureAnalysis(), rules_failure, notify)
    return LoopContext(store=store, spec=spec, launcher=launcher, model=model, guard=guard, pool=pool,
                       analysis=analysis, generation=generation, failure=failure,
                       rules_analysis=rules_analysis, rules_generation=rules_generation,
                       rules_failure=rules_failure, on_event=on_event, prior=prior, candidates=candidates)


def run_job(store: Store, database_url: str, job_id: int, *, launcher: Launcher | None = None,
            on_event: EventSink | None = None) -> None:
    """Runs (or resumes) job `job_id` to completion; its checkpoints share the pool's database."""
    spec = store.get_job(job_id).spec
    ctx = build_context(spec, store, job_id, launcher=launcher, on_event=on_event)
    with open_checkpointer(database_url) as saver:
        app = build_graph().compile(checkpointer=saver)
        config = thread_config(job_id)
        snapshot = app.get_state(config)
        if snapshot.values and not snapshot.next:
            return  # finished before
        start = None if snapshot.next else {"job_id": job_id, "next_index": 1}
        try:
            app.invoke(start, config, context=ctx, durability="sync")
        except FallbackRefused as exc:  # require_llm: the job fails, naming the fallback
            store.set_job_status(job_id, JobStatus.FAILED, stop_reason=str(exc))
            raise

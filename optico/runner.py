"""Runs a job: builds the agents, the launcher and the guard, then drives the graph."""

from __future__ import annotations

from optico.agents.analysis import RulesAnalysis
from optico.agents.failure import RulesFailureAnalysis
from optico.agents.generation import RulesGeneration
from optico.candidates import candidate_pool
from optico.checkpoint import open_checkpointer, thread_config
from optico.guard import Guard
from optico.launchers.base import Launcher
from optico.launchers.factory import build_launcher
from optico.loop import EventSink, LoopContext, build_graph
from optico.perfmodel.constants import load_constants
from optico.perfmodel.online import JobModel
from optico.pool.store import Store
from optico.spec import JobSpec
from optico.strategy import Strategy


def search_pool(spec: JobSpec, launcher: Launcher) -> tuple[list[Strategy], list[Strategy] | None]:
    """(the strategies the agents score — the valid space, or for a large space its coarse lattice
    plus the moves around each reference, see optico.candidates — and the launcher's finite set or None)."""
    candidates = launcher.candidates(spec.workload)
    if candidates is None:
        return candidate_pool(spec.search_space, spec.workload), None
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
    if "openai" in (chosen.analysis, chosen.generation, chosen.failure):
        # Imported here: a rules-only job never loads the openai package. Settings come from
        # OPTICO_LLM_*; a missing model or key raises ValueError naming the variable.
        from optico.agents.llm import build_llm_reasoners

        def record(agent: str, iteration: int, kind: str, content: dict, text: str = "") -> None:
            store.add_message(job_id, iteration, agent, kind, content, text)

        llm = build_llm_reasoners(spec, rules_analysis, record)
        analysis = llm.analysis if chosen.analysis == "openai" else analysis
        generation = llm.generation if chosen.generation == "openai" else generation
        failure = llm.failure if chosen.failure == "openai" else failure
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
        app.invoke(start, config, context=ctx, durability="sync")

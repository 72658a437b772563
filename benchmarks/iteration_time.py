"""Agent + guard time per iteration of a tuning job (the offline reasoners on the simulator).

    python benchmarks/iteration_time.py [--iterations 8]

Times what runs between two trials — analysis, generation, the guard's convergence test and
admission — on Llama3-8B / 8×A100 with the default tunables plus FIRST_PP_NUM_LAYERS,
LAST_PP_NUM_LAYERS and AC_LAYERS (a product of ~50 M points), and the set-up that builds the
candidate pool. The simulator stands in for the runs; its time is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from optico.agent_contracts import AnalysisInput, GenerationInput
from optico.agents.seeding import start_configuration
from optico.loop import _converged
from optico.pool.store import SqlStore
from optico.runner import build_context
from optico.search_space import DEFAULT_TUNABLES, SearchSpace
from optico.spec import Budget, JobSpec, LauncherSpec
from optico.trial import FailureCategory, Failure, TrialStatus
from optico.workload import PRESETS, Cluster, Workload

LARGE_TUNABLES = [*DEFAULT_TUNABLES, "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                  "recompute_num_layers"]


def large_spec() -> JobSpec:
    w = Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=512, precision="bf16",
                 cluster=Cluster(gpu="a100-80gb", gpus_per_node=8, nodes=1))
    space = SearchSpace.build(w, LARGE_TUNABLES)
    return JobSpec(name="iteration-time", workload=w, search_space=space, budget=Budget(max_trials=30),
                   launcher=LauncherSpec(kind="sim", hang_rate=0.0))


def measure(spec: JobSpec, iterations: int, db_dir: Path) -> dict[str, Any]:
    store = SqlStore(f"sqlite:///{db_dir / 'pool.db'}")
    job_id = store.create_job(spec)
    start = time.perf_counter()
    ctx = build_context(spec, store, job_id, worker="iteration-time")
    setup = time.perf_counter() - start

    def run(index: int, strategy) -> None:
        trial = store.start_trial(job_id, index, strategy)
        result = asyncio.run(ctx.launcher.launch(spec.workload, strategy, trial_key=f"t{index}"))
        failure = None if result.ok else Failure(category=result.category_hint or FailureCategory.UNKNOWN,
                                                 summary="failed", confidence=90, params=[])
        store.finish_trial(trial.id, status=TrialStatus.OK if result.ok else TrialStatus.FAILED,
                           metrics=result.metrics, failure=failure, gpu_seconds=result.gpu_seconds)

    seed, _ = start_configuration(ctx.pool, ctx.model, [])
    run(1, seed)
    times = []
    for index in range(2, iterations + 2):
        trials = store.trials(job_id)
        ok = [t for t in trials if t.status == TrialStatus.OK and t.metrics]
        reference = max(ok, key=lambda t: t.metrics.mfu).strategy if ok else trials[-1].strategy
        t0 = time.perf_counter()
        analysis = ctx.analysis.analyze(AnalysisInput(
            workload=spec.workload, search_space=spec.search_space, history=trials, reference=reference,
            iteration=index))
        proposals = ctx.generation.generate(GenerationInput(
            workload=spec.workload, search_space=spec.search_space, reference=reference, analysis=analysis,
            history=trials, iteration=index)).proposals
        _converged(ctx, trials)
        chosen = next((p.strategy for p in proposals if ctx.guard.check(p.strategy, trials).admitted), None)
        times.append(time.perf_counter() - t0)
        if chosen is None:
            break
        run(index, chosen)
    store.close()
    return {"space_points": spec.search_space.size(), "pool": len(ctx.pool),
            "pool_complete": getattr(ctx.pool, "complete", True), "setup_s": setup,
            "iteration_s": times, "median_s": statistics.median(times), "max_s": max(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(large_spec(), args.iterations, Path(tmp))
    print(f"space {out['space_points']:,} points; pool {out['pool']} (complete: {out['pool_complete']}); "
          f"set-up {out['setup_s']:.2f} s")
    print("agent + guard per iteration (s): " + ", ".join(f"{t:.3f}" for t in out["iteration_s"])
          + f"; median {out['median_s']:.3f}, max {out['max_s']:.3f}")


if __name__ == "__main__":
    main()

"""Runs the benchmark: which landscapes, every tuner on each for every seed, then the figures.

Work is split by landscape: a worker builds one landscape (enumerates its space, evaluates the
truth), runs every tuner on it for every seed, and returns plain data. With `jobs > 1` the
workers are forked processes that inherit the imports of the parent (LangGraph, SQLAlchemy and
Optuna cost seconds to import; a fork pays that once).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Literal

from optico.bench.landscapes import (
    PACKAGED_REPLAY,
    LandscapeSkipped,
    ReplayDef,
    SimDef,
    model_agreement,
    replay_defs,
    sim_defs,
)
from optico.bench.metrics import curve_band, median_metrics, reached_share, run_metrics
from optico.bench.tuners import make_tuner
from optico.replay_csv import ReplayError
from optico.spec import ReasonerSpec

Suite = Literal["sim", "replay", "all"]
LandscapeDef = SimDef | ReplayDef
DEFAULT_TUNERS: tuple[str, ...] = ("optico", "random", "grid", "optuna")


def select_landscapes(suite: Suite = "all", files: Sequence[str | Path] = (), only: Sequence[str] = (),
                      all_clusters: bool = False) -> list[LandscapeDef]:
    """The suite's landscapes plus every workload of `files`; `only` keeps names containing any of
    its strings; `all_clusters` runs every preset on 8, 16 and 64 GPUs of both kinds."""
    if suite not in ("sim", "replay", "all"):
        raise ValueError(f"--suite: {suite!r} is not one of sim, replay, all")
    defs: list[LandscapeDef] = []
    if suite in ("sim", "all"):
        defs += sim_defs(all_clusters=all_clusters)
    if suite in ("replay", "all"):
        defs += replay_defs(PACKAGED_REPLAY)
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise ValueError(f"--landscape: no such file: {path}")
        try:
            found = replay_defs(path)
        except ReplayError as exc:  # one unreadable file must not abort the benchmark: say so, run the rest
            print(f"warning: --landscape: {exc}; skipped", file=sys.stderr)
            continue
        if not found:
            print(f"warning: --landscape: {path} has no workload with enough measured configurations; skipped",
                  file=sys.stderr)
            continue
        defs += [d for d in found if d.name not in {x.name for x in defs}]
    if only:
        defs = [d for d in defs if any(o in d.name for o in only)]
    return defs


def run_landscape(defn: LandscapeDef, tuners: Sequence[str], budget: int, seeds: int,
                  reasoner: ReasonerSpec | None = None, fidelity: bool = False) -> dict[str, Any]:
    """One landscape: {"landscape": summary, "runs": {tuner: [per-seed run metrics + trials]}, "seconds"}."""
    t0 = time.perf_counter()
    try:
        landscape = defn.build()
    except LandscapeSkipped as exc:
        return {"name": defn.name, "skipped": str(exc), "seconds": {"build": time.perf_counter() - t0}}
    seconds = {"build": time.perf_counter() - t0}
    summary = landscape.summary()
    if fidelity:
        summary["model_agreement"] = model_agreement(landscape)
    runs: dict[str, list[dict[str, Any]]] = {}
    names = list(tuners) + (["expert"] if landscape.expert is not None and "expert" not in tuners else [])
    for name in names:
        tuner = make_tuner(name, reasoner)
        t1 = time.perf_counter()
        runs[name] = []
        for seed in range(seeds):
            outcomes = tuner.run(landscape, budget, seed)
            m = run_metrics(outcomes, landscape.optimum_mfu, landscape.expert_mfu, budget)
            m["trials_log"] = [o.__dict__ for o in outcomes]
            if getattr(tuner, "last_stop_reason", None):
                m["stop_reason"] = tuner.last_stop_reason
            runs[name].append(m)
        seconds[name] = time.perf_counter() - t1
    return {"name": landscape.name, "landscape": summary, "runs": runs, "seconds": seconds}


def _warm_imports() -> None:
    """Imports the workers need, done once before forking."""
    import optuna  # noqa: F401

    import optico.runner  # noqa: F401
    from optico.pool.store import SqlStore  # noqa: F401


def run_benchmark(defs: Sequence[LandscapeDef], tuners: Sequence[str] = DEFAULT_TUNERS, budget: int = 20,
                  seeds: int = 5, jobs: int = 1, reasoner: ReasonerSpec | None = None, fidelity: bool = False,
                  on_done: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every tuner on every landscape for seeds 0..seeds-1; returns the result document (see
    `optico.bench.report.result_document`)."""
    if budget < 1 or seeds < 1:
        raise ValueError("--budget and --seeds must be at least 1")
    for name in tuners:
        make_tuner(name, reasoner)  # fails fast on an unknown name
    start, cpu0 = time.perf_counter(), os.times()
    _warm_imports()
    results: list[dict[str, Any]] = []
    if jobs <= 1:
        for d in defs:
            results.append(run_landscape(d, tuners, budget, seeds, reasoner, fidelity))
            if on_done:
                on_done(results[-1])
    else:
        # Largest spaces first, so the last worker does not start a big one alone at the end.
        order = sorted(defs, key=lambda d: -d.size_hint())
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            futures = [pool.submit(run_landscape, d, tuners, budget, seeds, reasoner, fidelity) for d in order]
            for fut in as_completed(futures):
                results.append(fut.result())
                if on_done:
                    on_done(results[-1])
    wall = time.perf_counter() - start
    cpu1 = os.times()
    cpu = (cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system
           - cpu0.user - cpu0.system - cpu0.children_user - cpu0.children_system)
    index = {d.name: i for i, d in enumerate(defs)}
    results.sort(key=lambda r: index.get(r["name"], len(index)))
    return aggregate(results, list(tuners), budget, seeds,
                     meta={"wall_seconds": wall, "cpu_seconds": cpu, "jobs": jobs, "cpus": os.cpu_count()})


def aggregate(results: list[dict[str, Any]], tuners: list[str], budget: int, seeds: int,
              meta: dict[str, Any]) -> dict[str, Any]:
    """The result document from per-landscape results (the JSON layout of docs/benchmarks.md)."""
    done = [r for r in results if "skipped" not in r]
    names = list(tuners) + (["expert"] if "expert" not in tuners and any("expert" in r["runs"] for r in done)
                            else [])
    landscapes = []
    per_tuner: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    all_runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in done:
        entry = {"name": r["name"], "kind": r["landscape"]["kind"], "optimum_mfu": r["landscape"]["optimum_mfu"],
                 "expert_mfu": r["landscape"]["expert_mfu"], "landscape": r["landscape"], "tuners": {},
                 "seconds": r["seconds"]}
        for n in names:
            runs = r["runs"].get(n)
            if not runs:
                continue
            med = median_metrics(runs)
            med["reached_98"] = reached_share(runs, budget)
            entry["tuners"][n] = med
            per_tuner[n].append(med)
            all_runs[n].extend(runs)
        landscapes.append(entry)
    tuner_figures = {}
    for n in names:
        fig = median_metrics(per_tuner[n]) if per_tuner[n] else None
        if fig is not None:
            fig["reached_98"] = reached_share(all_runs[n], budget)
            fig["landscapes"] = len(per_tuner[n])
            fig["runs"] = len(all_runs[n])
        tuner_figures[n] = fig
    curves = {n: curve_band(all_runs[n]) for n in names if all_runs[n]}
    return {
        "tuners": tuner_figures,
        "landscapes": landscapes,
        "skipped": [{"name": r["name"], "reason": r["skipped"]} for r in results if "skipped" in r],
        "curves": curves,
        "runs": {r["name"]: {n: [{k: v for k, v in run.items() if k != "curve"} for run in runs]
                             for n, runs in r["runs"].items()} for r in done},
        "meta": {"budget": budget, "seeds": seeds, "tuners": names, "landscapes": len(done), **meta},
    }

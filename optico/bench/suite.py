"""Runs the benchmark: which landscapes, every tuner on each for every seed, then the figures.

Work is split by landscape: a worker builds one landscape (enumerates its space, evaluates the
truth), runs every tuner on it for every seed, and returns plain data. With `jobs > 1` the
workers are forked processes that inherit the imports of the parent (LangGraph, SQLAlchemy and
Optuna cost seconds to import; a fork pays that once).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from optico.bench import DEFAULT_TUNERS, separation
from optico.bench.ceiling import clairvoyant_ceiling
from optico.bench.landscapes import (
    MIN_REPLAY_CONFIGS,
    PACKAGED_REPLAY,
    LandscapeSkipped,
    ReplayDef,
    SimDef,
    model_agreement,
    replay_defs,
    sim_defs,
)
from optico.bench.metrics import run_metrics
from optico.bench.summary import summarize
from optico.bench.thirdparty import ThirdPartyDef, thirdparty_defs
from optico.bench.tuners import make_tuner
from optico.blas_threads import limit_blas_threads
from optico.errors import SpecError, first_line
from optico.replay_format import ReplayError, ReplayRow
from optico.spec import ReasonerSpec
from optico.textsafe import terminal_text

Suite = Literal["all", "independent", "out-of-form", "real", "self", "sim", "replay"]
LandscapeDef = SimDef | ReplayDef | ThirdPartyDef
GROUPS = ("independent", "out-of-form", "real", "self")
# The out-of-form effects' size in the default suite (log step time std dev, ~ relative MFU error): the
# performance model's median MFU error on real data is ~9 %, its tail ~15 % (docs/benchmarks.md).
EFFECT_SIZE = 0.10
# Simulated landscapes of the out-of-form family and of the self-generated sanity check. Out-of-form:
# seven, because with four one landscape decided the lead (docs/benchmarks.md): every preset but the
# 70B (its 4,824 configurations cost a fifth of the suite's time; the independent group has it), both
# GPU kinds, 8, 16 and 64 GPUs. The three added were chosen by coverage (the 70B was dropped after a
# timing run, for its cost, before any figure of that run was read).
OUT_OF_FORM = ("llama2-7b-a100-8", "llama3-8b-h100-8", "gpt3-7b-a100-16", "mixtral-8x7b-h100-16",
               "qwen2.5-7b-a100-64", "qwen3-moe-24l-h100-8", "llama2-7b-h100-64")
SELF = ("llama3-8b-a100-8", "qwen2.5-7b-h100-64", "qwen3-moe-24l-a100-8")
QUICK = {"independent": 2, "out-of-form": 2, "real": 2, "self": 1}
REPO_DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
OPTION = "--landscape"  # the option that names extra replay CSVs (errors name it)


def real_files() -> list[Path]:
    """Every real measurement table the repository holds: the published ones, ours, the packaged one."""
    files = sorted(separation.PUBLISHED_DATA.glob("*.csv")) + sorted(REPO_DATA.glob("*.csv")) + [PACKAGED_REPLAY]
    return [f for f in files if f.is_file()]


def landscape_seed(dev: bool) -> int:
    """Development landscapes (tuning) or the frozen test draw (reporting)."""
    return separation.DEV_LANDSCAPE_SEEDS[1] if dev else separation.test_landscape_seed(0)


def _named(defs: list, names: Sequence[str], suffix: str) -> list:
    return [d for d in defs if d.name.removesuffix(suffix) in names]


def select_landscapes(suite: Suite = "all", files: Sequence[str | Path] = (), only: Sequence[str] = (),
                      all_clusters: bool = False, dev: bool = False, sweep: Sequence[float] = (),
                      quick: bool = False, strict: bool = False) -> list[LandscapeDef]:
    """The suite's landscapes (see docs/benchmarks.md) plus every workload of `files`; `only` keeps
    names containing any of its strings; `sweep` adds the out-of-form family at each effect size;
    `dev` draws development instead of test landscapes; `quick` keeps a few of each group.

    A file that cannot be read (missing, not a regular file, too large, not UTF-8, NUL bytes)
    raises SpecError naming --landscape. One that is no replay table, or a table without a workload
    of enough measured configurations, is skipped with a warning — or, with `strict` (the command
    line: the user named the file to benchmark it), raises SpecError too. (A workload the tuner's
    calibration saw is a landscape, refused when built: reported as skipped.)"""
    if suite not in ("all", "independent", "out-of-form", "real", "self", "sim", "replay"):
        raise ValueError(f"--suite: {suite!r} is not one of all, independent, out-of-form, real, self, sim, replay")
    # The named files first: a file that cannot be read is refused before any suite work.
    named = [d for f in files for d in _file_defs(Path(f), strict)]
    seed = landscape_seed(dev)
    groups = {"sim": ["self"], "replay": ["real"]}.get(suite, [suite] if suite != "all" else list(GROUPS))
    defs: list[LandscapeDef] = []
    if "independent" in groups:
        defs += thirdparty_defs(seed, dev=dev)
    if "out-of-form" in groups:
        # --all-clusters: every preset and cluster (the wider set to develop on; four are reported).
        oof = sim_defs(seed, all_clusters=all_clusters, effect_size=EFFECT_SIZE, group="out-of-form", suffix="+oof")
        defs += oof if all_clusters else _named(oof, OUT_OF_FORM, "+oof")
    if "real" in groups:
        seen: set[str] = set()
        for f in real_files() if suite != "replay" else [PACKAGED_REPLAY]:
            for d in replay_defs(f):
                if d.name not in seen:
                    seen.add(d.name)
                    defs.append(d)
    if "self" in groups:
        sims = sim_defs(seed, all_clusters=all_clusters)
        defs += sims if suite == "sim" else _named(sims, SELF, "")
    for size in sweep:
        tag = f"+oof{size:.2f}"
        defs += _named(sim_defs(seed, effect_size=size, group=f"sweep {size:.2f}", suffix=tag), OUT_OF_FORM, tag)
    if quick:
        kept: list[LandscapeDef] = []
        for d in defs:
            g = _group(d)
            if sum(_group(k) == g for k in kept) < QUICK.get(g, 1):
                kept.append(d)
        defs = kept
    # A file the user named is run whatever its landscapes are called: it replaces a suite landscape of
    # the same name (an edited copy of a shipped table ran the shipped one), and two named files whose
    # names clash (day1/results.csv, day2/results.csv) are told apart (the second was dropped unsaid).
    mine: list[LandscapeDef] = []
    for d in named:
        if any(x.name == d.name for x in mine):
            d = d.model_copy(update={"name": _unclashed(d.name, {x.name for x in mine})})
        defs = [x for x in defs if x.name != d.name]
        mine.append(d)
    defs += mine
    if only:
        defs = [d for d in defs if any(o in d.name for o in only)]
    return defs


def _unclashed(name: str, taken: set[str]) -> str:
    return next(f"{name}#{n}" for n in range(2, len(taken) + 3) if f"{name}#{n}" not in taken)


def _file_defs(path: Path, strict: bool) -> list[ReplayDef]:
    """The landscapes of one named replay CSV (see `select_landscapes` for what is refused)."""
    from optico.input_files import read_text
    from optico.replay_csv import MAX_CSV_BYTES, read_replay_csv

    read_text(path, OPTION, "replay CSV", MAX_CSV_BYTES)  # SpecError: missing, binary, not UTF-8, ...
    try:
        rows = read_replay_csv(path)  # ReplayError: not a table, more than MAX_CSV_ROWS rows, a broken CSV
        left_out: list[str] = []
        found = replay_defs(path, rows=rows, left_out=left_out)
    except (ReplayError, OSError) as exc:
        reason = first_line(exc)
        if strict:
            raise SpecError(OPTION, reason if str(path) in reason else f"{path}: {reason}") from None
        # A library caller: one unreadable file does not abort the benchmark; say so, run the rest.
        print(terminal_text(f"warning: {OPTION}: {reason}; skipped", one_line=True), file=sys.stderr)
        return []
    broken = _malformed_text(path, rows)
    unusable = _unusable_text(path, rows)
    if not found:
        read = sum(row.read for row in rows)
        reason = (f"{path} has no workload with enough measured configurations (at least {MIN_REPLAY_CONFIGS} "
                  f"usable rows of one workload, one of them a run that finished; {read} of its {len(rows)} rows "
                  f"read)")
        if strict:  # one line: the refusal says what was broken, and what was left out, too
            raise SpecError(OPTION, "; ".join(filter(None, [reason, broken, unusable])))
        print(terminal_text(f"warning: {OPTION}: {reason}; skipped", one_line=True), file=sys.stderr)
    elif strict:
        from optico.redact import redact

        # A workload of the file that is no landscape was left out unsaid ("replay every workload").
        said = [f"{path}: a workload left out: {w}" for w in left_out[:5]]
        if len(left_out) > 5:
            said.append(f"{path}: {len(left_out) - 5} more workloads left out")
        for text in filter(None, (broken, unusable, *said)):
            print(terminal_text(redact(f"warning: {OPTION}: {text}"), one_line=True), file=sys.stderr)
    return found


def _malformed_text(path: Path, rows: list[ReplayRow]) -> str:
    """Which rows of a named file are broken (a cell that is no value, more or fewer fields than the
    header) and what became of them: the benchmark leaves out a row it cannot read and reads a short
    one with its missing cells unknown, where a spec's own replay file is refused for either. '' when
    none is."""
    broken = [row for row in rows if row.malformed]
    if not broken:
        return ""
    left_out = sum(not row.read for row in broken)
    read = len(broken) - left_out
    fate = ", ".join(filter(None, [f"{left_out} left out" if left_out else "",
                                   f"{read} read with their missing cells unknown" if read else ""]))
    first = broken[0]
    return f"{len(broken)} malformed row(s) of {path}, {fate} (first {first.where}: {first.malformed[0]})"


def _unusable_text(path: Path, rows: list[ReplayRow]) -> str:
    """Which well-formed rows of a named file no landscape can hold (a configuration the rules refuse,
    a measurement no GPU makes, a precision the model does not cover) and the first one's reason; ''
    when none is."""
    unusable = [row for row in rows if not row.read and not row.malformed]
    if not unusable:
        return ""
    first = unusable[0]
    reason = (first.skip_reason or "").split("; ")[0]
    return f"{len(unusable)} row(s) of {path} left out (first {first.where}: {reason})"


def _group(d: LandscapeDef) -> str:
    return "independent" if isinstance(d, ThirdPartyDef) else d.group


@contextmanager
def _long_lived_frozen() -> Iterator[None]:
    """Moves what exists now (the imports, the landscape and its truth) out of the garbage
    collector's way while the tuners run, and back afterwards so it may be freed. A full collection
    walked all of it every few launches: a tenth of an OptiCo run's CPU on the largest landscapes."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


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
        summary["ceiling"] = clairvoyant_ceiling(landscape, sorted({10, budget}))
    runs: dict[str, list[dict[str, Any]]] = {}
    names = list(tuners) + (["expert"] if landscape.expert is not None and "expert" not in tuners else [])
    with _long_lived_frozen():
        for name in names:
            tuner = make_tuner(name, reasoner)
            t1 = time.perf_counter()
            runs[name] = []
            for seed in range(seeds):
                outcomes = tuner.run(landscape, budget, seed)
                m = run_metrics(outcomes, landscape.optimum_mfu, landscape.expert_mfu, budget)
                m["seed"] = seed
                m["trials_log"] = [o.__dict__ for o in outcomes]
                if getattr(tuner, "last_stop_reason", None):
                    m["stop_reason"] = tuner.last_stop_reason
                runs[name].append(m)
            seconds[name] = time.perf_counter() - t1
    return {"name": landscape.name, "landscape": summary, "runs": runs, "seconds": seconds}


def _warm_imports() -> None:
    """Imports the workers need, done once before forking."""
    import optuna  # noqa: F401
    import torch

    import optico.runner  # noqa: F401

    torch.set_num_threads(1)  # the GP baseline: threads fighting over 2 cores cost 4x
    limit_blas_threads()  # with two workers on 2 cores, Optuna's GP sampler ran twice as long without
    from optico.pool.store import SqlStore  # noqa: F401


def run_benchmark(defs: Sequence[LandscapeDef], tuners: Sequence[str] = DEFAULT_TUNERS, budget: int = 20,
                  seeds: int = 20, jobs: int = 1, reasoner: ReasonerSpec | None = None, fidelity: bool = True,
                  on_done: Callable[[dict[str, Any]], None] | None = None,
                  meta: dict[str, Any] | None = None) -> dict[str, Any]:
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
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=limit_blas_threads) as pool:
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
                     meta={"wall_seconds": wall, "cpu_seconds": cpu, "jobs": jobs, "cpus": os.cpu_count(),
                           **(meta or {})})


def aggregate(results: list[dict[str, Any]], tuners: list[str], budget: int, seeds: int,
              meta: dict[str, Any]) -> dict[str, Any]:
    """The result document from per-landscape results (docs/benchmarks.md, "JSON")."""
    return summarize(results, tuners, budget, seeds, {**meta, "frozen": separation.check_frozen(),
                                                      "frozen_digest": separation.frozen_digest()})

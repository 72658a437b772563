"""The tuner benchmark on a tiny suite: schema, medians, thresholds, hidden landscapes, same space, plot."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from optico.bench.landscapes import DEVIATIONS, BenchLauncher, draw_hidden
from optico.bench.metrics import AT_BUDGETS, best_so_far, run_metrics
from optico.bench.report import markdown, plot, result_document, write_json
from optico.bench.suite import select_landscapes
from optico.bench.tuners import OptunaTuner, RandomTuner, TrialOutcome
from optico.perfmodel.constants import load_constants
from optico.runner import search_pool
from tests.bench.conftest import BUDGET, SEEDS, TUNERS, tiny_sim
from tests.conftest import optico_cmd

KEYS = {"frac_of_opt_at", "trials_to_98", "trials_to_expert", "failed_frac", "gpu_hours"}


def _outcome(i: int, measured: float | None, true: float | None) -> TrialOutcome:
    return TrialOutcome(index=i, signature=f"s{i}", config=f"c{i}", ok=measured is not None, measured_mfu=measured,
                        true_mfu=true, failure=None if measured is not None else "oom", gpu_seconds=3600.0)


def test_json_schema(tiny_doc, tmp_path: Path):
    path = tmp_path / "results.json"
    write_json(tiny_doc, path)
    doc = json.loads(path.read_text())
    assert set(doc["tuners"]) == {*TUNERS, "expert"}
    for name, fig in doc["tuners"].items():
        assert KEYS <= set(fig), name
        assert set(fig["frac_of_opt_at"]) == {"5", "10", "20"}
        assert all(0.0 <= v <= 1.0 + 1e-9 for v in fig["frac_of_opt_at"].values())
        assert 0.0 <= fig["failed_frac"] <= 1.0 and fig["gpu_hours"] > 0
    assert len(doc["landscapes"]) == 2
    for entry in doc["landscapes"]:
        assert {"name", "optimum_mfu", "tuners"} <= set(entry)
        assert 0 < entry["optimum_mfu"] < 1
        for name, fig in entry["tuners"].items():
            assert KEYS <= set(fig), (entry["name"], name)
    assert doc["meta"]["budget"] == BUDGET and doc["meta"]["seeds"] == SEEDS
    assert doc["goals"] and all({"goal", "value", "target", "met"} <= set(g) for g in doc["goals"])


def test_medians_over_seeds_then_landscapes(tiny_doc):
    for name in TUNERS:
        per_landscape = []
        for entry in tiny_doc["landscapes"]:
            runs = tiny_doc["runs"][entry["name"]][name]
            assert len(runs) == SEEDS
            for key in ("trials_to_98", "failed_frac", "gpu_hours"):
                assert entry["tuners"][name][key] == pytest.approx(np.median([r[key] for r in runs]))
            assert entry["tuners"][name]["frac_of_opt_at"]["5"] == pytest.approx(
                np.median([r["frac_of_opt_at"]["5"] for r in runs]))
            per_landscape.append(entry["tuners"][name]["trials_to_98"])
        assert tiny_doc["tuners"][name]["trials_to_98"] == pytest.approx(np.median(per_landscape))


def test_never_reached_counts_budget_plus_one():
    # Never above 90 % of the optimum; the expert's 0.8 is reached at trial 2.
    outcomes = [_outcome(1, None, None), _outcome(2, 0.81, 0.8), _outcome(3, 0.85, 0.9)]
    m = run_metrics(outcomes, optimum=1.0, expert_mfu=0.8, budget=6)
    assert m["trials_to_98"] == 7
    assert m["trials_to_expert"] == 2
    assert run_metrics(outcomes, optimum=1.0, expert_mfu=0.95, budget=6)["trials_to_expert"] == 7
    assert run_metrics(outcomes, optimum=1.0, expert_mfu=None, budget=6)["trials_to_expert"] is None
    assert m["failed_frac"] == pytest.approx(1 / 3) and m["gpu_hours"] == pytest.approx(3.0)
    # A tuner that stopped after three trials keeps its best for the later budgets.
    assert m["frac_of_opt_at"] == {"5": 0.9, "10": 0.9, "20": 0.9}


def test_best_so_far_picks_by_measurement_scores_by_truth():
    # Trial 2 measured higher (noise) but is truly worse: the deployed choice is trial 2.
    outcomes = [_outcome(1, 0.70, 0.72), _outcome(2, 0.73, 0.69)]
    assert best_so_far(outcomes, optimum=0.8, budget=3) == pytest.approx([0.9, 0.8625, 0.8625])


def test_hidden_constants_differ_from_the_tuners(tiny_defs):
    landscape = tiny_defs[0].build()
    tuner_constants = load_constants()
    assert landscape.hidden is not None and landscape.hidden != tuner_constants
    differing = [d.field for d in DEVIATIONS
                 if getattr(landscape.hidden, d.field) != getattr(tuner_constants, d.field)]
    assert len(differing) >= len(DEVIATIONS) - 1  # a draw may hit a bound, not most
    assert set(landscape.deviations) == {d.field for d in DEVIATIONS}
    assert landscape.make_launcher().constants == landscape.hidden
    assert landscape.noise["step_time"] > 0 and landscape.noise["memory"] > 0
    # Landscapes draw different deviations; the same landscape draws the same ones.
    again = tiny_sim().build()
    assert again.hidden == landscape.hidden
    other, _ = draw_hidden(tuner_constants, np.random.default_rng(1))
    assert other != landscape.hidden


def test_all_tuners_see_the_same_space(tiny_defs):
    for defn in tiny_defs:
        landscape = defn.build()
        signatures = [s.signature() for s in landscape.candidates]
        assert len(set(signatures)) == len(signatures)
        launcher = landscape.launcher(0)
        assert isinstance(launcher, BenchLauncher)
        spec = landscape.job_spec(BUDGET, 0)
        pool, _ = search_pool(spec, launcher)  # what the OptiCo loop searches
        assert [s.signature() for s in pool] == signatures
        if landscape.kind == "sim":  # exactly the space's valid configurations
            assert [s.signature() for s in spec.search_space.enumerate(spec.workload)] == signatures
        else:  # exactly what the table measured
            assert set(signatures) == {s.signature() for s in landscape.make_launcher().candidates(spec.workload)}
        allowed = set(signatures)
        for tuner in (RandomTuner(), OptunaTuner()):
            outcomes = tuner.run(landscape, BUDGET, 0)
            assert outcomes and all(o.signature in allowed for o in outcomes)
            assert len({o.signature for o in outcomes}) == len(outcomes)  # nothing launched twice


def test_the_loop_runs_on_the_landscape(tiny_doc):
    for entry in tiny_doc["landscapes"]:
        for run in tiny_doc["runs"][entry["name"]]["optico"]:
            assert 1 <= run["trials"] <= BUDGET
            assert all(t["true_mfu"] is not None for t in run["trials_log"] if t["ok"])


def test_markdown_and_plot(tiny_doc, tmp_path: Path):
    text = markdown(tiny_doc)
    assert "| **optico** |" in text and "| optuna |" in text and "Goals:" in text
    for entry in tiny_doc["landscapes"]:
        assert entry["name"] in text
    png = tmp_path / "convergence.png"
    plot(tiny_doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "runs" not in result_document(tiny_doc)


def test_replay_landscape_expert_and_optimum(tiny_defs):
    landscape = tiny_defs[1].build()
    assert landscape.optimum_mfu == pytest.approx(0.68)  # TP1/PP2/MBS1 in the OptiCo paper's table
    assert (landscape.expert.tp, landscape.expert.pp, landscape.expert.mbs) == (2, 1, 1)
    assert landscape.expert_mfu == pytest.approx(0.67)


def test_select_landscapes():
    sims = select_landscapes("sim")
    assert len(sims) >= 20
    assert {d.workload.model.is_moe for d in sims} == {True, False}
    assert {(d.workload.cluster.gpu, d.workload.world_size) for d in sims} >= {
        ("a100-80gb", 8), ("a100-80gb", 16), ("a100-80gb", 64), ("h100-sxm", 8), ("h100-sxm", 16), ("h100-sxm", 64)}
    assert [d.name for d in select_landscapes("replay")] == ["replay:optico_llama3_8b_a100:llama3-8b-a100-8-gbs512"]
    with pytest.raises(ValueError, match="--suite"):
        select_landscapes("nope")  # type: ignore[arg-type]


def test_cli_bench_replay(tmp_path: Path, cli_env):
    out = tmp_path / "r.json"
    proc = subprocess.run(optico_cmd("bench", "--suite", "replay", "--tuners", "random,grid,optuna", "--seeds", "1",
                                     "--budget", "4", "--jobs", "1", "--json", str(out)),
                          capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc["tuners"]) == {"random", "grid", "optuna", "expert"}
    bad = subprocess.run(optico_cmd("bench", "--tuners", "hillclimb", "--suite", "replay"), capture_output=True,
                         text=True, env=cli_env, timeout=300)
    assert bad.returncode == 2 and "unknown tuner" in bad.stderr


@pytest.mark.parametrize("budget", AT_BUDGETS)
def test_frac_at_budget_uses_the_first_k_trials(budget):
    outcomes = [_outcome(i, 0.5 + i / 100, 0.5 + i / 100) for i in range(1, 21)]
    m = run_metrics(outcomes, optimum=1.0, expert_mfu=None, budget=20)
    assert m["frac_of_opt_at"][str(budget)] == pytest.approx(0.5 + budget / 100)


def test_model_agreement_reported(tiny_defs, tiny_doc):
    import copy

    from optico.bench.landscapes import model_agreement

    agreement = model_agreement(tiny_defs[0].build())
    assert set(agreement) == {"mfu_median_ape", "mem_median_ape", "spearman", "spearman_top5", "fit_accuracy",
                              "model_pick"}
    assert 0.0 <= agreement["model_pick"] <= 1.0 and 0.0 <= agreement["fit_accuracy"] <= 1.0
    doc = copy.deepcopy(tiny_doc)
    doc["landscapes"][0]["landscape"]["model_agreement"] = agreement
    assert "model pick" in markdown(doc)

"""The tuner benchmark on a tiny suite: schema, groups, statistics, separation, baselines, landscapes."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from optico.bench import separation
from optico.bench.baselines import BASELINES, _encoding, model_ranking
from optico.bench.landscapes import DEVIATIONS, BenchLauncher, LandscapeSkipped, draw_hidden, out_of_form
from optico.bench.metrics import best_so_far, run_metrics
from optico.bench.report import markdown, plot, result_document, write_json
from optico.bench.suite import OUT_OF_FORM, run_landscape, select_landscapes
from optico.bench.tuners import TrialOutcome
from optico.perfmodel.constants import load_constants
from optico.runner import search_pool
from tests.bench.conftest import BUDGET, SEEDS, TUNERS, tiny_sim
from tests.conftest import optico_cmd


def _outcome(i: int, measured: float | None, true: float | None) -> TrialOutcome:
    return TrialOutcome(index=i, signature=f"s{i}", config=f"c{i}", ok=measured is not None, measured_mfu=measured,
                        true_mfu=true, failure=None if measured is not None else "oom", gpu_seconds=3600.0)


def test_json_schema_groups_and_pairs(tiny_doc, tmp_path: Path):
    path = tmp_path / "results.json"
    write_json(tiny_doc, path)
    doc = json.loads(path.read_text())
    assert set(doc["groups"]) == {"self", "real"}
    for group in doc["groups"].values():
        assert set(group["tuners"]) >= set(TUNERS)
        o = group["tuners"]["optico"]
        assert o["best_at"]["10"]["lo"] <= o["best_at"]["10"]["mean"] <= o["best_at"]["10"]["hi"] <= 1 + 1e-9
        assert len(o["ecdf_98"]) == BUDGET and o["runs"] == SEEDS
        assert 0 <= o["oom_launches"] <= o["failed_launches"] <= 1
        assert group["strongest"] in ("model-greedy", "random-fit", "tpe-warm")
        assert set(group["paired"]["optico"]) == {"model-greedy", "random-fit", "tpe-warm"}
    assert doc["meta"]["budget"] == BUDGET and doc["meta"]["seeds"] == SEEDS and "frozen" in doc["meta"]
    assert all({"group", "goal", "value", "met"} <= set(g) for g in doc["goals"])
    assert "runs" not in result_document(tiny_doc)


def test_runs_are_paired_and_within_budget(tiny_doc):
    for entry in tiny_doc["landscapes"]:
        runs = tiny_doc["runs"][entry["name"]]
        for name in TUNERS:
            assert [r["seed"] for r in runs[name]] == list(range(SEEDS))
            assert all(1 <= r["trials"] <= BUDGET for r in runs[name])
            assert all(t["true_mfu"] is not None for r in runs[name] for t in r["trials_log"] if t["ok"])


def test_run_metrics_thresholds_and_costs():
    outcomes = [_outcome(1, None, None), _outcome(2, 0.81, 0.8), _outcome(3, 0.85, 0.9)]
    m = run_metrics(outcomes, optimum=1.0, expert_mfu=0.8, budget=6)
    assert m["first_98"] is None and m["trials_to_98"] == 7 and m["trials_to_expert"] == 2
    assert m["failed"] == 1 and m["oom"] == 1 and m["gpu_hours"] == pytest.approx(3.0)
    hang = TrialOutcome(index=4, signature="s4", config="c4", ok=False, measured_mfu=None, true_mfu=None,
                        failure="hang", gpu_seconds=600.0)
    with_hang = run_metrics([*outcomes, hang], optimum=1.0, expert_mfu=0.8, budget=6)
    assert with_hang["failed"] == 2 and with_hang["oom"] == 1  # a hang is a failure the tuner did not choose
    assert m["frac_of_opt_at"] == {"5": 0.9, "10": 0.9, "20": 0.9}  # a stopped run keeps its best
    assert m["auc"] == pytest.approx((0 + 0.8 + 0.9 * 4) / 6)
    assert [c for c, _ in m["curve_gpu_hours"]] == [1.0, 2.0, 3.0]
    # Picked by measurement, scored by truth.
    assert best_so_far([_outcome(1, 0.70, 0.72), _outcome(2, 0.73, 0.69)], 0.8, 3) == pytest.approx(
        [0.9, 0.8625, 0.8625])


def test_hidden_constants_and_out_of_form_effects():
    landscape = tiny_sim().build()
    tuner_constants = load_constants()
    differing = [d.field for d in DEVIATIONS if getattr(landscape.hidden, d.field) != getattr(tuner_constants, d.field)]
    assert len(differing) >= len(DEVIATIONS) - 1
    assert tiny_sim().build().hidden == landscape.hidden  # the same landscape draws the same
    assert draw_hidden(tuner_constants, np.random.default_rng(1))[0] != landscape.hidden
    # Out-of-form: pairwise interactions of the stated size, a two-sided residual per configuration.
    interactions, residual = out_of_form(landscape.space, 0.1, np.random.default_rng(0))
    assert residual == pytest.approx(0.1 * np.sqrt(0.5)) and interactions
    oof = tiny_sim(0.1).build()
    launcher = oof.make_launcher()
    ratios = [launcher.factor(s) / landscape.make_launcher().factor(s) for s in oof.candidates]
    assert min(ratios) < 0.97 and max(ratios) > 1.03  # slower and faster than the plain family
    assert oof.summary()["group"] == "out-of-form"


def test_every_tuner_sees_the_same_space_and_never_repeats(tiny_defs):
    for defn in tiny_defs:
        landscape = defn.build()
        signatures = [s.signature() for s in landscape.candidates]
        launcher = landscape.launcher(0)
        assert isinstance(launcher, BenchLauncher)
        pool, _ = search_pool(landscape.job_spec(BUDGET, 0), launcher)
        assert [s.signature() for s in pool] == signatures
        for name in ("model-rank", "model-greedy", "random-fit", "tpe", "tpe-warm"):
            outcomes = BASELINES[name]().run(landscape, BUDGET, 0)
            assert outcomes and len(outcomes) <= BUDGET, name
            assert all(o.signature in set(signatures) for o in outcomes), name
            assert len({o.signature for o in outcomes}) == len(outcomes), name


def test_model_rank_and_ordered_encoding(tiny_defs):
    landscape = tiny_defs[0].build()
    model = landscape.job_model()
    ranked = model_ranking(landscape, model)
    assert [model.expected_mfu(s) for s in ranked] == sorted((model.expected_mfu(s) for s in ranked), reverse=True)
    dists, codes, ordered = _encoding(landscape)
    assert set(dists) == {"tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
                          "recompute_granularity"}
    assert ordered.all()  # sizes and recompute levels are ordered indices, not categories
    assert codes.shape == (len(landscape.candidates), 4)


def test_model_agreement_says_how_far_98_percent_sits_in_the_models_order():
    from optico.bench.landscapes import model_agreement

    landscape = tiny_sim(effect_size=0.10).build()
    a = model_agreement(landscape)
    target = 0.98 * landscape.optimum_mfu
    near = [s for s in landscape.candidates if (landscape.true_mfu(s) or 0.0) >= target]
    assert a["near_optimal"] == len(near) >= 1  # the optimum itself at least
    model = landscape.job_model()
    expected = sorted((s for s in landscape.candidates if model.mem_gib(s) <= model.limit_gib),
                      key=model.mfu, reverse=True)
    first = expected[a["model_rank_98"] - 1]
    assert landscape.true_mfu(first) >= target
    assert all((landscape.true_mfu(s) or 0.0) < target for s in expected[: a["model_rank_98"] - 1])


def test_separation_refuses_calibration_rows(tiny_defs):
    replay = tiny_defs[1]
    assert replay.calibration and "without-optico_llama3_8b_a100" in replay.calibration
    built = replay.build()
    assert built.calibration == replay.calibration
    # The published results name the packaged file, not where this machine keeps it.
    assert built.summary()["calibration"] == "optico/bench/calibrations/without-optico_llama3_8b_a100.json"
    with pytest.raises(LandscapeSkipped, match="calibration"):
        replay.model_copy(update={"calibration": None}).build()  # the shipped constants saw these rows
    held = json.loads(Path(replay.calibration).read_text())["_meta"]
    assert held["held_out"] == "optico_llama3_8b_a100.csv" and "optico_llama3_8b_a100.csv" not in held["fitted_on"]


def test_a_calibration_recorded_under_old_keys_still_refuses_its_rows(tmp_path):
    # The rows a held-out calibration recorded at fitting carry the workload keys of that day; a reading
    # rule changed since (a GB200 rack read as 64 GPUs) gives the same measured rows other keys, and
    # those must still count as seen.
    fitted = separation.PUBLISHED_DATA / "megatron_bridge_perf_summary.csv"
    rows = separation.file_rows(fitted)
    stale = {"_meta": {"fitted_on": [fitted.name], "fitted_rows": [f"old-key/{r.split('/')[-1]}" for r in rows]}}
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps(stale))
    with pytest.raises(separation.LandscapeOverlap, match="calibration data"):
        separation.check_disjoint("landscape", {sorted(rows)[0]}, str(calibration))
    # A fitted_on entry is a file name in the repository's data, never a path out of it.
    stale["_meta"]["fitted_on"] = [f"../../{fitted.name}"]
    calibration.write_text(json.dumps(stale))
    assert separation.fitted_rows.__wrapped__(str(calibration)) >= rows


def test_test_seeds_are_fresh_and_constants_frozen():
    seeds = {separation.test_landscape_seed(i) for i in range(5)}
    assert not seeds & set(separation.DEV_LANDSCAPE_SEEDS)
    # A tuner constant changed after the test seeds were drawn must come with a new TEST_SALT
    # (docs/benchmarks.md, "Calibration and test separation").
    assert separation.check_frozen(), "tuner constants changed: draw a new TEST_SALT and record FROZEN_DIGEST"


def test_llm_analysis_launcher_fails_like_the_simulator():
    from optico.bench import thirdparty

    if thirdparty.available():
        pytest.skip(thirdparty.available())
    defn = thirdparty.thirdparty_defs(separation.DEV_LANDSCAPE_SEEDS[1])[1]
    landscape = defn.build()
    assert landscape.group == "independent" and landscape.optimum_mfu > 0.2
    launcher = landscape.make_launcher()
    oom = next(s for s in landscape.candidates if landscape.truth[s.signature()].failure == "oom")
    r = asyncio.run(launcher.launch(landscape.workload, oom, trial_key="t1"))
    assert not r.ok and "torch.OutOfMemoryError: CUDA out of memory" in r.log
    good = asyncio.run(launcher.launch(landscape.workload, landscape.optimum, trial_key="t2"))
    assert good.ok and good.metrics.mfu == pytest.approx(landscape.optimum_mfu, rel=0.1)


def test_markdown_and_plot(tiny_doc, tmp_path: Path):
    text = markdown(tiny_doc)
    assert "### Real" in text and "### Sanity check only" in text and "| **optico** |" in text
    assert "OptiCo −" in text and "Goals (issue 13)" in text
    png = tmp_path / "convergence.png"
    plot(tiny_doc, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_select_landscapes():
    groups = {}
    for d in select_landscapes("all", dev=True):
        groups.setdefault(getattr(d, "group", "independent"), []).append(d.name)
    assert set(groups) >= {"independent", "out-of-form", "real", "self"}
    assert all(n.endswith("+oof") for n in groups["out-of-form"])
    # every named out-of-form landscape exists (a misspelt name would drop out of the report silently)
    assert sorted(n.removesuffix("+oof") for n in groups["out-of-form"]) == sorted(OUT_OF_FORM)
    assert len({d.preset for d in select_landscapes("out-of-form", dev=True)}) == 6  # every preset but the 70B
    sweep = select_landscapes("out-of-form", dev=True, sweep=[0.0, 0.2])
    assert {d.group for d in sweep} == {"out-of-form", "sweep 0.00", "sweep 0.20"}
    wide = select_landscapes("out-of-form", dev=True, all_clusters=True)
    assert len(wide) > len(groups["out-of-form"]) and {d.group for d in wide} == {"out-of-form"}
    assert {n for n in groups["out-of-form"]} < {d.name for d in wide}  # the reported ones among them
    assert select_landscapes("sim", dev=True)[0].landscape_seed == separation.DEV_LANDSCAPE_SEEDS[1]
    assert select_landscapes("sim")[0].landscape_seed == separation.test_landscape_seed(0)
    # The independent group's development landscapes are other models and clusters, not the reported
    # ones at another seed (a seed only redraws efficiencies and noise).
    reported, development = select_landscapes("independent"), select_landscapes("independent", dev=True)
    assert len(development) >= len(reported) == 5
    assert not {d.workload.key() for d in reported} & {d.workload.key() for d in development}
    assert not {d.name for d in reported} & {d.name for d in development}
    with pytest.raises(ValueError, match="--suite"):
        select_landscapes("nope")  # type: ignore[arg-type]


def test_cli_bench_replay(tmp_path: Path, cli_env):
    out = tmp_path / "r.json"
    proc = subprocess.run(optico_cmd("bench", "--suite", "replay", "--tuners", "random,model-rank", "--seeds", "2",
                                     "--budget", "4", "--jobs", "1", "--no-fidelity", "--json", str(out)),
                          capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert set(doc["groups"]["real"]["tuners"]) == {"random", "model-rank", "expert"}
    bad = subprocess.run(optico_cmd("bench", "--tuners", "hillclimb", "--suite", "replay"), capture_output=True,
                         text=True, env=cli_env, timeout=300)
    assert bad.returncode == 2 and "unknown tuner" in bad.stderr


def test_paired_runs_compares_two_trials_files_run_by_run(tmp_path: Path, cli_env):
    """benchmarks/paired_runs.py on two real `--trials` files: a tuner against itself differs by nothing,
    and against another by the mean of its per-landscape differences."""
    trials = tmp_path / "t.json"
    proc = subprocess.run(optico_cmd("bench", "--suite", "replay", "--tuners", "random,model-rank", "--seeds", "2",
                                     "--budget", "4", "--jobs", "1", "--no-fidelity", "--trials", str(trials)),
                          capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "paired_runs.py"

    def compare(a: str, b: str) -> str:
        done = subprocess.run([sys.executable, str(script), str(trials), a, str(trials), b], capture_output=True,
                              text=True, env=cli_env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "difference +0.00 [+0.00, +0.00]   ahead on 0, behind on 0" in compare("random", "random")
    doc = json.loads(trials.read_text())
    def mean_at_10(runs: list[dict]) -> float:
        return sum(r["frac_of_opt_at"]["10"] for r in runs) / len(runs)

    per = [mean_at_10(t["random"]) - mean_at_10(t["model-rank"]) for t in doc.values()]
    line = next(x for x in compare("random", "model-rank").splitlines() if "best @10" in x)
    assert f"difference {100 * sum(per) / len(per):+.2f}" in line, line


def test_a_landscape_run_hands_its_objects_back_to_the_collector(tiny_defs):
    """The tuners run with the landscape frozen out of the garbage collector's way; afterwards nothing
    stays frozen, or a worker running landscape after landscape would keep every one of them."""
    assert gc.get_freeze_count() == 0
    result = run_landscape(tiny_defs[0], ["model-greedy"], budget=3, seeds=1, fidelity=False)
    assert len(result["runs"]["model-greedy"][0]["trials_log"]) == 3
    assert gc.get_freeze_count() == 0


def test_the_per_layer_recompute_family_tunes_recompute_layer_by_layer_at_the_default_size():
    """benchmarks/dev_recompute_layers.py: development landscapes only, full recompute's method and layer
    count tuned (the case the guard's small-saving rule is about), each space no larger than the default
    out-of-form family's for the same preset and cluster."""
    import importlib.util

    from optico.bench.landscapes import sim_defs
    from optico.bench.suite import EFFECT_SIZE, landscape_seed

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "dev_recompute_layers.py"
    spec = importlib.util.spec_from_file_location("dev_recompute_layers", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    family = module.per_layer_family()
    default = {d.name: d for d in sim_defs(landscape_seed(dev=True), all_clusters=True, effect_size=EFFECT_SIZE,
                                           group="out-of-form", suffix="+oof-layers")}
    assert family and all(d.landscape_seed == landscape_seed(dev=True) for d in family)
    assert not any(d.preset == "llama3-70b" for d in family)
    smallest = min(family, key=lambda d: d.size_hint())
    candidates = list(smallest.build().candidates)
    blocks = {s.recompute_num_layers for s in candidates if s.recompute_method == "block"}
    assert blocks == {1, 2, 4, 8}
    assert len(candidates) <= len(list(default[smallest.name].build().candidates))


def test_every_file_named_with_landscape_is_run_whatever_it_is_called(tmp_path: Path):
    """Landscape names come from a file's stem: day2/results.csv was dropped unsaid beside day1/results.csv,
    and an edited copy of a shipped table ran the shipped one instead."""
    from optico.bench.landscapes import PACKAGED_REPLAY

    text = PACKAGED_REPLAY.read_text()
    lines = text.splitlines()
    for day in ("day1", "day2"):
        (tmp_path / day).mkdir()
        (tmp_path / day / "results.csv").write_text(text if day == "day1" else "\n".join(lines[:-3]) + "\n")
    (tmp_path / "mine").mkdir()
    edited = tmp_path / "mine" / PACKAGED_REPLAY.name
    edited.write_text("\n".join(lines[:-2]) + "\n")
    defs = select_landscapes("real", files=[tmp_path / "day1" / "results.csv", tmp_path / "day2" / "results.csv",
                                            edited])
    paths = {Path(d.path) for d in defs}
    assert {tmp_path / "day1" / "results.csv", tmp_path / "day2" / "results.csv", edited} <= paths
    assert PACKAGED_REPLAY not in paths  # the copy the user named replaces the shipped table of that name
    assert len({d.name for d in defs}) == len(defs)


def test_a_bench_whose_every_landscape_is_refused_exits_2_and_writes_nothing(tmp_path: Path):
    """A named table the calibration saw (a copy of the shipped one) was refused when built, and the bench
    then exited 0 with an empty table and a JSON without groups."""
    from optico.bench.landscapes import PACKAGED_REPLAY

    copy = tmp_path / "my_table.csv"
    copy.write_text(PACKAGED_REPLAY.read_text())
    out = tmp_path / "out.json"
    done = subprocess.run(optico_cmd("bench", "--landscape", str(copy), "--only", "replay:my_table", "--quick",
                                     "--tuners", "optico", "--json", str(out)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "every landscape selected was refused" in done.stderr and "calibration" in done.stdout
    assert not out.exists()


def test_a_named_files_workloads_that_are_no_landscape_are_said(tmp_path: Path, capsys):
    """docs: `--landscape` replays every workload of the file; one with too few configurations was left out
    unsaid (in no warning and no skipped list)."""
    from optico.bench.landscapes import PACKAGED_REPLAY

    lines = PACKAGED_REPLAY.read_text().splitlines()
    header = lines[0].split(",")
    small = [line.replace(",512,", ",1024,", 1) for line in lines[1:3]]  # the same table at another GBS, 2 rows
    assert all(",1024," in line for line in small) and "gbs" in header
    table = tmp_path / "mine.csv"
    table.write_text("\n".join([*lines, *small]) + "\n")
    defs = select_landscapes("real", files=[table], only=["replay:mine"], strict=True)
    assert len(defs) == 1
    assert "a workload left out" in capsys.readouterr().err

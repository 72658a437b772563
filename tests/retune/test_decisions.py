"""The parts of retuning that need no database: cron slots, the verdict, the noise band, the simulator's
framework versions, re-measurement, and old-framework failures as hints in the guard."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest
from retune_testkit import sim_spec

from optico.fingerprint import changes, framework_of, split_by_framework
from optico.guard import Guard
from optico.launchers.sim import SimLauncher
from optico.perfmodel.constants import load_constants
from optico.perfmodel.online import JobModel
from optico.pool.records import Incumbent
from optico.retune.cron import check_cron, next_fire
from optico.retune.decide import decide
from optico.retune.probe import probe_framework
from optico.retune.remeasure import MIN_NOISE_PCT, NOISE_SIGMAS, Remeasurement, remeasure
from optico.spec import parse_spec
from optico.strategy import Strategy
from optico.trial import Failure, FailureCategory, Metrics, Trial, TrialStatus

UTC = timezone.utc


@pytest.mark.parametrize("expr, reason", [
    ("61 * * * *", "not a valid cron expression"), ("* * *", "has 3 fields"), ("0 2 * * * 5", "has 6 fields"),
    ("0 2 30 2 *", "never fires"), ("", "empty"), ("@sometimes", "not a valid cron expression"),
])
def test_bad_cron_expressions_get_one_line_reasons(expr: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        check_cron(expr)
    assert "\n" not in str(info.value) and str(info.value).startswith("cron: ")


def test_cron_slots_are_utc_and_strictly_after() -> None:
    assert check_cron("  0  2 * * * ") == "0 2 * * *"
    at = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
    assert next_fire("0 2 * * *", at) == datetime(2026, 3, 2, 2, 0, tzinfo=UTC)
    assert next_fire("@hourly", at) == datetime(2026, 3, 1, 3, 0, tzinfo=UTC)


def _incumbent(mfu: float = 0.5, fp: dict | None = None) -> Incumbent:
    return Incumbent(strategy=Strategy(), mfu=mfu, fingerprint=fp if fp is not None else {"torch": "2.12"},
                     measured_at=datetime(2026, 1, 1, tzinfo=UTC))


def _runs(*mfus: float) -> Remeasurement:
    return Remeasurement(mfus=list(mfus), warmup_mfus=[0.1])


def test_the_verdicts() -> None:
    new = {"torch": "2.13"}
    first = decide(None, new)
    assert (first.outcome, first.retune, first.fingerprint_changed) == ("first-tune", True, True)
    same = decide(_incumbent(), {"torch": "2.12"})
    assert (same.outcome, same.retune, same.fingerprint_changed, same.mfu_after) == ("no-change", False, False, None)
    with pytest.raises(ValueError, match="re-measured"):
        decide(_incumbent(), new)
    quiet = decide(_incumbent(0.5), new, _runs(0.496, 0.5, 0.498))
    assert (quiet.outcome, quiet.retune) == ("within-noise", False)
    assert decide(_incumbent(0.5), new, _runs(0.496, 0.5, 0.498), always_retune=True).retune
    slower = decide(_incumbent(0.5), new, _runs(0.44, 0.45, 0.445))
    assert (slower.outcome, slower.retune) == ("regression", True)
    assert slower.regression_pct == pytest.approx(11.0)
    faster = decide(_incumbent(0.5), new, _runs(0.55, 0.56, 0.555))
    assert (faster.outcome, faster.retune) == ("improvement", True) and faster.regression_pct == pytest.approx(-11.0)
    broken = decide(_incumbent(0.5), new, Remeasurement(mfus=[], failures=["CUDA out of memory"]))
    assert (broken.outcome, broken.regression_pct, broken.retune) == ("regression", 100.0, True)


def test_the_noise_band_comes_from_the_spread_with_a_floor() -> None:
    assert _runs(0.5, 0.5, 0.5).noise_pct == MIN_NOISE_PCT
    wide = _runs(0.45, 0.5, 0.55)
    assert wide.noise_pct == pytest.approx(NOISE_SIGMAS * 0.05 / 0.5 * 100)
    # A change of 6 % is a regression under a tight spread and noise under a wide one.
    assert decide(_incumbent(0.5), {}, _runs(0.469, 0.47, 0.471)).outcome == "regression"
    assert decide(_incumbent(0.5), {}, _runs(0.42, 0.47, 0.52)).outcome == "within-noise"


def test_a_framework_version_is_another_cluster_deterministically(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = parse_spec(sim_spec(version="24.10"))
    w, s = spec.workload, Strategy(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)

    def mfu(sim: SimLauncher) -> float:
        return asyncio.run(sim.launch(w, s, trial_key="k")).metrics.mfu

    old, again = SimLauncher(framework_version="24.10"), SimLauncher(framework_version="24.10")
    assert mfu(old) == mfu(again)
    assert mfu(SimLauncher(framework_version="25.01")) != mfu(old)
    assert SimLauncher().constants == load_constants()  # no version: the base cluster, as before
    assert probe_framework(spec) == {"framework_version": "24.10"}
    monkeypatch.setenv("OPTICO_SIM_FRAMEWORK_VERSION", "25.01")
    assert mfu(old) == mfu(SimLauncher(framework_version="25.01"))  # the environment upgrades a running launcher
    assert probe_framework(spec) == {"framework_version": "25.01"}
    result = asyncio.run(old.launch(w, s, trial_key="k"))
    assert framework_of(result.fingerprint) == {"framework_version": "25.01"}


def test_remeasure_drops_the_warmup_reruns_hangs_and_stops_on_a_real_failure() -> None:
    w = parse_spec(sim_spec()).workload
    good = Strategy(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    runs = asyncio.run(remeasure(SimLauncher(hang_rate=0.0, framework_version="1"), w, good, key="t"))
    assert (len(runs.mfus), len(runs.warmup_mfus), runs.launches, runs.broken) == (3, 1, 4, False)
    hangs = asyncio.run(remeasure(SimLauncher(hang_rate=1.0), w, good, key="t"))
    assert hangs.broken and hangs.launches == 8 and len(hangs.failures) == 8
    too_big = Strategy(micro_batch_size=8)  # TP1 PP1: out of memory on 80 GB
    ooms = asyncio.run(remeasure(SimLauncher(hang_rate=0.0), w, too_big, key="t"))
    assert ooms.broken and ooms.launches == 1 and "out of memory" in ooms.failures[0]


def _failed(index: int, strategy: Strategy, version: str | None, category=FailureCategory.OOM) -> Trial:
    return Trial(id=index, job_id=1, index=index, strategy=strategy, signature=strategy.signature(),
                 status=TrialStatus.FAILED, fingerprint={"framework_version": version} if version else {},
                 failure=Failure(category=category, summary="CUDA out of memory", confidence=90))


def _ok(index: int, strategy: Strategy, version: str) -> Trial:
    return Trial(id=100 + index, job_id=2, index=index, strategy=strategy, signature=strategy.signature(),
                 status=TrialStatus.OK, fingerprint={"launcher": "sim", "framework_version": version},
                 metrics=Metrics(step_time_s=1, tflops_per_gpu=100, mfu=0.4, tokens_per_s_per_gpu=1000))


def test_failures_under_another_framework_are_hints_not_refusals() -> None:
    spec = parse_spec(sim_spec())
    guard = Guard(spec.workload, spec.search_space, JobModel(spec.workload, load_constants()))
    candidate = Strategy(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, micro_batch_size=2)
    seed = Strategy(tensor_model_parallel_size=4)
    old_oom = _failed(3, candidate, "24.10")

    same = guard.check(candidate, [_ok(1, seed, "24.10")], [old_oom])
    assert (same.admitted, same.rule) == (False, "known-failure")
    after_upgrade = guard.check(candidate, [_ok(1, seed, "25.01")], [old_oom])
    assert (after_upgrade.admitted, after_upgrade.rule) == (True, "hint")
    assert "framework_version 24.10" in after_upgrade.reason
    # An implied OOM (same layout, no memory saved) from the old framework no longer refuses either.
    bigger = Strategy(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, micro_batch_size=4)
    assert not guard.check(bigger, [_ok(1, seed, "24.10")], [old_oom]).admitted
    assert guard.check(bigger, [_ok(1, seed, "25.01")], [old_oom]).rule != "implied-oom"
    # Unknown frameworks (a job that has measured nothing yet, an old trial without versions) refuse as before.
    assert not guard.check(candidate, [], [old_oom]).admitted
    assert not guard.check(candidate, [_ok(1, seed, "25.01")], [_failed(3, candidate, None)]).admitted
    # This job's own failures always count.
    assert not guard.check(candidate, [_ok(1, seed, "25.01"), _failed(2, candidate, "25.01")], []).admitted


def test_split_by_framework_and_changes() -> None:
    s = Strategy()
    history = [_ok(1, s, "2"), _failed(2, s, None)]
    same, other = split_by_framework(history, [_failed(3, s, "2"), _failed(4, s, "1"), _failed(5, s, None)])
    assert [t.index for t in same] == [3, 5] and [t.index for t in other] == [4]
    assert changes({"torch": "2.12", "cuda": "12.4"}, {"torch": "2.13", "cuda": "12.4", "nccl": "2.21"}) == {
        "torch": ["2.12", "2.13"], "nccl": [None, "2.21"]}

"""`optico tune examples/tiny-gpt-cpu.yaml` end to end with real megatron-core runs on CPU,
through the local launcher and through a local Ray cluster: at least five real trials, one
of them a real failure (CP=2 without Transformer Engine) diagnosed from its log, every trial
recorded in the pool with its run directory, nothing left running afterwards."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, optico_cmd
from tests.launchers.conftest import HAVE_MEGATRON, HAVE_RAY, assert_no_leftovers

pytestmark = [pytest.mark.slow, pytest.mark.megatron,
              pytest.mark.skipif(not HAVE_MEGATRON, reason="torch and megatron-core are needed")]


def tune(launcher: str, tmp_path: Path, env: dict[str, str], db_url: str) -> dict:
    out = tmp_path / "result.json"
    proc = subprocess.run(optico_cmd("tune", str(EXAMPLES / "tiny-gpt-cpu.yaml"), "--launcher", launcher,
                                     "--json", str(out)),
                          env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    trials = result["trials"]
    assert len(trials) >= 5, proc.stdout
    ok = [t for t in trials if t["status"] == "ok"]
    failed = [t for t in trials if t["status"] == "failed"]
    assert len(ok) >= 4 and all(t["metrics"]["mfu"] > 0 and t["metrics"]["step_time_s"] > 0 for t in ok)
    # the real failure: megatron-core cannot run context parallelism without Transformer Engine
    assert failed, proc.stdout
    for t in failed:
        assert t["strategy"]["context_parallel_size"] == 2, t
        assert t["failure"]["category"] == "invalid_config" and t["failure"]["params"] == ["context_parallel_size"]
        assert "Transformer Engine" in t["failure"]["summary"] or "context parallelism" in t["failure"]["summary"]
    assert result["best"]["mfu"] == max(t["metrics"]["mfu"] for t in ok)

    from optico.pool.store import SqlStore

    with SqlStore(db_url) as store:
        recorded = store.trials(result["job_id"])
    assert len(recorded) == len(trials)
    for t in recorded:  # every trial kept its run directory and logs
        assert t.log_path and Path(t.log_path).is_file(), t
        assert t.fingerprint["launcher"] == launcher
    assert_no_leftovers(tmp_path)
    return result


def test_tune_tiny_gpt_cpu_with_the_local_launcher(tmp_path: Path, cli_env: dict[str, str], db_url: str):
    result = tune("local", tmp_path, cli_env, db_url)
    # `optico jobs export`: the measured trials as replay rows that read back as what ran
    out = tmp_path / "trials.csv"
    proc = subprocess.run(optico_cmd("jobs", "export", str(result["job_id"]), "--out", str(out)),
                          env=cli_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from optico.replay_csv import read_replay_csv
    from optico.strategy import Strategy

    rows = read_replay_csv(out)
    assert len(rows) == len(result["trials"])  # none lost: every trial ran or failed on its configuration
    for row, trial in zip(rows, result["trials"]):
        assert row.strategy.signature() == Strategy.model_validate(trial["strategy"]).signature()
        assert row.result == ("ok" if trial["status"] == "ok" else "error")  # the CP=2 failure is no OOM
        assert '"launcher": "local"' in row.notes  # the fingerprint
        if row.result == "ok":  # the driver's result line adds the framework's versions
            assert '"megatron_core"' in row.notes and '"torch"' in row.notes
            assert row.mfu == pytest.approx(trial["metrics"]["mfu"], abs=1e-4)


@pytest.mark.ray
@pytest.mark.skipif(not HAVE_RAY, reason="ray is needed")
def test_tune_tiny_gpt_cpu_with_the_ray_launcher(tmp_path: Path, cli_env: dict[str, str], db_url: str):
    ray_tmp = tempfile.mkdtemp(prefix="optico-ray-", dir="/tmp")  # Ray's socket paths must stay short
    env = {**cli_env, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp, "HOME": ray_tmp,
           "RAY_SCHEDULER_EVENTS": "0"}
    try:
        result = tune("ray", tmp_path, env, db_url)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert all(t["status"] == "failed" or t["metrics"] for t in result["trials"])

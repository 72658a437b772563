"""The replay launcher against the packaged OptiCo table (always present) and hand-made files."""

from __future__ import annotations

import asyncio
import csv
from pathlib import Path

import pytest

from optico.gpus import GPUS
from optico.launchers.base import Launcher
from optico.launchers.replay import TIMED_STEPS, ReplayLauncher
from optico.perfmodel.flops import flops_per_iteration
from optico.replay_format import COLUMNS
from optico.strategy import Strategy
from optico.trial import FailureCategory, LaunchResult
from optico.workload import PRESETS, Cluster, Workload

TABLE = Path(__file__).resolve().parents[1] / "optico" / "data" / "optico_llama3_8b_a100.csv"


@pytest.fixture(scope="module")
def launcher() -> ReplayLauncher:
    return ReplayLauncher(str(TABLE))


def workload(gbs: int = 512, gpu: str = "a100-80gb") -> Workload:
    """The OptiCo paper's job: Llama3-8B, seq 8192, fp16, one node of 8 A100-80GB."""
    return Workload(model=PRESETS["llama3-8b"], seq_length=8192, global_batch_size=gbs, precision="fp16",
                    cluster=Cluster(gpu=gpu, gpus_per_node=8, nodes=1))


def strategy(tp: int = 1, pp: int = 1, mbs: int = 1, **extra) -> Strategy:
    return Strategy(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, micro_batch_size=mbs,
                    use_distributed_optimizer=True, **extra)


def launch(launcher: ReplayLauncher, w: Workload, s: Strategy, progress=None) -> LaunchResult:
    return asyncio.run(launcher.launch(w, s, trial_key="job1-trial1", progress=progress))


def test_is_a_launcher(launcher: ReplayLauncher) -> None:
    assert isinstance(launcher, Launcher) and launcher.kind == "replay"
    assert launcher.describe()["kind"] == "replay" and launcher.describe()["path"] == str(TABLE)


def test_measured_config_returns_the_table(launcher: ReplayLauncher) -> None:
    lines: list[str] = []
    result = launch(launcher, workload(), strategy(pp=2), progress=lines.append)
    assert result.ok and result.exit_code == 0 and result.category_hint is None
    m = result.metrics
    assert m.mfu == pytest.approx(0.68)
    assert m.tflops_per_gpu == pytest.approx(0.68 * 312)
    w = workload()
    assert m.step_time_s == pytest.approx(flops_per_iteration(w, 1) / (m.tflops_per_gpu * 1e12 * 8))
    assert m.tokens_per_s_per_gpu == pytest.approx(512 * 8192 / (m.step_time_s * 8))
    assert (m.mem_max_gib, m.mem_limit_gib) == (75.48, GPUS["a100-80gb"].memory_gib)
    assert result.gpu_seconds == pytest.approx(m.step_time_s * 8 * TIMED_STEPS)
    assert result.fingerprint["replay_of"] == "optico_llama3_8b_a100.csv:3"
    assert "OptiCo paper" in result.fingerprint["source"]
    assert lines and "optico_llama3_8b_a100.csv:3" in lines[0]


def test_every_row_of_the_paper_replays(launcher: ReplayLauncher) -> None:
    expected = {(1, 2, 1): 0.68, (1, 4, 1): 0.60, (2, 1, 1): 0.67, (2, 2, 1): 0.63, (2, 4, 1): 0.57,
                (4, 1, 1): 0.60, (4, 2, 1): 0.59, (8, 1, 1): 0.49, (8, 1, 2): 0.53}
    for (tp, pp, mbs), mfu in expected.items():
        result = launch(launcher, workload(), strategy(tp, pp, mbs))
        assert result.ok and result.metrics.mfu == pytest.approx(mfu), (tp, pp, mbs)
    assert launch(launcher, workload(256), strategy(tp=2)).metrics.mfu == pytest.approx(0.64)
    assert launch(launcher, workload(1024), strategy(tp=2)).metrics.mfu == pytest.approx(0.67)


@pytest.mark.parametrize("tp, pp, mbs, line", [(1, 1, 1, 2), (1, 8, 1, 5), (2, 1, 2, 14)])
def test_oom_rows(launcher: ReplayLauncher, tp: int, pp: int, mbs: int, line: int) -> None:
    result = launch(launcher, workload(), strategy(tp, pp, mbs))
    assert not result.ok and result.metrics is None
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in result.log
    assert " GiB" in result.log and f"optico_llama3_8b_a100.csv:{line}" in result.log
    assert "replayed" in result.log and result.category_hint is FailureCategory.OOM
    assert result.gpu_seconds > 0


@pytest.mark.parametrize("s", [
    strategy(tp=2, pp=2, mbs=2),                 # never measured
    strategy(pp=2, overlap_grad_reduce=True),    # measured layout, different knob
    Strategy(pipeline_model_parallel_size=2),    # without the distributed optimizer
])
def test_unmeasured_configuration(launcher: ReplayLauncher, s: Strategy) -> None:
    result = launch(launcher, workload(), s)
    assert not result.ok and result.category_hint is FailureCategory.NOT_MEASURED
    assert "not measured" in result.log and result.gpu_seconds == 0


def test_unmeasured_workload(launcher: ReplayLauncher) -> None:
    other = workload(gpu="h100-sxm")
    assert launcher.candidates(other) == []
    assert launch(launcher, other, strategy(pp=2)).category_hint is FailureCategory.NOT_MEASURED


def test_candidates(launcher: ReplayLauncher) -> None:
    found = launcher.candidates(workload())
    assert len(found) == 12  # the table's 12 GBS-512 rows, 3 of them OOM
    assert len({s.signature() for s in found}) == 12
    outcomes = [launch(launcher, workload(), s) for s in found]
    assert sum(r.ok for r in outcomes) == 9
    assert sum(r.category_hint is FailureCategory.OOM for r in outcomes) == 3
    assert [s.short() for s in launcher.candidates(workload(256))] == ["TP2 PP1 MBS1 AC=none DO"]


ROW = dict(model="Llama3-8B", num_layers="32", hidden_size="4096", num_attention_heads="32",
           num_query_groups="8", ffn_hidden_size="14336", vocab_size="128256", seq_length="8192",
           gpu="A100-80GB", num_gpus="8", tp="2", pp="1", mbs="1", gbs="512", precision="fp16",
           source="hand-made")


def write(path: Path, *rows: dict[str, str]) -> str:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        for row in rows:
            writer.writerow({c: {**ROW, **row}.get(c, "") for c in COLUMNS})
    return str(path)


def test_repeated_rows_replay_the_median_run(tmp_path: Path) -> None:
    path = write(tmp_path / "dup.csv", dict(result="oom"), dict(result="ok", mfu="0.6"),
                 dict(result="ok", mfu="0.4"), dict(result="ok", mfu="0.5"))
    result = launch(ReplayLauncher(path), workload(), strategy(tp=2))
    assert result.ok and result.metrics.mfu == 0.5  # neither the first (0.6) nor the best
    assert "4 rows" in result.log and "replayed line 5" in result.log and "1 of them failed" in result.log
    assert "0.400-0.600" in result.log
    assert result.fingerprint["rows_measuring"] == [2, 3, 4, 5] and result.fingerprint["line"] == 5
    assert len(ReplayLauncher(path).candidates(workload())) == 1


def test_repeated_rows_even_count_replay_a_measured_run(tmp_path: Path) -> None:
    path = write(tmp_path / "two.csv", dict(result="ok", mfu="0.6"), dict(result="ok", mfu="0.4"))
    result = launch(ReplayLauncher(path), workload(), strategy(tp=2))
    assert result.metrics.mfu == 0.4  # the lower median: a run that happened, not an average


def test_a_configuration_that_ran_once_ran(tmp_path: Path) -> None:
    path = write(tmp_path / "flaky.csv", dict(result="oom"), dict(result="ok", mfu="0.5"), dict(result="oom"))
    result = launch(ReplayLauncher(path), workload(), strategy(tp=2))
    assert result.ok and result.metrics.mfu == 0.5 and "its one successful run" in result.log
    failed = launch(ReplayLauncher(write(tmp_path / "oom.csv", dict(result="oom"), dict(result="oom"))),
                    workload(), strategy(tp=2))
    assert not failed.ok and failed.category_hint is FailureCategory.OOM and "replayed line 2" in failed.log


def test_error_rows_and_skipped_rows(tmp_path: Path) -> None:
    path = write(tmp_path / "err.csv", dict(result="error", notes="NCCL timeout after 1800 s"),
                 dict(result="ok", tp="3", mfu="0.5"))  # TP 3 is rejected by the rules: never replayed
    replay = ReplayLauncher(path)
    result = launch(replay, workload(), strategy(tp=2))
    assert not result.ok and "NCCL timeout after 1800 s" in result.log and "err.csv:2" in result.log
    assert result.category_hint is None
    assert len(replay.candidates(workload())) == 1
    assert launch(replay, workload(), strategy(tp=3)).category_hint is FailureCategory.NOT_MEASURED


def test_step_time_only_row(tmp_path: Path) -> None:
    path = write(tmp_path / "steps.csv", dict(result="ok", step_time_s="100", mem_max_gib=""))
    result = launch(ReplayLauncher(path), workload(), strategy(tp=2))
    w, m = workload(), result.metrics
    assert m.step_time_s == 100 and m.mem_max_gib is None
    assert m.tflops_per_gpu == pytest.approx(flops_per_iteration(w, 2) / (100 * 1e12 * 8))
    assert m.mfu == pytest.approx(m.tflops_per_gpu / 312)
    assert result.gpu_seconds == pytest.approx(100 * 8 * TIMED_STEPS)


def test_an_ok_row_without_throughput_is_no_candidate(tmp_path: Path) -> None:
    """A row that ran but gives only memory tells nothing a replay could return: it is not offered
    (it used to abort `optico bench`), and asking for it answers 'not measured'."""
    path = write(tmp_path / "mem.csv", dict(result="ok", step_time_s="", mem_max_gib="40"))
    replay = ReplayLauncher(path)
    assert replay.candidates(workload()) == []
    assert launch(replay, workload(), strategy(tp=2)).category_hint is FailureCategory.NOT_MEASURED


def test_bench_skips_a_file_without_a_usable_workload(tmp_path: Path, capsys) -> None:
    """One file that is no replay table, or has no workload with enough measured configurations,
    must not abort `optico bench`: it is skipped with a warning and the rest runs."""
    from optico.bench.suite import select_landscapes

    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    few = write(tmp_path / "few.csv", dict(result="ok", step_time_s="10"))
    defs = select_landscapes("replay", [str(junk), str(few)])
    assert defs  # the packaged table still runs
    err = capsys.readouterr().err
    assert "junk.csv: not a replay table" in err and "few.csv has no workload" in err


def test_a_launcher_on_rows_already_read_answers_as_one_that_reads_the_file(tmp_path: Path) -> None:
    """The benchmark builds one launcher per run from rows read once: the same answers, and the
    file is not read again (it may even be gone)."""
    from optico.replay_csv import read_replay_csv
    from optico.replay_measured import matches, replayable

    path = Path(write(tmp_path / "t.csv", dict(result="ok", mfu="0.5"), dict(result="oom", tp="4"),
                 dict(result="ok", tp="8", mfu="0.4")))
    rows = read_replay_csv(path)
    path.unlink()
    shared, fresh = ReplayLauncher(path, rows=rows), ReplayLauncher(TABLE)
    assert [s.signature() for s in shared.candidates(workload())] == \
        [s.signature() for s in (strategy(tp=2), strategy(tp=4), strategy(tp=8))]
    assert launch(shared, workload(), strategy(tp=2)).metrics.mfu == 0.5
    assert launch(shared, workload(), strategy(tp=4)).category_hint is FailureCategory.OOM
    assert launch(shared, workload(), strategy(tp=1)).category_hint is FailureCategory.NOT_MEASURED
    w = workload()
    for s in fresh.candidates(w):  # the signature index finds what a scan of every row finds
        scanned = [r.line for r in fresh.rows
                   if replayable(r) and matches(r, w) and r.strategy.signature() == s.signature()]
        assert [r.line for r in fresh.rows_for(w, s)] == scanned and scanned


def test_another_tables_failures_are_hints_not_facts_for_a_job_on_this_table(tmp_path: Path, cli_env: dict):
    """Trials of one workload are shared across jobs; a job on a table where everything ran out of memory
    made a later job on another table of the same workload stop after one trial ("search space
    exhausted"): replay trials did not say which table measured them, so its OOMs counted as facts."""
    import json
    import subprocess

    from optico.pool.store import SqlStore
    from tests.conftest import EXAMPLES, optico_cmd

    packaged = Path(__file__).resolve().parents[1] / "optico" / "data" / "optico_llama3_8b_a100.csv"
    rows = list(csv.DictReader(packaged.open()))
    all_oom = tmp_path / "all_oom.csv"
    with all_oom.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({**r, "result": "oom", "tflops_per_gpu": "", "mfu": "", "mem_max_gib": ""} for r in rows)
    text = (EXAMPLES / "llama3-8b-a100-replay.yaml").read_text()
    for name, table in (("oom", all_oom), ("good", packaged)):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(text.replace("../optico/data/optico_llama3_8b_a100.csv", str(table)))
        done = subprocess.run(optico_cmd("tune", str(spec), "--json", str(tmp_path / f"{name}.json")), env=cli_env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == (1 if name == "oom" else 0), done.stderr
    alone = tmp_path / "alone"
    alone.mkdir()
    env = {**cli_env, "OPTICO_DATABASE_URL": f"sqlite:///{alone / 'pool.db'}", "OPTICO_HOME": str(alone)}
    done = subprocess.run(optico_cmd("tune", str(tmp_path / "good.yaml"), "--json", str(alone / "good.json")), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    after, fresh = (json.loads(p.read_text()) for p in (tmp_path / "good.json", alone / "good.json"))
    assert "known-failure" not in str(after.get("stop_reason")), after.get("stop_reason")  # was: exhausted
    assert after["best"]["mfu"] >= 0.97 * fresh["best"]["mfu"]  # about as good as in an empty pool
    with SqlStore(cli_env["OPTICO_DATABASE_URL"]) as store:
        digests = {t.fingerprint.get("replay_data") for job in store.list_jobs() for t in store.trials(job.id)}
    assert len(digests - {None}) == 2  # each table's trials say which table measured them

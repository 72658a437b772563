"""`optico bench` on hostile input: one line naming the option, exit 2, nothing run or written.

Every case here is refused before any landscape is built or tuner runs (a second or so each):
file names too long for the file system, with terminal escapes, Rich markup or line breaks;
files that are no replay table, not UTF-8 or binary; bad option values; output paths that cannot
be written; a calibration the loader refuses. Replay rows with impossible measurements are
checked on the landscape itself (running the benchmark would be slow)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from optico.bench.landscapes import MIN_PLAUSIBLE_MFU, model_agreement, replay_defs
from optico.bench.report import markdown
from optico.bench.suite import run_benchmark, select_landscapes
from optico.errors import SpecError

REPO = Path(__file__).resolve().parents[2]
PACKAGED = REPO / "optico" / "data" / "optico_llama3_8b_a100.csv"
LONG = "a" * 300  # longer than any file system's name limit (255 bytes): stat() itself fails


def bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
          json_out: bool = True) -> subprocess.CompletedProcess[str]:
    """`optico bench ARGS --json OUT` (without `json_out`: no --json) in `tmp_path`, with its own data
    dir; OUT must not appear."""
    environ = {k: v for k, v in os.environ.items() if k != "OPTICO_CALIBRATION" and not k.startswith("OPTICO_LLM_")}
    environ.update({"OPTICO_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1", "COLUMNS": "80",
                    **(env or {})})
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, "-m", "optico.cli", "bench", *args, *(["--json", str(out)] * json_out)],
                          capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=120)
    assert not out.exists(), "a refused command wrote its output"
    return proc


def assert_refused(proc: subprocess.CompletedProcess[str], option: str, *mentions: str) -> str:
    """Exit 2; stderr is one escaped line `error: <option>: ...` quoting `mentions`; nothing ran."""
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both and "\x1b" not in both, both
    assert proc.returncode == 2, both
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: {option}"), lines[0]
    for text in mentions:
        assert text in lines[0], lines[0]
    assert proc.stdout.strip() == "", proc.stdout  # not even the run's header: nothing started
    return lines[0]


def write_table(path: Path, edit=None) -> Path:
    """The packaged replay table as a new workload (global batch 1024, sequence 4096: rows the shipped
    calibration never saw), `edit(ok_rows)` applied to its measured rows."""
    with PACKAGED.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row.update(gbs="1024", seq_length="4096")
    if edit:
        edit([r for r in rows if r["result"] == "ok"])
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


# -- --landscape: file names and files that cannot be read ------------------------------------

def test_a_file_name_too_long_is_an_error_naming_landscape(tmp_path: Path):
    assert_refused(bench(tmp_path, "--landscape", f"/tmp/{LONG}.csv", "--quick", "--tuners", "optico",
                         "--seeds", "1"), "--landscape", "File name too long")


@pytest.mark.parametrize("name", ["x\x1b[31mred\x1b]0;title\x07.csv", "zz[/x].csv", "a\nerror: fine.csv",
                                  "r\u202eebil.csv"])
def test_a_missing_file_is_named_escaped_on_one_line(tmp_path: Path, name: str):
    line = assert_refused(bench(tmp_path, "--landscape", name, "--quick", "--tuners", "optico", "--seeds", "1"),
                          "--landscape", "no such file")
    assert "\x07" not in line and "\u202e" not in line
    if "\n" in name:
        assert "a\\nerror: fine.csv" in line
    if "[/x]" in name:
        assert "zz[/x].csv" in line  # shown as given, not read as Rich markup


def test_a_file_that_is_no_replay_table_is_an_error_not_skipped(tmp_path: Path):
    (tmp_path / "notreplay.csv").write_text("foo,bar\n1,2\n")
    assert_refused(bench(tmp_path, "--landscape", "notreplay.csv", "--quick", "--tuners", "optico", "--seeds", "1"),
                   "--landscape", "notreplay.csv", "not a replay table")


def test_a_table_without_a_workload_to_benchmark_is_an_error(tmp_path: Path):
    lines = PACKAGED.read_text().splitlines(keepends=True)
    (tmp_path / "few.csv").write_text("".join(lines[:3]))  # two measured rows: no search
    assert_refused(bench(tmp_path, "--landscape", "few.csv", "--only", "few", "--quick"),
                   "--landscape", "few.csv", "no workload with enough measured configurations")


def test_the_files_after_the_first_landscape_are_checked_too(tmp_path: Path):
    write_table(tmp_path / "good.csv")
    (tmp_path / "notreplay.csv").write_text("foo,bar\n1,2\n")
    assert_refused(bench(tmp_path, "--landscape", "good.csv", "notreplay.csv", "--quick", "--tuners", "optico"),
                   "--landscape", "notreplay.csv")


def test_a_no_replay_table_named_with_escapes_is_shown_escaped(tmp_path: Path):
    name = "n\x1b[2Jo[bold]table.csv"
    (tmp_path / name).write_text("foo,bar\n1,2\n")
    line = assert_refused(bench(tmp_path, "--landscape", name, "--quick", "--tuners", "optico"), "--landscape")
    assert "n\\x1b[2Jo[bold]table.csv" in line


def test_a_file_not_utf8_is_an_error_naming_landscape_and_the_file(tmp_path: Path):
    (tmp_path / "latin.csv").write_bytes(b"model,num_layers\n\xff\xfe,2\n")
    assert_refused(bench(tmp_path, "--landscape", "latin.csv", "--quick", "--tuners", "optico"),
                   "--landscape", "latin.csv", "not UTF-8")


def test_a_file_with_nul_bytes_is_an_error(tmp_path: Path):
    data = PACKAGED.read_bytes().replace(b"Llama3-8B", b"Llama3\x00-8B", 1)
    (tmp_path / "nul.csv").write_bytes(data)
    assert_refused(bench(tmp_path, "--landscape", "nul.csv", "--quick", "--tuners", "optico"),
                   "--landscape", "nul.csv", "NUL")


def test_a_directory_is_an_error(tmp_path: Path):
    (tmp_path / "dir.csv").mkdir()
    assert_refused(bench(tmp_path, "--landscape", "dir.csv", "--quick", "--tuners", "optico"),
                   "--landscape", "dir.csv", "directory")


def test_only_selecting_nothing_names_only(tmp_path: Path):
    write_table(tmp_path / "good.csv")
    assert_refused(bench(tmp_path, "--landscape", "good.csv", "--only", "no-such-landscape", "--quick"),
                   "--only", "no-such-landscape")


# -- option values --------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "option", "mention"), [
    (["--tuners", "nope"], "--tuners", "'nope'"),
    (["--tuners", "optico,\x1b[31mx"], "--tuners", "\\x1b"),
    (["--tuners", ","], "--tuners", "no tuner"),
    (["--sweep", "abc"], "--sweep", "'abc'"),
    (["--sweep", "nan"], "--sweep", "nan"),
    (["--sweep", "inf"], "--sweep", "inf"),
    (["--sweep", "0,-0.1"], "--sweep", "-0.1"),
    (["--sweep", "1e308"], "--sweep", "1e308"),
    (["--sweep", "0,1_0"], "--sweep", "'1_0'"),  # float() read it as 10
    (["--jobs", "0"], "--jobs", "0"),
    (["--jobs", "-3"], "--jobs", "-3"),
    (["--seeds", "0"], "--seeds", "0"),
    (["--budget", "0"], "--budget", "0"),
    (["--jobs", "100000"], "--jobs", "100000 is not allowed; give 1 to 64"),  # every worker forks up front
    (["--seeds", "1000000000"], "--seeds", "1000000000"),
    (["--budget", "10001"], "--budget", "10001"),
    (["--suite", "x\x1b[31m"], "--suite", "\\x1b"),
    (["--reasoner", "nope"], "--reasoner", ""),
    (["--ablate", "nope"], "--ablate", "unknown ablation 'nope' (history,"),  # was '--reasoner/--ablate: Input...'
    # No endpoint configured (the test environment sets no OPTICO_LLM_MODEL): every OptiCo run fell back,
    # and the table said 0 % with exit 0.
    (["--reasoner", "model-guided"], "reasoner model-guided", "OPTICO_LLM_MODEL is not set"),
])
def test_bad_option_values_are_one_line_naming_the_option(tmp_path: Path, args: list[str], option: str,
                                                          mention: str):
    assert_refused(bench(tmp_path, "--suite", "replay", "--seeds", "1", *args), option, mention)


# -- output paths: checked before the run ------------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--plot", "--markdown", "--trials"])
def test_an_output_path_under_a_file_is_refused_before_the_run(tmp_path: Path, option: str):
    blocker = tmp_path / "hostname"
    blocker.write_text("host\n")
    target = blocker / "x.out"
    assert_refused(bench(tmp_path, "--suite", "replay", option, str(target), json_out=False), option,
                   "not a directory")
    assert blocker.read_text() == "host\n"


@pytest.mark.parametrize("option", ["--json", "--plot", "--markdown", "--trials"])
def test_an_output_path_that_is_a_directory_is_refused_before_the_run(tmp_path: Path, option: str):
    folder = tmp_path / "reports"
    folder.mkdir()
    assert_refused(bench(tmp_path, "--suite", "replay", option, str(folder), json_out=False), option,
                   "not a regular file")
    assert list(folder.iterdir()) == []


def test_an_output_path_too_long_is_refused_before_the_run(tmp_path: Path):
    assert_refused(bench(tmp_path, "--suite", "replay", "--markdown", str(tmp_path / f"{LONG}.md")), "--markdown")


# -- what a loader refuses ----------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"gemm_efficiency": NaN}', "{", "[1, 2]", "\x00\x01", '{"no_such": 1}'])
def test_a_hostile_calibration_is_one_line_not_a_traceback(tmp_path: Path, text: str):
    calibration = tmp_path / "cal\x1b[31m.json"
    calibration.write_text(text)
    assert_refused(bench(tmp_path, "--suite", "replay", env={"OPTICO_CALIBRATION": str(calibration)}),
                   "OPTICO_CALIBRATION")


def test_a_missing_calibration_is_one_line(tmp_path: Path):
    assert_refused(bench(tmp_path, "--suite", "replay", env={"OPTICO_CALIBRATION": str(tmp_path / "none.json")}),
                   "OPTICO_CALIBRATION")


# -- the library side of the same checks --------------------------------------------------------

def test_select_landscapes_strict_raises_spec_error_naming_landscape(tmp_path: Path):
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="--landscape.*junk.csv.*not a replay table"):
        select_landscapes("replay", [junk], strict=True)
    with pytest.raises(SpecError, match="--landscape.*File name too long"):
        select_landscapes("replay", [tmp_path / f"{LONG}.csv"])


def test_a_named_table_s_broken_rows_are_left_out_with_a_warning(tmp_path: Path, capsys):
    # A spec's own replay file is refused for such a row; the benchmark leaves it out, and said nothing.
    path = write_table(tmp_path / "ragged.csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[-1] + ",extra"]) + "\n")
    defs = select_landscapes("replay", [path], strict=True)
    assert any("ragged" in d.name for d in defs)
    warning = capsys.readouterr().err
    assert f"--landscape: 1 malformed row(s) of {path}, 1 left out (first ragged.csv:{len(lines) + 1}:" in warning
    select_landscapes("replay", [write_table(tmp_path / "clean.csv")], strict=True)
    assert "malformed" not in capsys.readouterr().err


def test_a_named_table_s_rows_no_landscape_can_hold_are_left_out_with_a_warning(tmp_path: Path, capsys):
    # TP 3 with 32 heads (the rules refuse it) and a 26-digit TP: both rows left out; the first was
    # left out silently, the second named a TP its float reading had changed.
    def edit(ok_rows):
        ok_rows[0]["tp"] = "3"
        ok_rows[1]["tp"] = "1" * 26
    path = write_table(tmp_path / "odd.csv", edit)
    defs = select_landscapes("replay", [path], strict=True)
    assert any("odd" in d.name for d in defs)
    warning = capsys.readouterr().err
    assert f"--landscape: 1 row(s) of {path} left out (first odd.csv:" in warning
    assert "must be divisible by TP (3)" in warning
    assert "larger than any count a table holds" in warning and "1" * 26 in warning
    select_landscapes("replay", [write_table(tmp_path / "clean.csv")], strict=True)
    assert "left out" not in capsys.readouterr().err


def test_rows_shorter_than_the_header_are_said_to_be_read_not_left_out(tmp_path: Path, capsys):
    # A header with one column more than its rows: every row was read (its last cell unknown), and the
    # warning said they were "left out" with the reason "None".
    path = write_table(tmp_path / "wide.csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0] + ",extra", *lines[1:]]) + "\n")
    defs = select_landscapes("replay", [path], strict=True)
    assert any("wide" in d.name for d in defs)
    warning = capsys.readouterr().err
    assert f"{len(lines) - 1} read with their missing cells unknown (first wide.csv:2: " in warning, warning
    assert "None" not in warning and "left out" not in warning


def test_a_refused_table_is_one_line_that_says_what_was_broken(tmp_path: Path, capsys):
    # Every row shifted by an extra field: the refusal and the malformed rows were two lines.
    path = write_table(tmp_path / "shifted.csv")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], *(line + ",x,y" for line in lines[1:])]) + "\n")
    with pytest.raises(SpecError, match=r"no workload with enough measured.*malformed row\(s\).*left out") as exc:
        select_landscapes("replay", [path], strict=True)
    assert "\n" not in str(exc.value) and capsys.readouterr().err == ""


def test_a_refused_table_says_how_many_rows_were_read_and_why_the_rest_were_not(tmp_path: Path):
    # Every row without a head count (BLOOM's 'NHEADS' was an unknown header): the refusal named
    # neither that no row was read nor why.
    with PACKAGED.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    path = tmp_path / "headless.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, [c for c in rows[0] if c != "num_attention_heads"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**row, "model": "mystery-net", "gbs": "1024"} for row in rows)
    with pytest.raises(SpecError, match=r"0 of its \d+ rows read\).*left out \(first headless.csv:2: "
                                        r"missing required input\(s\): num_attention_heads") as exc:
        select_landscapes("replay", [path], strict=True)
    assert "\n" not in str(exc.value)


def test_a_file_name_with_escapes_gives_an_escaped_landscape_name(tmp_path: Path):
    defs = replay_defs(write_table(tmp_path / "t\x1b[31m\nx.csv"))
    assert defs and all("\x1b" not in d.name and "\n" not in d.name for d in defs)
    assert defs[0].name.startswith("replay:t\\x1b[31m\\nx:")


def test_a_key_in_a_file_name_is_masked_in_the_landscape_name(tmp_path: Path):
    key = "sk-proj-" + "A1b2" * 9
    defs = replay_defs(write_table(tmp_path / f"{key}.csv"))
    assert defs and all(key not in d.name and d.name.startswith("replay:***:") for d in defs)


def test_a_model_name_with_a_newline_a_pipe_a_tag_and_a_link_stays_one_inert_table_cell(tmp_path: Path):
    # A model that is no preset keeps the CSV's name (the packaged table's Llama3-8B would become the preset's).
    # The tag and the link were written into the Markdown report as they were.
    with (REPO / "benchmarks" / "data" / "h100-qwen2.5-1.5b.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        row["model"] = "qwen\nerror: injected | x <img src=x onerror=alert(1)> [l](javascript:alert(1))"
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (defn,) = replay_defs(path)
    assert "\n" not in defn.name and "error: injected" in defn.name
    doc = run_benchmark([defn], ("model-greedy",), budget=3, seeds=1, jobs=1, fidelity=False)
    (line,) = [text for text in markdown(doc).splitlines() if "injected" in text]
    # Markdown shows '\\n' as the two characters the terminal escape wrote.
    assert line.startswith(r"| replay:t:qwen\\nerror: injected \| x &lt;img src=x onerror=alert(1)> \[l\](javascript:")


def test_a_table_where_nothing_ran_is_refused_before_anything_runs(tmp_path: Path):
    def all_oom(rows: list[dict[str, str]]) -> None:
        for row in rows:
            row.update(result="oom", tflops_per_gpu="", mfu="", step_time_s="", tokens_per_s_per_gpu="")

    path = write_table(tmp_path / "alloom.csv", all_oom)
    assert_refused(bench(tmp_path, "--landscape", str(path), "--quick", "--suite", "real", "--tuners", "optico",
                         "--seeds", "1"), "--landscape", "alloom.csv", "a run that finished")


def test_a_file_name_whose_calibration_name_is_too_long_reads(tmp_path: Path):
    # "without-<stem>.json" is past the name limit although the CSV's own name is not.
    defs = replay_defs(write_table(tmp_path / f"{'b' * 245}.csv"))
    assert defs and defs[0].calibration is None


def _impossible(rows: list[dict[str, str]]) -> None:
    rows[0].update(tflops_per_gpu="1e999")  # the mfu cell still holds the measurement
    rows[1].update(step_time_s="1e-320")  # MFU from the step time: infinite
    rows[2].update(mfu="1e-320", tflops_per_gpu="")  # a denormal MFU: every ratio to it overflows
    rows[3].update(mfu="inf", tflops_per_gpu="")  # no usable figure left


def test_impossible_measurements_are_no_landscape_points_and_warn_nothing(tmp_path: Path):
    clean = replay_defs(write_table(tmp_path / "clean.csv"))[0].build()
    path = write_table(tmp_path / "hostile.csv", _impossible)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail here
        (defn,) = replay_defs(path)
        landscape = defn.build()
        agreement = model_agreement(landscape)
    assert len(landscape.candidates) <= len(clean.candidates) - 3
    kept = {s.signature() for s in landscape.candidates}
    assert kept < {s.signature() for s in clean.candidates}
    mfus = [t.mfu for t in landscape.truth.values() if t.mfu is not None]
    assert all(np.isfinite(m) and MIN_PLAUSIBLE_MFU <= m <= 1 for m in mfus)
    assert 0 < landscape.optimum_mfu <= clean.optimum_mfu
    assert all(v is None or np.isfinite(v) for v in agreement.values())


def test_missing_benchmark_packages_are_named_before_anything_runs(tmp_path: Path):
    # `make demo` installs OptiCo alone; the benchmark's extra is not there. A site directory whose
    # `optuna` and `torch` cannot be imported stands in for that environment (the real packages hide
    # behind it on sys.path): one line naming both and how to install them, exit 2, nothing written.
    site = tmp_path / "site"
    for name in ("optuna", "torch"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text("raise ImportError('not installed here')\n")
    # find_spec sees a package that is there; the check must import-test, not only look
    proc = bench(tmp_path, "--quick", env={"PYTHONPATH": os.pathsep.join([str(site), str(REPO)])})
    line = assert_refused(proc, "optico bench needs optuna, torch")
    assert "make install-bench" in line and "optico[bench]" in line


def test_emoji_codes_in_a_file_name_are_text(tmp_path: Path):
    """Rich turns ":ok:" into an emoji unless told not to; a file name is the user's text."""
    line = assert_refused(bench(tmp_path, "--landscape", ":ok:.csv", "--quick", "--seeds", "1"), "--landscape")
    assert ":ok:" in line and "\N{SQUARED OK}" not in line

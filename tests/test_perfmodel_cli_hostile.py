"""`optico perfmodel` on hostile input: every bad file, path or option is one escaped line,
`error: <option>: <reason>`, exit 2, before any fitting, with nothing written; and every
calibration file is read with the spec's checks, wherever it comes from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optico.errors import SpecError
from tests.conftest import PACKAGED_OPTICO_CSV

H100_CSV = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "h100-llama-1b.csv"
LONG = "a" * 300  # one path component over NAME_MAX (255)
ANSI = "x\x1b]0;pwned\x07\x1b[31mRED"


def perfmodel(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "OPTICO_CALIBRATION"}
    environ.update({"OPTICO_HOME": str(tmp_path / "home"), "COLUMNS": "200", **(env or {})})
    return subprocess.run([sys.executable, "-m", "optico.cli", "perfmodel", *args], capture_output=True,
                          text=True, timeout=300, env=environ, cwd=tmp_path)


def assert_one_line_error(proc: subprocess.CompletedProcess, option: str, *also: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    # the option, or a constant inside the file it names: `error: --start.gemm_efficiency: ...`
    assert lines[0].startswith((f"error: {option}:", f"error: {option}.")), proc.stderr
    for text in also:
        assert text in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "\x1b" not in proc.stderr + proc.stdout
    return lines[0]


# -- hostile files ----------------------------------------------------------------------------

def write_hostile_calibrations(folder: Path) -> dict[str, Path]:
    """One file per way a calibration can be wrong."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "not json": "{not json",
        "not an object": "[0.8, 0.5]",
        "nan": '{"gemm_efficiency": NaN}',
        "infinity": '{"gemm_efficiency": Infinity}',
        "unknown key": '{"warp_factor": 9}',
        "duplicate key": '{"gemm_efficiency": 0.5, "gemm_efficiency": 0.9}',  # was: the last one won
        "wrong type": '{"gemm_efficiency": "0.8"}',
        "out of bounds": '{"gemm_efficiency": 5.0}',
        "too deep": "[" * 100_000 + "]" * 100_000,
        "huge integer": '{"gemm_efficiency": ' + "9" * 5000 + "}",
        "too large": '{"_meta": "' + "x" * (2 * 1024 * 1024) + '"}',
        "binary": '{"gemm_efficiency": 0.8}\x00',
        f"ansi {ANSI}": '{"' + ANSI + '": 1}',
    }
    paths = {}
    for i, (label, text) in enumerate(files.items()):
        paths[label] = folder / f"hostile{i}.json"
        paths[label].write_text(text)
    paths["directory"] = folder / "adir.json"
    paths["directory"].mkdir(exist_ok=True)
    paths["missing"] = folder / "missing.json"
    paths["name too long"] = folder / f"{LONG}.json"
    return paths


@pytest.fixture
def hostile_calibrations(tmp_path: Path) -> dict[str, Path]:
    return write_hostile_calibrations(tmp_path / "cal")


def test_load_constants_refuses_each_hostile_calibration_naming_its_source(hostile_calibrations, monkeypatch):
    from optico.perfmodel.constants import load_constants

    monkeypatch.delenv("OPTICO_CALIBRATION", raising=False)
    for label, path in hostile_calibrations.items():
        with pytest.raises(SpecError) as given:
            load_constants(path)
        assert given.value.field.startswith("calibration"), (label, given.value)
        assert "\n" not in str(given.value)
        assert not any(word in str(given.value) for word in ("sys.", "recursion")), (label, given.value)  # our words
        monkeypatch.setenv("OPTICO_CALIBRATION", str(path))
        with pytest.raises(SpecError) as from_env:
            load_constants()
        assert from_env.value.field.startswith("OPTICO_CALIBRATION"), (label, from_env.value)
        monkeypatch.delenv("OPTICO_CALIBRATION")


def test_the_shipped_calibration_still_loads_and_a_saved_one_round_trips(tmp_path, monkeypatch):
    from optico.perfmodel.constants import DEFAULT_CALIBRATION, Constants, load_constants

    monkeypatch.delenv("OPTICO_CALIBRATION", raising=False)
    assert "_meta" in json.loads(DEFAULT_CALIBRATION.read_text())  # skipped, not an unknown constant
    shipped = load_constants()
    assert shipped == load_constants(DEFAULT_CALIBRATION)
    assert shipped is load_constants()  # cached
    assert shipped != Constants()  # fitted, not the defaults
    saved = tmp_path / ("b" * 250 + ".json")  # name + ".tmp" would be over the name limit
    shipped.save(saved)
    assert load_constants(saved) == shipped
    assert sorted(p.name for p in tmp_path.iterdir()) == [saved.name]  # no temporary file left
    monkeypatch.setenv("OPTICO_CALIBRATION", str(saved))
    assert load_constants() == shipped


# -- the CLI ----------------------------------------------------------------------------------

def test_report_escapes_a_hostile_header(tmp_path):
    rows = PACKAGED_OPTICO_CSV.read_text().splitlines()
    path = tmp_path / "ansiheader.csv"
    path.write_text("\n".join([rows[0] + "," + ANSI, *(row + ",1" for row in rows[1:])]) + "\n")
    proc = perfmodel(tmp_path, "evaluate", "--data", str(path), "--report")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr and "\x07" not in proc.stdout
    assert "columns ignored: x\\x1b]0;pwned" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("value, reason", [("nan", "is not a plain decimal"), ("inf", "is not a plain decimal"),
                                           ("-1", "is not a plain decimal"), ("1_0", "is not a plain decimal"),
                                           ("2e6", "must be a number")])
def test_a_prior_weight_out_of_range_says_why(tmp_path, value, reason):
    # NaN passed click's range check and was refused as "less than or equal to 1000000"; '1_0' was 10.
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), f"--prior={value}")
    assert_one_line_error(proc, "--prior", reason, "from 0 to 1e+06")


def test_report_redacts_a_secret_in_a_cell(tmp_path):
    # A cell is the file's text: a key pasted into it was printed in full, in the report and the summary.
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(PACKAGED_OPTICO_CSV.read_text())))
    secret = "Tr0ub4dor-horse-battery-staple"
    rows[0]["gpu"], rows[1]["gpu"] = "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012345", secret
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    path = tmp_path / "secret.csv"
    path.write_text(out.getvalue())
    for extra in (["--json"], ["--report"]):
        proc = perfmodel(tmp_path, "evaluate", "--data", str(path), *extra, env={"OPENAI_API_KEY": secret})
        assert proc.returncode == 0, proc.stderr
        text = proc.stdout + proc.stderr
        assert "sk-proj-abc" not in text and secret not in text
    assert "unknown GPU 'OPENAI_API_KEY=***'" in text  # the --report run's skipped rows, masked


@pytest.mark.parametrize("label", ["not json", "nan", "too deep", "unknown key", "out of bounds", "too large",
                                   f"ansi {ANSI}", "name too long"])
def test_calibrate_refuses_a_bad_calibration_in_use(tmp_path, label):
    path = write_hostile_calibrations(tmp_path / "cal")[label]
    out = tmp_path / "fitted.json"
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--out", str(out),
                     env={"OPTICO_CALIBRATION": str(path)})
    assert_one_line_error(proc, "OPTICO_CALIBRATION")
    assert not out.exists()


@pytest.mark.parametrize("label", ["not json", "infinity", "wrong type", "not an object", "directory",
                                   "name too long"])
def test_start_and_calibration_options_refuse_a_bad_file(tmp_path, label):
    path = write_hostile_calibrations(tmp_path / "cal")[label]
    out = tmp_path / "fitted.json"
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--start", str(path),
                     "--out", str(out))
    assert_one_line_error(proc, "--start")
    assert not out.exists()
    proc = perfmodel(tmp_path, "evaluate", "--data", str(PACKAGED_OPTICO_CSV), "--calibration", str(path))
    assert_one_line_error(proc, "--calibration")
    proc = perfmodel(tmp_path, "evaluate", "--data", str(PACKAGED_OPTICO_CSV), env={"OPTICO_CALIBRATION": str(path)})
    assert_one_line_error(proc, "OPTICO_CALIBRATION")


def test_a_missing_start_file_suggests_defaults(tmp_path):
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--start", str(tmp_path / "no.json"))
    assert_one_line_error(proc, "--start", "no such file", "'defaults'")


@pytest.mark.parametrize("where", ["/etc/hostname/x.json", "directory", "long", "long folder"])
@pytest.mark.parametrize("command", ["calibrate", "crossvalidate"])
def test_out_is_checked_before_fitting(tmp_path, command, where):
    out = {"directory": str(tmp_path), "long": str(tmp_path / f"{LONG}.json"),
           "long folder": str(tmp_path / LONG / "x.json")}.get(where, where)
    data = [str(PACKAGED_OPTICO_CSV), str(H100_CSV)] if command == "crossvalidate" else [str(PACKAGED_OPTICO_CSV)]
    # 100,000 evaluations: were the check after the fit, this would run past the timeout.
    proc = perfmodel(tmp_path, command, "--data", *data, "--max-evals", "100000", "--out", out)
    assert_one_line_error(proc, "--out")
    assert "before" not in proc.stdout and "fold done" not in proc.stdout
    assert {p.name for p in tmp_path.iterdir()} <= {"home"}  # nothing written


def test_crossvalidate_out_makes_its_missing_folders(tmp_path):
    # The whole cross-validation ran, then: "error: --out: cannot write ...: No such file or directory".
    out = tmp_path / "cv" / "runs" / "cv.json"
    proc = perfmodel(tmp_path, "crossvalidate", "--data", str(PACKAGED_OPTICO_CSV), str(H100_CSV),
                     "--max-evals", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(out.read_text())) >= {"files", "overall"}


@pytest.mark.parametrize("option", ["--data", "--holdout", "--start", "--calibration"])
def test_an_overlong_path_names_its_option(tmp_path, option):
    long = str(tmp_path / f"{LONG}.{'json' if option in ('--start', '--calibration') else 'csv'}")
    command = "evaluate" if option == "--calibration" else "calibrate"
    args = ["--data", long] if option == "--data" else ["--data", str(PACKAGED_OPTICO_CSV), option, long]
    out = tmp_path / "fitted.json"
    proc = perfmodel(tmp_path, command, *args, *(["--out", str(out)] if command == "calibrate" else []))
    assert_one_line_error(proc, option, "too long")
    assert not out.exists()


def test_a_bad_field_names_the_field_option(tmp_path):
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--field", "warp",
                     "--field", ANSI)
    line = assert_one_line_error(proc, "--field", "warp", "not calibratable", "gemm_efficiency")
    assert "\\x1b" in line  # the hostile name is shown escaped


def test_a_bad_holdout_names_the_holdout_option(tmp_path):
    bad = tmp_path / "badhold.csv"
    bad.write_text("foo,bar\n1,2\n")
    out = tmp_path / "fitted.json"
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--holdout", str(bad),
                     "--out", str(out))
    assert_one_line_error(proc, "--holdout", "badhold.csv", "not a replay table")
    assert not out.exists()


def write_bigcell(path: Path) -> Path:
    rows = PACKAGED_OPTICO_CSV.read_text().splitlines()
    path.write_text(rows[0] + "\n" + rows[1] + ',"' + "x" * 200_000 + '"\n')
    return path


@pytest.mark.parametrize("command,option", [("evaluate", "--data"), ("calibrate", "--data"),
                                            ("calibrate", "--holdout"), ("crossvalidate", "--data")])
def test_a_cell_over_the_csv_field_limit_names_the_option_and_file(tmp_path, command, option):
    big = write_bigcell(tmp_path / f"big{ANSI}cell.csv")
    if option == "--holdout":
        args = ["--data", str(PACKAGED_OPTICO_CSV), "--holdout", str(big)]
    elif command == "crossvalidate":
        args = ["--data", str(PACKAGED_OPTICO_CSV), str(big)]
    else:
        args = ["--data", str(big)]
    proc = perfmodel(tmp_path, command, *args)
    assert_one_line_error(proc, option, "big")


def test_a_strict_bad_row_names_the_data_option(tmp_path):
    rows = PACKAGED_OPTICO_CSV.read_text().splitlines()
    path = tmp_path / "bad.csv"
    path.write_text("\n".join([rows[0], rows[1], rows[2].replace(",8,", ",banana,", 1).replace("ok", "exploded", 1)])
                    + "\n")
    proc = perfmodel(tmp_path, "evaluate", "--strict", "--data", str(path))
    assert_one_line_error(proc, "--data", "bad.csv:3:")


def test_crossvalidate_refuses_the_same_file_twice(tmp_path):
    proc = perfmodel(tmp_path, "crossvalidate", "--data", str(PACKAGED_OPTICO_CSV), str(PACKAGED_OPTICO_CSV))
    assert_one_line_error(proc, "--data", "optico_llama3_8b_a100.csv")


def test_a_hostile_out_path_is_escaped_when_written(tmp_path):
    out = tmp_path / f"[red]{ANSI}.json"
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), "--field", "mem_overhead_gib",
                     "--max-evals", "2", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "[red]x\\x1b]0;pwned" in proc.stdout
    assert json.loads(out.read_text())["mem_overhead_gib"] >= 0


def test_every_file_after_holdout_is_held_out_not_fitted(tmp_path):
    # `--holdout a.csv b.csv` (a shell glob): b was read as one more --data file and fitted on.
    import shutil

    three_b = H100_CSV.with_name("h100-llama3.2-3b.csv")
    for f in (H100_CSV, three_b):
        shutil.copy(f, tmp_path / f.name)  # relative paths as a shell glob gives them ("./x" is "x" to Path)
    proc = perfmodel(tmp_path, "calibrate", "--data", str(PACKAGED_OPTICO_CSV), f"--holdout=./{H100_CSV.name}",
                     f"./{three_b.name}", "--max-evals", "2")
    assert proc.returncode == 0, proc.stderr
    held = proc.stdout[proc.stdout.index("held out: before"):]
    fitted = proc.stdout[:proc.stdout.index("held out: before")]
    assert H100_CSV.name in held and three_b.name in held
    assert H100_CSV.name not in fitted and three_b.name not in fitted


@pytest.mark.parametrize("command", ["evaluate", "calibrate"])
def test_a_table_with_a_header_and_no_rows_is_refused(tmp_path, command):
    """It was scored as a table of 0 rows (exit 0), where `bench --landscape` and a replay spec refuse it."""
    path = tmp_path / "header.csv"
    path.write_text(PACKAGED_OPTICO_CSV.read_text().splitlines()[0] + "\n")
    assert_one_line_error(perfmodel(tmp_path, command, "--data", str(path)), "--data", "header.csv: no rows")


def test_report_beside_json_goes_to_stderr_and_stdout_stays_one_json_document(tmp_path):
    proc = perfmodel(tmp_path, "evaluate", "--data", str(PACKAGED_OPTICO_CSV), "--report", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["overall"]["rows"] == 14
    assert "optico_llama3_8b_a100.csv: 14 rows, 14 read" in proc.stderr


def test_rows_writes_each_row_s_figures_as_the_scores_use_them(tmp_path):
    """--rows: the per-row predictions behind the summary (a user had to script them to see which
    rows the model gets wrong); their errors give the summary's MdAPE, and no cell starts a formula."""
    import csv
    from statistics import median

    from optico.perfmodel.evaluate import ROW_COLUMNS

    table = tmp_path / "t.csv"
    lines = PACKAGED_OPTICO_CSV.read_text().splitlines()
    hostile = (line.replace(",Llama3-8B,", ",=HYPERLINK(x),", 1) for line in lines[1:])
    table.write_text("\n".join([lines[0], *hostile]) + "\n")
    out = tmp_path / "rows" / "r.csv"
    proc = perfmodel(tmp_path, "evaluate", "--data", str(table), "--rows", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["overall"]
    with out.open(newline="") as handle:
        records = list(csv.DictReader(handle))
    assert tuple(records[0]) == ROW_COLUMNS and len(records) == summary["rows"] == 14
    assert all(r["model"].startswith("'=") for r in records)
    errors = [abs(float(r["mfu_error"])) for r in records if r["mfu_error"]]
    assert len(errors) == 11 and median(errors) == pytest.approx(summary["mfu_median_ape"], abs=1e-3)
    assert {r["predicted_fits"] for r in records} <= {"True", "False"}


def test_rows_is_checked_before_any_work(tmp_path):
    proc = perfmodel(tmp_path, "evaluate", "--data", str(PACKAGED_OPTICO_CSV), "--rows", str(tmp_path))
    assert_one_line_error(proc, "--rows")

"""`optico perfmodel ...`: the analytic performance model against measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from optico.cli.common import MoreFilesArgument, console, fail, require_files
from optico.textsafe import markup, rich_text

perf_app = typer.Typer(no_args_is_help=True, help="The analytic performance model.")


def _figures_table(title: str, report: dict[str, Any]) -> Table:
    table = Table("file", "rows", "read", "OOM/fit acc.", "MFU MdAPE", "mem MdAPE", "Spearman", title=title)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for name, f in [*report["files"].items(), ("overall", report["overall"])]:
        read = f["rows"] - f["skipped"]
        table.add_row(rich_text(name, one_line=True), str(f["rows"]),
                      f"{read} ({read / f['rows']:.0%})" if f["rows"] else "0",
                      pct(f["oom_accuracy"]), pct(f["mfu_median_ape"]), pct(f["mem_median_ape"]),
                      "-" if f["spearman"] is None else f"{f['spearman']:.2f}")
    return table


def _calibration(path: Path, option: str):
    """Constants from a calibration file given on the command line, or a one-line error."""
    from optico.errors import SpecError
    from optico.input_files import read_calibration

    try:
        return read_calibration(path, option)
    except SpecError as exc:
        fail(exc)


StrictOption = typer.Option(False, "--strict", help="A row that cannot be read is an error (default: skipped "
                                                    "with its file:line reason).")


@perf_app.command("evaluate")
def perfmodel_evaluate(
    data: list[Path] = typer.Option(..., "--data", metavar="FILE.csv",
                                    help="Replay CSV file(s) of measured runs (more may follow: --data a.csv b.csv)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", envvar="OPTICO_CALIBRATION", metavar="FILE.json",
                                               help="Constants to evaluate (default: the shipped calibration)."),
    strict: bool = StrictOption,
    report_rows: bool = typer.Option(False, "--report", help="Print what was read from each file (columns, "
                                                             "unknown cells, skipped rows with file:line)."),
) -> None:
    """Compare the model's predictions with measured runs: fit/OOM accuracy, MFU and memory error, rank correlation."""
    from optico.perfmodel.constants import load_constants
    from optico.perfmodel.evaluate import evaluate_files
    from optico.replay_csv import read_replay_file

    data = [*data, *(more or [])]
    require_files("--data", data)
    constants = _calibration(calibration, "--calibration") if calibration else load_constants()
    try:
        report = evaluate_files(data, constants, strict=strict)
        if report_rows:
            for path in data:
                console.print(read_replay_file(path)[1].text(max_rows=20), highlight=False, markup=False)
    except (ValueError, FileNotFoundError) as exc:
        fail(f"--data: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    if as_json:
        print(json.dumps({"files": report["files"], "overall": report["overall"]}, indent=2))
        return
    console.print(_figures_table("performance model vs measurements", report))
    for name, d in report["details"].items():
        if d["skip_reasons"]:
            reasons = ", ".join(f"{k} ({v})" for k, v in list(d["skip_reasons"].items())[:4])
            console.print(f"[dim]{markup(name)}: skipped — {markup(reasons)}[/]", highlight=False)
        if d.get("mfu_unscored_not_tuned") and name != "overall":
            console.print(f"[dim]{markup(name)}: MFU not scored on {d['mfu_unscored_not_tuned']} rows whose times are "
                          f"not tuned throughput (memory and fit/OOM are)[/]", highlight=False)


@perf_app.command("calibrate")
def perfmodel_calibrate(
    data: list[Path] = typer.Option(..., "--data", metavar="FILE.csv",
                                    help="Replay CSV file(s) to fit on (more may follow: --data a.csv b.csv)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE.json",
                                       help="Write the fitted constants here (JSON)."),
    max_evals: int = typer.Option(40, "--max-evals", min=1, max=100_000, metavar="N",
                                  help="Least-squares evaluations (each predicts every row)."),
    field: Optional[list[str]] = typer.Option(None, "--field", metavar="NAME",
                                              help="Fit only these constants (repeatable)."),
    holdout: Optional[list[Path]] = typer.Option(None, "--holdout", metavar="FILE.csv",
                                                 help="Measured rows kept out of the fit; evaluate's figures on "
                                                      "them before and after (repeatable)."),
    start: Optional[str] = typer.Option(None, "--start", metavar="defaults|FILE.json",
                                        help="Constants to start from: 'defaults' (uncalibrated) or a JSON file "
                                             "(default: the calibration in use)."),
    prior: float = typer.Option(1.0, "--prior", min=0.0, max=1e6, metavar="W",
                                help="Pull of each constant toward its start (0 = none)."),
) -> None:
    """Fit the model's free constants to measured rows; report evaluate's figures before and after."""
    from optico.perfmodel.calibrate import calibrate, worse_figures
    from optico.perfmodel.constants import Constants, load_constants

    data = [*data, *(more or [])]
    require_files("--data", data)
    require_files("--holdout", holdout or [])
    if start not in (None, "defaults") and not Path(start).exists():
        fail(f"--start: no such file: {start} (or say 'defaults')")
    begin = Constants() if start == "defaults" else _calibration(Path(start), "--start") if start else load_constants()
    try:
        result = calibrate(data, start=begin, fields=field or None, max_nfev=max_evals,
                           holdout=list(holdout or []) or None, prior=prior)
    except (KeyError, ValueError) as exc:
        fail(str(exc.args[0] if exc.args else exc).splitlines()[0])
    console.print(_figures_table("before", result.before))
    console.print(_figures_table("after", result.after))
    console.print(f"cost {result.cost_before:.4f} -> {result.cost_after:.4f}")
    for label, before, after in (("fitted data", result.before, result.after),
                                 ("held-out data", result.holdout_before, result.holdout_after)):
        if before is None or after is None:
            continue
        if label == "held-out data":
            console.print(_figures_table("held out: before", before))
            console.print(_figures_table("held out: after", after))
        worse = worse_figures(before, after)
        console.print(f"{label}: " + (f"[yellow]worse[/] {', '.join(worse)}" if worse else "no figure got worse"),
                      highlight=False)
    if out:
        result.constants.save(out)
        console.print(f"constants written to {out}; select them with OPTICO_CALIBRATION={out}")



@perf_app.command("crossvalidate")
def perfmodel_crossvalidate(
    data: list[Path] = typer.Option(..., "--data", help="Replay CSV files, one source each (at least two)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    max_evals: int = typer.Option(40, "--max-evals", help="Least-squares evaluations per fold."),
    prior: float = typer.Option(1.0, "--prior", min=0.0, help="Pull of each constant toward its start (0 = none)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the figures (and each fold's constants) as JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Leave-one-source-out: fit on every file but one (from the uncalibrated constants), score the one left
    out; figures per held-out file and pooled. Figures fitted on the rows they score do not count."""
    from optico.perfmodel.calibrate import leave_one_source_out

    data = [*data, *(more or [])]
    require_files("--data", data)
    if len(data) < 2:
        fail("--data: leave-one-source-out needs at least two files")
    try:
        report = leave_one_source_out(data, max_nfev=max_evals, prior=prior,
                                      progress=lambda name: console.print(f"[dim]fold done: {name} held out[/]"))
    except (KeyError, ValueError) as exc:
        fail(str(exc.args[0] if exc.args else exc))
    if out:
        out.write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        print(json.dumps({"files": report["files"], "overall": report["overall"]}, indent=2))
        return
    console.print(_figures_table("leave-one-source-out (each file scored by constants fitted without it)", report))

"""`optico perfmodel ...`: the analytic performance model against measurements."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from optico.cli.common import (MoreFilesArgument, check_output_path, console, err, fail, files_by_option,
                               decimal_number, output_file, require_files, whole_number)
from optico.errors import SpecError, first_line
from optico.perfmodel.constants import CALIBRATION_ENV, Constants, load_constants, read_calibration
from optico.redact import redact
from optico.textsafe import markup, rich_text, terminal_text

perf_app = typer.Typer(no_args_is_help=True, help="The analytic performance model.")


def _figures_table(title: str, report: dict[str, Any]) -> Table:
    # Whole names, wrapped: cut to 'megatron_…', two files could not be told apart.
    table = Table(title=title)
    table.add_column("file", overflow="fold", min_width=10)
    for figure in ("rows", "read", "OOM/fit acc.", "MFU MdAPE", "mem MdAPE", "Spearman"):
        table.add_column(figure)

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for name, f in [*report["files"].items(), ("overall", report["overall"])]:
        read = f["rows"] - f["skipped"]
        table.add_row(rich_text(redact(name), one_line=True), str(f["rows"]),
                      f"{read} ({read / f['rows']:.0%})" if f["rows"] else "0",
                      pct(f["oom_accuracy"]), pct(f["mfu_median_ape"]), pct(f["mem_median_ape"]),
                      "-" if f["spearman"] is None else f"{f['spearman']:.2f}")
    return table


def _scored_line(name: str, report: dict[str, Any]) -> str | None:
    """How many rows each figure of a file rests on: a row with unknown cells is scored only on what
    all its plausible values agree on, and a row that did not run has no MFU, so 'read' is not that."""
    scored = report.get("details", {}).get(name, {}).get("scored")
    if scored is None:
        return None
    return (f"{name}: figures rest on {scored['oom']} rows (fit/OOM), {scored['mfu']} (MFU), "
            f"{scored['mem']} (memory)")


def _calibration(path: Path, option: str):
    """Constants from a calibration file given on the command line, or a one-line error."""
    try:
        return read_calibration(path, option)
    except SpecError as exc:
        fail(exc)


def _calibration_in_use():
    """The calibration in use ($OPTICO_CALIBRATION, else the shipped one), or a one-line error
    naming where it came from."""
    try:
        return load_constants()
    except SpecError as exc:
        fail(exc)


def _read_tables(option: str, paths: list[Path], strict: bool = False) -> list[tuple[Path, Any]]:
    """Each file read as a replay table, (path, (rows, report)), or a one-line error naming `option`
    and the file: whatever reading it raises (not a replay table, a cell over the CSV field limit,
    a row `strict` refuses, an I/O error) ends here, before any long work."""
    import csv

    from optico.replay_csv import ReplayError, read_replay_file

    tables = []
    for path in paths:
        try:
            tables.append((path, read_replay_file(path, strict=strict)))
        except (ReplayError, csv.Error, ValueError, OSError) as exc:  # UnicodeError is a ValueError
            reason = first_line(exc)
            if str(path) not in reason and path.name not in reason:
                reason = f"{path}: {reason}"
            fail(SpecError(option, reason))
        rows, _ = tables[-1][1]
        if not rows:
            fail(SpecError(option, f"{path}: no rows under its header"))
    return tables


def _write_row_records(path: Path, records: list[dict[str, Any]]) -> None:
    """`--rows`: one CSV line per row of every table (`row_record`). Text cells are the tables' own:
    redacted, shown as one line, and never the start of a spreadsheet formula."""
    import csv

    from optico.perfmodel.evaluate import ROW_COLUMNS
    from optico.replay_rows import spreadsheet_safe

    with output_file(path, "--rows") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(ROW_COLUMNS))
        writer.writeheader()
        for record in records:
            writer.writerow(spreadsheet_safe({k: terminal_text(redact(v), one_line=True) if isinstance(v, str)
                                              else v for k, v in record.items()}))


def _output(path: Optional[Path], option: str) -> Optional[Path]:
    """`path` (~ expanded) once it is known to be writable, checked before the long work."""
    if path is None:
        return None
    path = path.expanduser()
    check_output_path(path, option)
    return path


def _write_failed(path: Path, option: str, exc: OSError) -> None:
    fail(SpecError(option, f"cannot write {path}: {exc.strerror or exc}"))


MAX_PRIOR = 1e6


# Read by our parser, not click's float and range check: those let NaN through to a message that
# blamed the upper bound, and read '1_0' as 10.
PriorOption = typer.Option(1.0, "--prior", metavar="W", parser=decimal_number(0, MAX_PRIOR),
                           help="Pull of each constant toward its start (0 = none).")


StrictOption = typer.Option(False, "--strict", help="A row that cannot be read is an error (default: skipped "
                                                    "with its file:line reason).")


@perf_app.command("evaluate")
def perfmodel_evaluate(
    ctx: typer.Context,
    data: list[Path] = typer.Option(..., "--data", metavar="FILE.csv",
                                    help="Replay CSV file(s) of measured runs (more may follow: --data a.csv b.csv)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    calibration: Optional[Path] = typer.Option(None, "--calibration", envvar=CALIBRATION_ENV, metavar="FILE.json",
                                               help="Constants to evaluate (default: the shipped calibration)."),
    strict: bool = StrictOption,
    report_rows: bool = typer.Option(False, "--report", help="Print what was read from each file (columns, "
                                                             "unknown cells, skipped rows with file:line; on "
                                                             "stderr with --json)."),
    rows_out: Optional[Path] = typer.Option(None, "--rows", metavar="FILE.csv",
                                            help="Write every row's predictions beside its measurements (CSV)."),
) -> None:
    """Compare the model's predictions with measured runs: fit/OOM accuracy, MFU and memory error, rank correlation."""
    from optico.perfmodel.evaluate import evaluate_tables

    data = [*data, *(more or [])]
    require_files("--data", data)
    rows_out = _output(rows_out, "--rows")
    if calibration:
        # By name: typer vendors its own click, whose ParameterSource is not click.core's.
        from_env = getattr(ctx.get_parameter_source("calibration"), "name", None) == "ENVIRONMENT"
        constants = _calibration(calibration, CALIBRATION_ENV if from_env else "--calibration")
    else:
        constants = _calibration_in_use()
    tables = _read_tables("--data", data, strict=strict)
    records: list[dict[str, Any]] | None = [] if rows_out is not None else None
    try:
        with row_progress(sum(len(rows) for _, (rows, _) in tables)) as on_row:
            report = evaluate_tables([(path.name, rows) for path, (rows, _) in tables], constants, on_row, records)
    except (ValueError, OSError) as exc:
        fail(SpecError("--data", first_line(exc)))
    if rows_out is not None and records is not None:
        _write_row_records(rows_out, records)
    if report_rows:
        for _, (_, file_report) in tables:
            # Headers, cells and file names are the file's: every line redacted and escaped for the terminal.
            text = "\n".join(terminal_text(redact(line), one_line=True)
                             for line in file_report.text(max_rows=20).split("\n"))
            # Beside --json on stderr: stdout stays one JSON document.
            (err if as_json else console).print(text, highlight=False, markup=False, emoji=False)
    if as_json:
        print(redact(json.dumps({"files": report["files"], "overall": report["overall"],
                                 "details": report["details"]}, indent=2)))
        return
    console.print(_figures_table("performance model vs measurements", report))
    for name, d in report["details"].items():
        scored = _scored_line(name, report)
        if scored:
            console.print(f"[dim]{markup(redact(scored))}[/]", highlight=False)
        if d["skip_reasons"]:
            reasons = ", ".join(f"{k} ({v})" for k, v in list(d["skip_reasons"].items())[:4])
            console.print(f"[dim]{markup(redact(name))}: skipped — {markup(redact(reasons))}[/]", highlight=False)
        if d.get("mfu_unscored_not_tuned") and name != "overall":
            console.print(f"[dim]{markup(redact(name))}: MFU not scored on {d['mfu_unscored_not_tuned']} rows whose times are "
                          f"not tuned throughput (memory and fit/OOM are)[/]", highlight=False)


@contextmanager
def row_progress(total: int) -> Iterator[Callable[[], None]]:
    """A callback advancing a progress bar of `total` rows on stderr, shown only on a terminal (stdout
    may carry --json): rows with unknown cells are predicted once per plausible value, and a
    20,000-row file of them takes minutes."""
    if not err.is_terminal:
        yield lambda: None
        return
    with Progress(TextColumn("rows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as progress:
        task = progress.add_task("", total=total)
        yield lambda: progress.advance(task)


def _check_fields(fields: list[str]) -> None:
    free = Constants.free_fields()
    unknown = [f for f in dict.fromkeys(fields) if f not in free]
    if unknown:
        # Not a SpecError: its reason is capped at 500 characters, and the list of known names is about that.
        fail(f"--field: not calibratable: {', '.join(unknown)}; known: {', '.join(free)}")


@perf_app.command("calibrate")
def perfmodel_calibrate(
    ctx: typer.Context,
    data: list[Path] = typer.Option(..., "--data", metavar="FILE.csv",
                                    help="Replay CSV file(s) to fit on (more may follow: --data a.csv b.csv)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    out: Optional[Path] = typer.Option(None, "--out", metavar="FILE.json",
                                       help="Write the fitted constants here (JSON)."),
    max_evals: int = typer.Option(40, "--max-evals", parser=whole_number(1, 100_000), metavar="N",
                                  help="Least-squares evaluations (each predicts every row)."),
    field: Optional[list[str]] = typer.Option(None, "--field", metavar="NAME",
                                              help="Fit only these constants (repeatable)."),
    holdout: Optional[list[Path]] = typer.Option(None, "--holdout", metavar="FILE.csv",
                                                 help="Measured rows kept out of the fit; evaluate's figures on "
                                                      "them before and after (more may follow: --holdout a.csv "
                                                      "b.csv)."),
    start: Optional[str] = typer.Option(None, "--start", metavar="defaults|FILE.json",
                                        help="Constants to start from: 'defaults' (uncalibrated) or a JSON file "
                                             "(default: the calibration in use)."),
    prior: float = PriorOption,
) -> None:
    """Fit the model's free constants to measured rows; report evaluate's figures before and after."""
    from optico.perfmodel.calibrate import calibrate, worse_figures

    extra = files_by_option(ctx, more, ("--data", "--holdout"))
    data = [*data, *extra["--data"]]
    holdout = [*(holdout or []), *extra["--holdout"]]
    _check_fields(field or [])
    require_files("--data", data)
    require_files("--holdout", holdout)
    if start == "defaults":
        begin = Constants()
    elif start is not None:
        try:
            begin = read_calibration(Path(start), "--start")
        except SpecError as exc:
            fail(SpecError(exc.field, f"{exc.reason} (or say 'defaults')" if exc.reason.startswith("no such file")
                           else exc.reason))
    else:
        begin = _calibration_in_use()
    _read_tables("--data", data)
    _read_tables("--holdout", holdout)
    out = _output(out, "--out")
    try:
        result = calibrate(data, start=begin, fields=field or None, max_nfev=max_evals, holdout=holdout or None,
                           prior=prior)
    except KeyError as exc:
        fail(SpecError("--field", str(exc.args[0] if exc.args else exc)))
    except ValueError as exc:
        fail(SpecError("--data", first_line(exc)))
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
        try:
            out.parent.mkdir(parents=True, exist_ok=True)  # the folders check_output_path allowed
            result.constants.save(out)
        except OSError as exc:  # changed since the check (a folder removed, a disk full)
            _write_failed(out, "--out", exc)
        console.print(f"constants written to {markup(out)}; select them with {CALIBRATION_ENV}={markup(out)}",
                      highlight=False)
    else:
        console.print("constants not saved: give --out FILE.json to keep them", highlight=False)


@perf_app.command("crossvalidate")
def perfmodel_crossvalidate(
    data: list[Path] = typer.Option(..., "--data", help="Replay CSV files, one source each (at least two)."),
    more: Optional[list[Path]] = MoreFilesArgument,
    max_evals: int = typer.Option(40, "--max-evals", parser=whole_number(1, 100_000),
                                  help="Least-squares evaluations per fold."),
    prior: float = PriorOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Write the figures (and each fold's constants) as JSON."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Leave-one-source-out: fit on every file but one (from the uncalibrated constants), score the one left
    out; figures per held-out file and pooled. Figures fitted on the rows they score do not count."""
    from optico.perfmodel.calibrate import leave_one_source_out

    data = [*data, *(more or [])]
    require_files("--data", data)
    if len(data) < 2:
        fail(SpecError("--data", "leave-one-source-out needs at least two files"))
    names = [path.name for path in data]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        fail(SpecError("--data", f"two files named {twice}: each source is held out and reported by its file name"))
    _read_tables("--data", data)
    out = _output(out, "--out")
    try:
        report = leave_one_source_out(data, max_nfev=max_evals, prior=prior,
                                      progress=lambda name: console.print(f"[dim]fold done: {markup(name)} held "
                                                                          f"out[/]", highlight=False))
    except KeyError as exc:
        fail(SpecError("--data", str(exc.args[0] if exc.args else exc)))
    except ValueError as exc:
        fail(SpecError("--data", first_line(exc)))
    if out:
        with output_file(out, "--out") as handle:
            handle.write(json.dumps(report, indent=2) + "\n")
    if as_json:
        print(redact(json.dumps({"files": report["files"], "overall": report["overall"],
                                 "details": report["details"]}, indent=2)))
        return
    console.print(_figures_table("leave-one-source-out (each file scored by constants fitted without it)", report))

"""Replay CSV files read into typed rows, bounded: every row of a file with a report of what was read
(`read_replay_file`), and a spec's own file checked at load (`check_replay_csv`). A row is read by
`optico.replay_parse`; a bad row is skipped with its file:line reason, never fatal — unless `strict`,
which raises `ReplayError` at the first one."""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from optico.errors import SpecError
from optico.input_files import read_text
from optico.redact import clip
from optico.replay_cells import canonical_header, figure_pair, header_unit
from optico.replay_format import (
    ARCHITECTURE,
    COLUMNS,
    INT_CELLS,
    MEASURED_UNITS,
    ReplayDefaults,
    ReplayError,
    ReplayRow,
)
from optico.replay_measured import IMPOSSIBLE, matches
from optico.replay_parse import FIRST_OF_PAIR, parse_row

# Bounds on a replay CSV, wherever it is read (a spec's launcher.data, --data, --landscape).
MAX_CSV_BYTES = 8 * 1024 * 1024  # 8x the largest published table we ship
MAX_CSV_ROWS = 20_000  # 30x the largest published table; parsing a row costs ~0.2 ms (20,000: ~4 s)
# A cell longer than this is no table's: its row is malformed, and the cell is not parsed (a cell may
# hold 128 KiB, and reading figures out of a long run of digits or spaces grows with its square).
MAX_CELL_CHARS = 256  # the longest shipped configuration or measurement cell: 136
MAX_TEXT_CELL_CHARS = 8192  # source and notes; the longest shipped: 1,620 (a run's arguments)
_TEXT_COLUMNS = frozenset({"source", "notes"})


# A cell quoted in a reason ("fsdp '1 (0)': ..."): its text is the row's, not the kind of problem.
_QUOTED_CELL = re.compile(r"""\s*(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")


def reason_kind(reason: str) -> str:
    """A skip reason's kind, to count rows by: its first clause up to a colon or a parenthesis, without
    the cells it quotes ("fsdp '1 (0)': Megatron-FSDP ..." -> 'fsdp'; it read "fsdp '1")."""
    return _QUOTED_CELL.sub("", reason.split(";")[0]).split(":")[0].split(" (")[0].strip()


@dataclass
class FileReport:
    """What was read from one file."""

    file: str
    rows: int = 0
    read: int = 0
    complete: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)  # skip reason (first clause) -> rows
    unknown: Counter = field(default_factory=Counter)  # cell -> rows where it is unknown
    inferred: Counter = field(default_factory=Counter)  # what was derived -> rows
    missing_columns: list[str] = field(default_factory=list)
    renamed_columns: dict[str, str] = field(default_factory=dict)  # header as written -> replay column
    ignored_columns: list[str] = field(default_factory=list)
    # A second header naming a column already read (the first is kept): header as written -> column.
    repeated_columns: dict[str, str] = field(default_factory=dict)
    skipped_rows: list[str] = field(default_factory=list)  # "file:line: reason"
    hardware_flops: int = 0  # rows read whose TFLOP/s count the recompute pass (see counts_recompute)
    full_attention: int = 0  # rows read whose TFLOP/s count attention without its mask (counts_full_attention)

    def add(self, row: ReplayRow) -> None:
        self.rows += 1
        if row.read:
            self.read += 1
            self.hardware_flops += int(row.counts_recompute and row.strategy is not None
                                       and row.strategy.recompute == "full"
                                       and (row.tflops_per_gpu is not None or row.mfu is not None))
            self.full_attention += int(row.counts_full_attention and not row.step_time_s
                                       and (row.tflops_per_gpu is not None or row.mfu is not None))
            self.complete += int(not row.unknown)
            self.unknown.update(row.unknown.keys())
        else:
            self.skipped += 1
            self.reasons[reason_kind(row.skip_reason)] += 1
            self.skipped_rows.append(f"{row.where}: {row.skip_reason}")
        self.inferred.update(_QUOTED_CELL.sub("", x) for x in row.inferred)  # counted by kind, not by cell

    def text(self, max_rows: int = 5) -> str:
        lines = [f"{self.file}: {self.rows} rows, {self.read} read ({self.complete} complete, "
                 f"{self.read - self.complete} with unknown cells), {self.skipped} skipped"]
        if self.renamed_columns:
            lines.append("  columns read as: " + ", ".join(f"{a!r} -> {b}" for a, b in self.renamed_columns.items()))
        if self.missing_columns:
            lines.append("  columns absent (read as empty): " + ", ".join(self.missing_columns))
        if self.repeated_columns:
            lines.append("  columns read twice (the first kept, these ignored): "
                         + ", ".join(f"{a!r} -> {b}" for a, b in self.repeated_columns.items()))
        if self.ignored_columns:
            lines.append("  columns ignored: " + ", ".join(self.ignored_columns))
        if self.unknown:
            lines.append("  unknown cells: " + ", ".join(f"{k} ({n})" for k, n in self.unknown.most_common()))
        if self.hardware_flops:
            lines.append(f"  TFLOP/s and MFU read as hardware FLOPs (the recompute pass counted, as the source or "
                         f"notes say) on {self.hardware_flops} rows")
        if self.full_attention:
            lines.append(f"  TFLOP/s and MFU brought to the causal attention count (the source's software counted the "
                         f"whole score matrix) on {self.full_attention} rows")
        if self.inferred:
            lines.append("  derived or assumed: " + "; ".join(f"{clip(k, 100)} ({n})"
                                                           for k, n in self.inferred.most_common(8)))
        for reason, n in self.reasons.most_common():
            lines.append(f"  skipped {n}: {reason}")
        lines += [f"    {x}" for x in self.skipped_rows[:max_rows]]
        if len(self.skipped_rows) > max_rows:
            lines.append(f"    ... {len(self.skipped_rows) - max_rows} more")
        return "\n".join(lines)


def read_replay_file(path: str | Path, defaults: ReplayDefaults | None = None, *, strict: bool = False
                     ) -> tuple[list[ReplayRow], FileReport]:
    """Every row of a replay CSV, skipped ones included (see `ReplayRow.skip_reason`), and the file's
    report. Headers are matched by synonym ('TP', 'Micro Batch Size'); absent columns read as empty.

    Raises ReplayError when the file has no model column nor any architecture column (not a replay
    table), and with `strict` at the first row that is skipped, naming file:line and the reason."""
    path = Path(path)
    defaults = defaults or ReplayDefaults()
    try:  # bounded, a regular file, UTF-8 without NULs: a CSV swapped for /dev/zero or a FIFO since the spec
        text = read_text(path, "", "replay CSV", MAX_CSV_BYTES)  # was checked must not hang the launcher
    except SpecError as exc:
        raise ReplayError(exc.reason) from None
    try:
        return _read_rows(path, text, defaults, strict)
    except csv.Error as exc:  # a cell beyond csv's field limit (128 KiB)
        raise ReplayError(f"{path}: not a readable CSV: {exc}") from None


def _memory_measure(header: str) -> Literal["", "allocated", "reserved"]:
    """'Max memory allocated (MiB)' -> allocated; 'max_memory_reserved' -> reserved; else unsaid."""
    words = header.lower()
    return "allocated" if "allocated" in words else "reserved" if "reserved" in words else ""


def _delimiter(text: str) -> tuple[str, bool]:
    """(the table's delimiter, whether a first line declares it): Excel's `sep=X` first line, else
    whichever of semicolon, tab and comma its first line holds most outside quotes (a comma when it
    holds none: a one-column file). Tables saved in a locale with decimal commas use semicolons; exports from a
    spreadsheet's 'text' format, tabs."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    declared = re.fullmatch(r"\s*sep=([,;\t|])\s*", first, re.IGNORECASE)
    if declared:
        return declared.group(1), True
    outside = re.sub(r'"[^"]*"', "", first)
    counts = {d: outside.count(d) for d in (";", "\t", ",")}
    most = max(counts.values())
    # A tie goes to the semicolon or the tab: a semicolon table leaves the commas of its headers
    # ("step time (s, mean)") unquoted.
    return (next(d for d, n in counts.items() if n == most) if most else ","), False


def _table_reader(handle: io.StringIO, text: str) -> tuple[Any, str]:
    """(a csv.reader over `handle` with `text`'s delimiter, past an Excel `sep=;` first line; the delimiter)."""
    delimiter, declared = _delimiter(text)
    reader = csv.reader(handle, delimiter=delimiter)
    if declared:
        next((record for record in reader if record), None)
    return reader, delimiter


def _read_rows(path: Path, text: str, defaults: ReplayDefaults, strict: bool) -> tuple[list[ReplayRow], FileReport]:
    report = FileReport(file=path.name)
    rows: list[ReplayRow] = []
    with io.StringIO(text, newline="") as handle:
        # csv.reader, not DictReader: it yields blank lines (so file:line stays right after them) and
        # leaves a record's extra fields visible (an unquoted "4,064" shifts every cell after it).
        reader, delimiter = _table_reader(handle, text)
        header = next((record for record in reader if record), [])
        columns: list[str | None] = []  # per field of a record: its replay column, or None
        units: dict[str, str] = {}
        memory_measure = ""
        for h in header:
            column = canonical_header(h)
            if column is not None and column in columns:
                if strict:
                    first = header[columns.index(column)]
                    raise ReplayError(f"{path}: columns {first!r} and {h!r} both read as {column}; keep one")
                report.repeated_columns[h] = column
                columns.append(None)
                continue
            if column is None:
                report.ignored_columns.append(h)
                columns.append(None)
                continue
            columns.append(column)
            units[column] = header_unit(h)
            if column == "mem_max_gib":
                memory_measure = _memory_measure(h)
            if h != column:
                report.renamed_columns[h] = column
        known = set(columns) - {None}
        if "model" not in known and not known & set(ARCHITECTURE):
            shown = ", ".join(header)[:300] or "no header"
            raise ReplayError(f"{path}: not a replay table: no model or architecture column among the "
                              f"{len(header)} column(s) read with the delimiter {delimiter!r}: {shown} "
                              f"(docs/perfmodel.md, 'Reading measured tables')")
        report.missing_columns = [c for c in COLUMNS if c not in known]
        while True:
            start = reader.line_num + 1
            record = next(reader, None)
            if record is None:
                break
            if not any(cell.strip() for cell in record):
                continue  # a blank line
            cells = {column: value for column, value in zip(columns, record) if column is not None}
            too_long = _blank_long_cells(cells)
            for row in _runs_of(cells, path.name, start, defaults, units):
                if len(rows) >= MAX_CSV_ROWS:
                    raise ReplayError(f"{path}: more than {MAX_CSV_ROWS:,} rows; a replay CSV may have at most that")
                rows.append(_checked(row, record, header, memory_measure, strict, too_long))
                report.add(rows[-1])
    return rows, report


def _blank_long_cells(cells: dict[str, str]) -> list[str]:
    """Empties each cell over its length bound, in place; says which were, and how long."""
    out = []
    for column, value in cells.items():
        bound = MAX_TEXT_CELL_CHARS if column in _TEXT_COLUMNS else MAX_CELL_CHARS
        if len(value) > bound:
            cells[column] = ""
            out.append(f"{column} cell of {len(value):,} characters: longer than a table's (at most {bound:,})")
    return out


def _checked(row: ReplayRow, record: list[str], header: list[str], memory_measure: str, strict: bool,
             too_long: list[str]) -> ReplayRow:
    """`row` with what its record's shape says: more fields than the header (shifted cells) or a cell
    too long to be a table's skip it, fewer mark it malformed; with `strict` a row that cannot be used
    is an error."""
    if memory_measure:
        row = row.model_copy(update={"memory_measure": memory_measure})
    wrong = too_long.copy()
    if any(cell.strip() for cell in record[len(header):]):  # empty ones: a trailing comma, harmless
        wrong.append(f"{len(record)} fields against the header's {len(header)} (an unquoted comma in a "
                     f"cell shifts every cell after it)")
    if wrong:
        row = row.model_copy(update={"skip_reason": "; ".join(filter(None, [*wrong, row.skip_reason])),
                                     "malformed": [*wrong, *row.malformed]})
    elif len(record) < len(header):  # read with its missing cells unknown, but not a whole record
        row = row.model_copy(update={"malformed": [
            f"{len(record)} fields against the header's {len(header)} (a row cut short, or a quote "
            f"left open)", *row.malformed]})
    if strict and not row.read:
        raise ReplayError(f"{row.where}: {row.skip_reason}")
    return row


# The cells that say what a run measured, and those that say what ran: only these pair two runs
# (a model name 'Llama3 (8B)' is one name).
_MEASUREMENTS = frozenset({*MEASURED_UNITS, "tflops_per_gpu", "tokens_per_s_per_gpu"})
_LAYOUT_COUNTS = frozenset({*INT_CELLS, "fsdp"})


def _runs_of(cells: dict[str, str], file: str, line: int, defaults: ReplayDefaults, units: dict[str, str]
             ) -> list[ReplayRow]:
    """The row, or two when a configuration cell pairs two runs (NeMo's summaries: FSDP '1 (0)', TP
    '1 (2)', tokens/s '4066 (2605)'): the first run's figures, then the second's — each paired cell's
    figure in parentheses, the cells it shares, and none of the first run's single measurements (a
    step time given once belongs to the first). Measurements alone paired, or layout cells pairing a
    figure with itself, are one configuration measured twice: one row, its first figures."""
    paired = {column: found for column, cell in cells.items()
              if column in _MEASUREMENTS | _LAYOUT_COUNTS and (found := figure_pair(cell or ""))}
    first = parse_row(cells, file, line, defaults, units)
    if all(paired[c][0] == paired[c][1] for c in paired.keys() & _LAYOUT_COUNTS):
        return [first]  # no layout cell differs between the runs (or none pairs): one configuration
    second = {column: paired[column][1] if column in paired else "" if column in _MEASUREMENTS else cell
              for column, cell in cells.items()}
    row = parse_row(second, file, line, defaults, units)
    said = [note.replace(FIRST_OF_PAIR, "the figure of the first run (the second run is the next row)")
            for note in first.inferred]
    return [first.model_copy(update={"inferred": said}),
            row.model_copy(update={"inferred": ["the second run of its paired cells (the figures in parentheses)",
                                                *row.inferred]})]


def read_replay_csv(path: str | Path, defaults: ReplayDefaults | None = None, *, strict: bool = False
                    ) -> list[ReplayRow]:
    """Every row of a replay CSV (see `read_replay_file`)."""
    return read_replay_file(path, defaults, strict=strict)[0]


def check_replay_csv(path: Path, workload, space, field: str = "launcher.data") -> None:
    """Reads the replay CSV at spec load and refuses what the replay launcher would choke on or
    silently trust: a file that is not the format, a row it cannot parse, no usable row for this
    workload, none inside the search space, or a measurement impossible on the declared GPU
    (MFU above 100 % of its peak, peak memory above its capacity, a time or rate that is not
    positive). Errors name the file and, for a row, its line."""
    text = read_text(path, field, "replay CSV", MAX_CSV_BYTES)
    try:
        records, _ = _table_reader(io.StringIO(text, newline=""), text)  # as the reader reads it; "\r" ends a line too
        header = next(records, [])
        # Blank lines are no rows (the reader skips them): a file padded with them was refused here.
        count = sum(1 for _ in itertools.islice((r for r in records if any(c.strip() for c in r)), MAX_CSV_ROWS + 1))
    except csv.Error as exc:
        raise SpecError(field, f"{path.name} is not a CSV file: {exc}") from None
    if count > MAX_CSV_ROWS:
        raise SpecError(field, f"{path.name} has more than {MAX_CSV_ROWS:,} rows; a replay CSV may have at most "
                               f"{MAX_CSV_ROWS:,}")
    named = {canonical_header(h) for h in header}  # 'Model', 'TP' as the reader takes them
    present = [c for c in COLUMNS if c in named]
    if not present:
        raise SpecError(field, f"{path.name} is not a replay CSV: its first line names none of the format's "
                               f"columns ({', '.join(COLUMNS[:4])}, ...; see docs/launchers.md)")
    try:  # the text already read, not the file again
        rows, report = _read_rows(path, text, ReplayDefaults(), strict=False)
    except (ValueError, csv.Error) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecError(field, reason.replace(str(path), path.name)) from None
    if report.repeated_columns:  # which of the two a spec's own file means is not for the reader to guess
        header_text, column = next(iter(report.repeated_columns.items()))
        raise SpecError(field, f"{path.name}: column {header_text!r} is read as {column} a second time; keep one")
    # The tolerant reading skips a wrong row (published tables have them); a spec's own file must not:
    # a cell that is no count or no result, or a row shifted by an unquoted comma, is a broken file.
    broken = next((r for r in rows if r.malformed), None)
    if broken is not None:
        raise SpecError(field, f"{broken.where}: {broken.malformed[0]}")
    # A row of this workload whose numbers no GPU produces is a mistake in the table, not a row to skip.
    impossible = next((r for r in rows if (r.skip_reason or "").startswith(IMPOSSIBLE) and r.workload is not None
                       and matches(r, workload)), None)
    if impossible is not None:
        raise SpecError(field, f"{impossible.where}: {(impossible.skip_reason or '').removeprefix(IMPOSSIBLE + ': ')}")
    measuring = [r for r in rows if r.usable and matches(r, workload)]
    if not measuring:
        usable = sum(r.usable for r in rows)
        raise SpecError(field, f"{path.name}: none of its {len(rows)} rows ({usable} usable) measures this "
                               f"workload ({workload.describe()})")
    if not any(space.contains(r.strategy) for r in measuring):
        raise SpecError(field, f"{path.name}: none of the {len(measuring)} configurations it measures for this "
                               f"workload lies inside the search space")

"""Reading a measurement series from a text file.

Format: one row per measurement, ``timestamp,value``; a header line is optional. Timestamps are
ISO 8601 (``2023-08-21T10:00:00Z``, ``2023-08-21 10:00:00``, with or without an offset; naive
times are taken as UTC), ``dd/mm/YYYY HH:MM`` (RIPE Atlas exports) or Unix epoch seconds. The
separator is ``,``; ``;`` and tab are accepted too. Extra columns are kept as text
(:attr:`Series.extra`), e.g. the hand-labelled change points of ``rtt-changes/``.

A table with a header row is read by its header: an ``iepm export --format csv`` (or TSV)
table, whose value is the column ``column`` names or else the first of ``prefer`` it has (the CLI
passes the metrics the monitor watches); rows of failed runs and empty cells are left out, and the
rows must be of one path (monitor → target). Quoted cells are read as CSV.

Bad input raises :class:`AnalysisError` naming the file and the line:

- bytes that are not UTF-8 (line and column of the first);
- an empty file, or fewer than ``min_rows`` data rows;
- a value that is not a number, or is NaN/inf;
- a timestamp that cannot be read, that goes backwards (unsorted) or repeats an earlier one;
- an all-zero series (almost always a broken export; pass ``allow_all_zero=True`` to accept it).

``check_order=False`` keeps rows in file order even when a timestamp repeats or goes back a little:
labelled traces whose row indices matter (RIPE Atlas exports, rounded to the minute) need it.

Blank lines and lines starting with ``#`` are skipped.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack

from iepm import utf8
from iepm.errors import AnalysisError

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Series:
    """A time series: ``t`` Unix seconds (UTC), increasing unless read with ``check_order=False``;
    ``y`` finite values; ``lines`` the file line of each row."""

    t: FloatArray
    y: FloatArray
    source: str = "<memory>"
    lines: tuple[int, ...] = ()
    extra: tuple[tuple[str, ...], ...] = field(default=(), repr=False)

    def __len__(self) -> int:
        return int(self.y.size)

    def timestamp(self, i: int) -> str:
        """Row ``i``'s time as ISO 8601 UTC (``2023-08-21T10:00:00Z``)."""
        return iso(float(self.t[i]))


def iso(t: float) -> str:
    """ISO 8601 UTC for Unix seconds; the bare number when the year leaves 1–9999."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, ValueError, OSError):
        return repr(t)


def parse_time(text: str) -> float | None:
    """Unix seconds for one timestamp field, or None when it is not a timestamp."""
    s = text.strip()
    if not s:
        return None
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        # Bare numbers are epoch seconds; small ones (a row number, a year) are not timestamps.
        return value if 1e8 <= value < 1e11 else None
    for fmt in ("%d/%m/%Y %H:%M", "%d/%m/%Y %H:%M:%S"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _split(line: str) -> list[str]:
    for sep in (",", ";", "\t"):
        if sep in line:
            return [part.strip() for part in line.split(sep)]
    return [line.strip()]


# The columns of an `iepm export` table that are not measurements.
EXPORT_COLUMNS = ("started_at", "monitor", "target", "target_address", "outcome")


def parse_series(
    text: str,
    source: str = "<text>",
    *,
    min_rows: int = 2,
    allow_all_zero: bool = False,
    check_order: bool = True,
    column: str | None = None,
    prefer: Sequence[str] = (),
    monitor: str | None = None,
) -> Series:
    """Parse the text of a series file; see the module docstring for the format and errors.

    ``column`` names the value column of a file with a header (an ``iepm export`` table, say);
    without it, an export table's value is the first of ``prefer`` that it has. ``monitor``:
    only that monitor's rows of an export table (one target measured from several)."""
    rows = _Rows(source, check_order)
    table = _table_header(text, column)
    if table is not None:
        rows.read_table(text, *table, column=column, prefer=prefer, monitor=monitor)
    elif column is not None:
        raise AnalysisError(f"{source}: --column {column!r} needs a header row naming the columns")
    else:
        rows.read_plain(text)
    if not rows.values:
        raise AnalysisError(f"{source}: no data rows (expected 'timestamp,value' lines)")
    y = np.asarray(rows.values, dtype=np.float64)
    if not allow_all_zero and not np.any(y):
        raise AnalysisError(f"{source}: every value is zero; nothing to analyse")
    if len(rows.values) < min_rows:
        raise AnalysisError(
            f"{source}: only {len(rows.values)} data row(s); at least {min_rows} are needed"
        )
    return Series(
        np.asarray(rows.times, dtype=np.float64),
        y,
        source,
        tuple(rows.lines),
        tuple(rows.extra),
    )


class _Rows:
    """The rows read so far, with the checks every row passes whatever the file's layout."""

    def __init__(self, source: str, check_order: bool) -> None:
        self.source = source
        self.check_order = check_order
        self.times: list[float] = []
        self.values: list[float] = []
        self.lines: list[int] = []
        self.extra: list[tuple[str, ...]] = []

    def add(
        self,
        lineno: int,
        time_text: str,
        value_text: str,
        extra: tuple[str, ...] = (),
        t: float | None = None,
    ) -> None:
        source = self.source
        t = parse_time(time_text) if t is None else t
        if t is None:
            raise AnalysisError(f"{source}:{lineno}: cannot read timestamp {time_text[:80]!r}")
        try:
            value = float(value_text)
        except ValueError:
            raise AnalysisError(
                f"{source}:{lineno}: value {value_text[:80]!r} is not a number"
            ) from None
        if not math.isfinite(value):
            raise AnalysisError(f"{source}:{lineno}: value {value_text!r} is not finite")
        if self.times and self.check_order and t <= self.times[-1]:
            what = "repeats the timestamp of" if t == self.times[-1] else "is earlier than"
            raise AnalysisError(
                f"{source}:{lineno}: timestamp {time_text!r} {what} line {self.lines[-1]}"
                " (rows must be sorted by time, without duplicates)"
            )
        self.times.append(t)
        self.values.append(value)
        self.lines.append(lineno)
        self.extra.append(extra)

    def read_plain(self, text: str) -> None:
        """``timestamp,value[,extra…]`` rows, an optional header line first."""
        first_content = True
        for lineno, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip().lstrip("\ufeff")
            if not line or line.startswith("#"):
                continue
            fields = _split(line)
            is_first, first_content = first_content, False
            value_text = fields[1] if len(fields) > 1 else ""
            t = parse_time(fields[0])
            if t is None and is_first and not _is_number(value_text):
                continue  # a header such as "timestamp,value"
            if t is not None and len(fields) < 2:
                raise AnalysisError(
                    f"{self.source}:{lineno}: expected 'timestamp,value', got {line[:80]!r}"
                )
            self.add(lineno, fields[0], value_text, tuple(fields[2:]), t)

    def read_table(
        self,
        text: str,
        delimiter: str,
        header_line: int,
        header: list[str],
        *,
        column: str | None,
        prefer: Sequence[str],
        monitor: str | None = None,
    ) -> None:
        """A table with a header row, read as CSV (quoted cells may hold separators and line
        breaks, as ``iepm export --format csv`` writes them). Rows of failed runs and empty
        cells are not measurements and are left out; one path per series."""
        source = self.source
        chosen = column or next((c for c in prefer if c in header), None)
        if chosen is None and "value" in header:
            chosen = "value"
        if chosen not in header:
            numeric = [c for c in header if c not in EXPORT_COLUMNS and c != "error"]
            wanted = f"no column {column!r}" if column else "which column is the series?"
            raise AnalysisError(
                f"{source}:{header_line}: {wanted} Choose one with --column: "
                + ", ".join(numeric)[:400]
            )
        assert chosen is not None
        value_at = header.index(chosen)
        time_at = header.index("started_at") if "started_at" in header else 0
        outcome_at = header.index("outcome") if "outcome" in header else None
        path_at = [header.index(c) for c in ("monitor", "target") if c in header]
        if monitor is not None and "monitor" not in header:
            raise AnalysisError(f"{source}:{header_line}: --monitor needs a 'monitor' column")
        monitor_at = header.index("monitor") if monitor is not None else None
        path: tuple[str, ...] | None = None
        for lineno, row in _csv_rows(text, delimiter, header_line, source):
            cells = [cell.strip() for cell in row]
            if not any(cells) or cells[0].startswith("#"):
                continue
            cell = cells[value_at] if value_at < len(cells) else ""
            if outcome_at is not None and cells[outcome_at : outcome_at + 1] != ["ok"]:
                continue
            if monitor_at is not None and cells[monitor_at : monitor_at + 1] != [monitor]:
                continue
            if not cell:
                continue
            here = tuple(cells[i] for i in path_at if i < len(cells))
            if path is None:
                path = here
            elif here != path:
                raise AnalysisError(
                    f"{source}:{lineno}: rows of more than one path ({' → '.join(path)}, then "
                    f"{' → '.join(here)}); export one target at a time (--target), or pick one "
                    "monitor (--monitor)"
                )
            self.add(lineno, cells[time_at] if time_at < len(cells) else "", cell)


def _table_header(text: str, column: str | None) -> tuple[str, int, list[str]] | None:
    """(delimiter, line, names) when the file is a table read by its header: an ``iepm export``
    table (``started_at`` … ``outcome`` columns), or any header when ``column`` is given."""
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip().lstrip("\ufeff")
        if not line or line.startswith("#"):
            continue
        delimiter = next((sep for sep in (",", ";", "\t") if sep in line), ",")
        try:
            names = next(csv.reader([line], delimiter=delimiter), [])
        except csv.Error:  # a stray carriage return: not a header, let the plain reader say why
            return None
        names = [name.strip() for name in names]
        export = "started_at" in names and "outcome" in names
        if export or (column is not None and parse_time(names[0] if names else "") is None):
            return delimiter, lineno, names
        return None
    return None


def _csv_rows(
    text: str, delimiter: str, header_line: int, source: str
) -> Iterator[tuple[int, list[str]]]:
    """Rows after the header with the file line each starts on."""
    lines = text.split("\n")[header_line:]
    consumed: list[int] = []

    def feed() -> Iterator[str]:
        for number, line in enumerate(lines, start=header_line + 1):
            consumed.append(number)
            yield line.removesuffix("\r") + "\n"

    # TSV exports escape tabs and line breaks instead of quoting: a '"' there is just a character.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(feed(), delimiter=delimiter, quoting=quoting)
    while True:
        start = len(consumed)
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            line = consumed[-1] if consumed else header_line
            raise AnalysisError(f"{source}:{line}: {exc}") from None
        yield (consumed[start] if start < len(consumed) else header_line), row


class ReadOptions(TypedDict, total=False):
    """:func:`parse_series`'s keyword options, which :func:`read_series` passes on."""

    min_rows: int
    allow_all_zero: bool
    check_order: bool
    column: str | None
    prefer: Sequence[str]
    monitor: str | None


def read_series(path: str | Path, **options: Unpack[ReadOptions]) -> Series:
    """Read a series file; raises :class:`AnalysisError` (never another exception) on bad input."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise AnalysisError(f"{p}: cannot read: {exc.strerror or exc}") from None
    return parse_series(utf8.decode(data, str(p), AnalysisError), str(p), **options)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True

"""Export one probe's results as a table (TSV, CSV) or as envelopes (JSON Lines).

TSV is in the style of the IEPM-BW tables: ``#`` lines first, documenting the selection and every
column, then a header row, then one row per result. Cells never contain a tab or a line break:
backslash, tab, newline and carriage return are written ``\\\\``, ``\\t``, ``\\n``, ``\\r``.
CSV follows RFC 4180 (the ``csv`` module quotes as needed) with only a header row, since
spreadsheets choke on comment lines. In both, the common columns come first, then the probe's
own; a missing value is an empty cell, a float has 6 significant digits (never an exponent) and
a boolean is 1 or 0. JSON Lines carries the whole envelope of each result, one per line.

Rows are streamed from the archive and written as they come.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Literal, TextIO

from iepm.probes.base import Column
from iepm.results import Result, format_time
from iepm.store.archive import Archive

Format = Literal["tsv", "csv", "json"]

COMMON_COLUMNS = [
    Column("started_at", "start of the run, UTC, ISO 8601"),
    Column("monitor", "monitoring host that ran the probe"),
    Column("target", "target name"),
    Column("target_address", "address the probe was sent to"),
    Column("outcome", "ok, failed, timeout or skipped"),
    Column("duration_s", "wall-clock duration of the run, seconds"),
    Column("error", "why the run failed, empty when it succeeded"),
]
SIGNIFICANT_DIGITS = 6
TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def format_number(value: float) -> str:
    """``value`` with 6 significant digits in plain decimal notation (the integer part is never
    rounded away): 40.1235, 9412345679, 0.000123457; empty when not finite."""
    text = f"{value:.{SIGNIFICANT_DIGITS}g}"
    if "e" not in text and "n" not in text:  # the common case: no exponent, finite
        return text
    if not math.isfinite(value):
        return ""
    magnitude = math.floor(math.log10(abs(value))) + 1
    text = f"{value:.{max(0, SIGNIFICANT_DIGITS - magnitude)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_cell(value: Any, text: Callable[[str], str]) -> str:
    """A cell for any ``data`` value; ``text`` escapes strings for the format."""
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, str):
        return text(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    # A declared column holding a list or object: keep it whole, compact JSON.
    return text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def row_cells(result: Result, columns: Iterable[Column], text: Callable[[str], str]) -> list[str]:
    cells = [
        format_time(result.started_at),
        text(result.monitor),
        text(result.target),
        format_cell(result.target_address, text),
        result.outcome.value,
        format_number(result.duration_s),
        format_cell(result.error, text),
    ]
    data = result.data
    cells += [format_cell(data.get(column.name), text) for column in columns]
    return cells


def escape_tsv(value: str) -> str:
    return value.translate(TSV_ESCAPES)


def verbatim(value: str) -> str:
    return value


def export(
    archive: Archive,
    probe: str,
    columns: Sequence[Column],
    fmt: Format,
    out: TextIO,
    target: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> int:
    """Write the results of ``probe`` (optionally one ``target``, ``since`` inclusive, ``until``
    exclusive), oldest first, to ``out``; ``columns`` are the probe's scalar ``data`` fields.
    Returns the number of results written. For CSV, open ``out`` with ``newline=""``."""
    clashes = {column.name for column in columns} & {column.name for column in COMMON_COLUMNS}
    if clashes:
        raise ValueError(
            f"columns of probe {probe} clash with the common columns: {', '.join(sorted(clashes))}"
        )
    if fmt not in ("tsv", "csv", "json"):
        raise ValueError(f"unknown export format {fmt!r} (tsv, csv or json)")
    results = archive.results(probe=probe, target=target, since=since, until=until)
    every = [*COMMON_COLUMNS, *columns]
    count = 0
    if fmt == "tsv":
        selection = [f"probe={probe}", f"target={target or 'all'}"]
        selection += [f"since={format_time(since)}"] if since else []
        selection += [f"until={format_time(until)}"] if until else []
        out.write(f"# iepm results: {' '.join(selection)}\n")
        out.write("# empty cell: no value; backslash, tab, newline, CR written \\\\ \\t \\n \\r\n")
        out.writelines(f"# {column.name}: {column.description}\n" for column in every)
        out.write("\t".join(column.name for column in every) + "\n")
        for result in results:
            out.write("\t".join(row_cells(result, columns, escape_tsv)) + "\n")
            count += 1
    elif fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(column.name for column in every)
        for result in results:
            writer.writerow(row_cells(result, columns, verbatim))
            count += 1
    else:
        for result in results:
            out.write(json.dumps(result.envelope(), ensure_ascii=False, separators=(",", ":")))
            out.write("\n")
            count += 1
    return count

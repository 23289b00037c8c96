"""What a page is made of: tables (downloadable as CSV/TSV) and the charts drawn from them.

Every number a page shows is in one of its tables, so what a person reads, what they download
and what the tests check are the same numbers. A table's rows are named tuples whose fields are
its columns (checked when the table is made); cells keep their type (datetime, float, Month)
until they are written.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, NamedTuple

import numpy as np
from fastapi import HTTPException
from fastapi.responses import Response

from iepm.export import escape_tsv, format_cell, format_number, verbatim
from iepm.probes.base import Column
from iepm.results import format_time

HISTORY = timedelta(days=28)
YEAR = timedelta(days=365)
# Alerts and studies shown on a page (the API pages through all of them).
PAGE_ROWS = 50
TSV_NOTE = "# empty cell: no value; backslash, tab, newline, CR written \\\\ \\t \\n \\r\n"


@dataclass(frozen=True)
class Month:
    """A UTC calendar month: written ``YYYY-MM``, plotted at its first instant."""

    start: datetime

    def __str__(self) -> str:
        return self.start.strftime("%Y-%m")


@dataclass
class Table:
    """A downloadable table; column names carry their units, as in ``iepm export``."""

    name: str
    title: str
    columns: list[Column]
    rows: Sequence[tuple[Any, ...]]

    def __post_init__(self) -> None:
        # Typed rows: a named tuple's fields are the columns, in order.
        names = tuple(c.name for c in self.columns)
        for row in self.rows[:1]:
            fields = getattr(row, "_fields", None)
            # A field named like a keyword ("from") ends with "_".
            if fields is not None and tuple(f.rstrip("_") for f in fields) != names:
                raise ValueError(f"table {self.name}: row fields {fields} are not {names}")

    def render(self, fmt: Literal["csv", "tsv"], selection: str) -> str:
        out = io.StringIO(newline="")
        names = [c.name for c in self.columns]
        if fmt == "tsv":
            out.write(f"# iepm {self.title}: {selection}\n")
            out.write(TSV_NOTE)
            out.writelines(f"# {c.name}: {c.description}\n" for c in self.columns)
            out.write("\t".join(names) + "\n")
            for row in self.rows:
                out.write("\t".join(_cell(v, escape_tsv) for v in row) + "\n")
        else:
            writer = csv.writer(out)
            writer.writerow(names)
            writer.writerows([_cell(v, verbatim) for v in row] for row in self.rows)
        return out.getvalue()


def _cell(value: Any, text: Any) -> str:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, Month):
        return str(value)
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, np.integer):
        value = int(value)
    return format_cell(value, text)


def cell_text(value: Any) -> str:
    """A table cell as the CSV download writes it, so page and download agree."""
    if isinstance(value, datetime):
        return format_time(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return format_number(value)
    return str(value)


# Units read from a column's name: its last or second-to-last word ("rtt_avg_ms",
# "throughput_bps_max"); names with none ("count", "success_rate") stay plain numbers.
UNIT_WORDS = ("bps", "ms", "s", "bytes", "percent")
# Columns in the unit of their row's metric ("ping.rtt_avg_ms"), in tables with a metric column.
IN_METRIC_UNIT = frozenset(
    ("value", "before", "after", "reference", "median", "p25", "p75", "iqr", "mean", "stdev")
)


def unit_word(name: str) -> str | None:
    words = name.rsplit(".", 1)[-1].split("_")
    return next((w for w in reversed(words[-2:]) if w in UNIT_WORDS), None)


def significant(value: float, digits: int = 3) -> str:
    """``value`` to ``digits`` significant digits, never in exponent form: 94.3, 0.1, 1480."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = min(6, max(0, digits - 1 - math.floor(math.log10(abs(value)))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _scaled(value: float, steps: tuple[tuple[float, str], ...], base: str) -> str:
    for scale, unit in steps:
        if abs(value) >= scale:
            return f"{significant(value / scale)} {unit}"
    return f"{significant(value)} {base}"


def human(value: float | None, name: str) -> str:
    """A number as people read it, by the unit in its name: 94.3 Mbit/s, 12.4 ms, 0.1 %,
    4 MiB; a name without a unit gives the number to 4 significant digits."""
    if value is None or not math.isfinite(value):
        return "–"
    unit = unit_word(name)
    if unit == "bps":
        return _scaled(value, ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")), "bit/s")
    if unit == "bytes":
        return _scaled(value, ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")), "B")
    if unit == "s":
        # Ages of hours read better in hours (from 2 h), of days in days (from 2 d).
        for divisor, word in ((86400.0, "d"), (3600.0, "h")):
            if abs(value) >= 2 * divisor:
                return f"{significant(value / divisor)} {word}"
        return f"{significant(value)} s"
    if unit == "ms":
        return f"{significant(value)} ms"
    if unit == "percent":
        return f"{significant(value)} %"
    return significant(value, 4)


def shown_cells(table: Table, row: tuple[Any, ...]) -> list[tuple[str, str | None]]:
    """A row's cells as a page shows them: (text, raw) where a number with a unit is written
    for people ("94.3 Mbit/s") and ``raw`` is the download's text of it (None when the page
    writes the download's text itself)."""
    names = [c.name for c in table.columns]
    where = names.index("metric") if "metric" in names else len(row)
    metric = row[where] if where < len(row) else None
    out: list[tuple[str, str | None]] = []
    for i, value in enumerate(row):
        name = names[i] if i < len(names) else ""  # a row is its columns (plain rows unchecked)
        unit_of = metric if name in IN_METRIC_UNIT and isinstance(metric, str) else name
        number = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        if number and unit_word(unit_of) is not None and math.isfinite(float(value)):
            out.append((human(float(value), unit_of), _cell(value, verbatim)))
        else:
            out.append((cell_text(value), None))
    return out


class Series(NamedTuple):
    label: str
    values: Sequence[float | None]
    axis: int = 1  # 2, 3: extra y axes (other units)


@dataclass
class Chart:
    """A uPlot chart: ``x`` (epoch seconds for time charts) and one list per series."""

    id: str
    title: str
    kind: Literal["time", "bars", "line", "scatter", "smoke"]
    x: Sequence[float]
    series: list[Series]
    table: str
    x_label: str = "time (UTC)"
    events: list[float] = field(default_factory=list)
    # Step-change alerts of the plotted metrics: (change epoch s, "metric up|down cause").
    alerts: list[tuple[float, str]] = field(default_factory=list)
    # Periods the chart's probe failed: (first failed start, next success's start or the
    # window's end, "outcome: error" of the first failed run), shaded with the reason on hover.
    outages: list[tuple[float, float, str]] = field(default_factory=list)
    note: str = ""
    # Per-x figures a kind of chart needs beyond its series (the smoke chart's loss).
    extra: dict[str, list[float | None]] = field(default_factory=dict)
    # Time charts of one page with the same ``sync`` share one time axis: stacked, one zoom,
    # one cursor (None: a chart on a scale of its own, as a year of weekly means).
    sync: str | None = "window"

    def spec(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "x": json_list(self.x),
            "series": [
                {
                    "label": s.label,
                    "values": json_list(s.values),
                    **({"axis": s.axis} if s.axis > 1 else {}),
                }
                for s in self.series
            ],
            "xLabel": self.x_label,
            "sync": self.sync if self.kind in ("time", "smoke") else None,
            "events": self.events,
            "alerts": [{"t": t, "label": label} for t, label in self.alerts],
            "outages": [{"from": a, "to": b, "reason": why} for a, b, why in self.outages],
            **{name: json_list(values) for name, values in self.extra.items()},
        }


def json_list(values: Any) -> list[float | None]:
    return [None if v is None or not math.isfinite(v) else float(v) for v in values]


def col(name: str, description: str) -> Column:
    return Column(name, description)


def num(value: float | None) -> float | None:
    """A finite float, or None (a cell with no value)."""
    return None if value is None or not math.isfinite(value) else float(value)


# -- alerts and studies (written by the analysis and tuning layers; shown by several pages) --


def facts_text(value: Any) -> str:
    """A JSON object as short ``key=value`` text for a table cell."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={facts_text(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return "[" + ", ".join(facts_text(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class AlertRow(NamedTuple):
    detected_at: datetime
    change_at: datetime
    monitor: str
    target: str
    metric: str
    direction: str
    before: float | None
    after: float | None
    change_percent: float | None
    cause: str
    details: str


ALERT_COLUMNS = [
    col("detected_at", "when the change was detected, UTC"),
    col("change_at", "when the series changed, UTC"),
    col("monitor", "monitoring host"),
    col("target", "target name"),
    col("metric", "probe.metric that changed, unit in the name"),
    col("direction", "up or down; changed for a route change (metric traceroute.route)"),
    col("before", "level before the change, in the metric's unit"),
    col("after", "level after the change, in the metric's unit"),
    col("change_percent", "(after - before) / before, percent"),
    col("cause", "likely cause: route, host, tuning or unknown"),
    col("details", "the evidence for the cause"),
]


def alert_metric(row: dict[str, Any]) -> str:
    """The alert's ``probe.metric`` (older rows stored the bare key)."""
    metric = str(row["metric"])
    return metric if "." in metric else f"{row['probe']}.{metric}"


def alerts_table(rows: list[dict[str, Any]], total: int, scope: str) -> Table:
    return Table(
        "alerts",
        f"alerts {scope} ({total}, newest first)",
        ALERT_COLUMNS,
        [
            AlertRow(
                r["detected_at"],
                r["change_at"],
                r["monitor"],
                r["target"],
                alert_metric(r),
                r["direction"],
                r["before"],
                r["after"],
                r["change_percent"],
                r["cause"],
                facts_text(r["details"]),
            )
            for r in rows
        ],
    )


class StudyRow(NamedTuple):
    started_at: datetime
    finished_at: datetime | None
    kind: str
    monitor: str
    partial: int
    points: int | None
    summary: str


def study_points(data: Any) -> int | None:
    """Points a study measured: the tuning layer writes ``data = {"points": [...]}``."""
    points = data.get("points") if isinstance(data, dict) else None
    return len(points) if isinstance(points, list) else None


def studies_table(rows: list[dict[str, Any]], total: int) -> Table:
    return Table(
        "studies",
        f"tuning, duration and impact studies ({total}, newest first)",
        [
            col("started_at", "start of the study, UTC"),
            col("finished_at", "end of the study, UTC (empty: still running or cut short)"),
            col("kind", "what was studied"),
            col("monitor", "monitoring host"),
            col("partial", "1 when the study was interrupted"),
            col("points", "measurements taken"),
            col("summary", "what it concluded"),
        ],
        [
            StudyRow(
                r["started_at"],
                r["finished_at"],
                r["kind"],
                r["monitor"],
                1 if r["partial"] else 0,
                study_points(r["data"]),
                facts_text(r["summary"]),
            )
            for r in rows
        ],
    )


# -- downloads (every page's tables: here, below the pages, so any page can offer them) --


class TableFormat(StrEnum):
    csv = "csv"
    tsv = "tsv"


def download(table: Table, fmt: TableFormat, selection: str, stem: str) -> Response:
    media = "text/csv" if fmt == TableFormat.csv else "text/tab-separated-values"
    body = table.render(fmt.value, selection)
    filename = f"{stem}-{table.name}.{fmt.value}".replace("/", "_")
    return Response(
        body,
        media_type=f"{media}; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


def pick(tables: dict[str, Table], name: str) -> Table:
    if name not in tables:
        raise HTTPException(404, f"no table {name!r} here (tables: {', '.join(tables)})")
    return tables[name]

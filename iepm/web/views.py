"""The figures behind each page: tables (downloadable as CSV/TSV) and the charts drawn from them.

Every number a page shows is in one of these tables, so what a person reads, what they download
and what the tests check are the same numbers. Statistics are over successful results only;
success rates count every run (failed, timed out and skipped ones included).
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np

from iepm.analysis.cause import hop_addresses, route_changes, route_text
from iepm.export import escape_tsv, format_cell, verbatim
from iepm.probes.base import Column
from iepm.results import format_time
from iepm.store.rollup import day_of, day_start
from iepm.web.queries import HEADLINE as HEADLINE
from iepm.web.queries import METRICS, FloatArray, Frame, Metric, Queries, latest_document

HISTORY = timedelta(days=28)
TSV_NOTE = "# empty cell: no value; backslash, tab, newline, CR written \\\\ \\t \\n \\r\n"
YEAR = timedelta(days=365)
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
Period = Literal["hour", "day", "week", "month"]
PERIOD_S = {"hour": 3600, "day": 86400, "week": 7 * 86400}
# Unix day 0 (1970-01-01) was a Thursday: shift so that weeks start on Monday (ISO).
MONDAY_SHIFT_DAYS = 3


@dataclass
class Table:
    """A downloadable table; column names carry their units, as in ``iepm export``."""

    name: str
    title: str
    columns: list[Column]
    rows: list[list[Any]]

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
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, np.integer):
        value = int(value)
    return format_cell(value, text)


@dataclass
class Chart:
    """A uPlot chart: ``x`` (epoch seconds for time charts) and one list per series."""

    id: str
    title: str
    kind: Literal["time", "bars", "line", "scatter"]
    x: list[float]
    series: list[dict[str, Any]]
    table: str
    x_label: str = "time (UTC)"
    events: list[float] = field(default_factory=list)
    # Step-change alerts of the plotted metrics: (change epoch s, "metric up|down cause").
    alerts: list[tuple[float, str]] = field(default_factory=list)
    note: str = ""

    def spec(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "kind": self.kind,
            "x": _json_list(self.x),
            "series": [{**s, "values": _json_list(s["values"])} for s in self.series],
            "xLabel": self.x_label,
            "events": self.events,
            "alerts": [{"t": t, "label": label} for t, label in self.alerts],
        }


def _json_list(values: Any) -> list[float | None]:
    return [None if v is None or not math.isfinite(v) else float(v) for v in values]


def col(name: str, description: str) -> Column:
    return Column(name, description)


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _num(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


# -- statistics ------------------------------------------------------------------------------


def describe(values: FloatArray) -> dict[str, float | None]:
    """Median, quartiles (linear interpolation), IQR, mean and sample stdev of finite values."""
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return dict.fromkeys(("median", "p25", "p75", "iqr", "mean", "stdev"))
    p25, median, p75 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return {
        "median": median,
        "p25": p25,
        "p75": p75,
        "iqr": p75 - p25,
        "mean": float(v.mean()),
        "stdev": float(v.std(ddof=1)) if len(v) > 1 else None,
    }


def through_origin(x: FloatArray, y: FloatArray) -> tuple[float | None, float | None]:
    """Least squares y = b·x (no intercept) and R² = 1 − SSE / Σ(y − ȳ)² (the centred form:
    the uncentred one Excel prints for a zero intercept flatters any fit away from zero)."""
    sxx = float(np.dot(x, x))
    if len(x) < 2 or sxx == 0:
        return None, None
    slope = float(np.dot(x, y)) / sxx
    sst = float(np.sum((y - y.mean()) ** 2))
    sse = float(np.sum((y - slope * x) ** 2))
    return slope, (1.0 - sse / sst) if sst > 0 else None


def bucket_starts(t: FloatArray, period: Period) -> FloatArray:
    """The start (epoch seconds, UTC) of the hour/day/ISO week/month each moment falls in."""
    if period == "month":
        months = t.astype("datetime64[s]").astype("datetime64[M]")
        return months.astype("datetime64[s]").astype(float)
    if period == "week":
        days = np.floor(t / 86400) + MONDAY_SHIFT_DAYS
        return (days - days % 7 - MONDAY_SHIFT_DAYS) * 86400.0
    step = PERIOD_S[period]
    return np.floor(t / step) * step


def group(keys: FloatArray, values: FloatArray) -> dict[float, tuple[int, float, float, float]]:
    """key → (count, min, mean, max) of the finite values."""
    ok = np.isfinite(values)
    keys, values = keys[ok], values[ok]
    out: dict[float, tuple[int, float, float, float]] = {}
    if len(keys) == 0:
        return out
    uniq, inverse = np.unique(keys, return_inverse=True)
    counts = np.bincount(inverse)
    sums = np.bincount(inverse, weights=values)
    mins = np.full(len(uniq), np.inf)
    maxs = np.full(len(uniq), -np.inf)
    np.minimum.at(mins, inverse, values)
    np.maximum.at(maxs, inverse, values)
    for i, key in enumerate(uniq):
        out[float(key)] = (
            int(counts[i]),
            float(mins[i]),
            float(sums[i] / counts[i]),
            float(maxs[i]),
        )
    return out


def aggregate(frame: Frame, key: str, period: Period) -> list[dict[str, Any]]:
    """Buckets of one metric (successful results only): start, count, min, mean, max, median."""
    ok = frame.ok() & np.isfinite(frame.values[key])
    t, v = frame.t[ok], frame.values[key][ok]
    starts = bucket_starts(t, period)
    out = []
    for start, (count, lo, mean, hi) in sorted(group(starts, v).items()):
        median = float(np.median(v[starts == start]))
        out.append(
            {
                "start": at(start),
                "count": count,
                "min": lo,
                "mean": mean,
                "max": hi,
                "median": median,
            }
        )
    return out


# -- alerts and studies ----------------------------------------------------------------------

# Alerts and studies shown on a page (the API pages through all of them).
PAGE_ROWS = 50


def _facts_text(value: Any) -> str:
    """A JSON object as short ``key=value`` text for a table cell."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={_facts_text(v)}" for k, v in sorted(value.items()))
    if isinstance(value, list):
        return "[" + ", ".join(_facts_text(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def alerts_table(rows: list[dict[str, Any]], total: int, scope: str) -> Table:
    return Table(
        "alerts",
        f"alerts {scope} ({total}, newest first)",
        [
            col("detected_at", "when the change was detected, UTC"),
            col("change_at", "when the series changed, UTC"),
            col("monitor", "monitoring host"),
            col("target", "target name"),
            col("metric", "probe.metric that changed, unit in the name"),
            col("direction", "up or down"),
            col("before", "level before the change, in the metric's unit"),
            col("after", "level after the change, in the metric's unit"),
            col("change_percent", "(after - before) / before, percent"),
            col("cause", "likely cause: route, host, tuning or unknown"),
            col("details", "the evidence for the cause"),
        ],
        [
            [
                r["detected_at"],
                r["change_at"],
                r["monitor"],
                r["target"],
                r["metric"] if "." in r["metric"] else f"{r['probe']}.{r['metric']}",
                r["direction"],
                r["before"],
                r["after"],
                r["change_percent"],
                r["cause"],
                _facts_text(r["details"]),
            ]
            for r in rows
        ],
    )


def _points(data: Any) -> int | None:
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
            [
                r["started_at"],
                r["finished_at"],
                r["kind"],
                r["monitor"],
                1 if r["partial"] else 0,
                _points(r["data"]),
                _facts_text(r["summary"]),
            ]
            for r in rows
        ],
    )


# -- overview --------------------------------------------------------------------------------


@dataclass
class Cell:
    metric: Metric
    started_at: datetime
    outcome: str
    value: float | None
    share_better: float | None
    count: int

    @property
    def status(self) -> str:
        if self.outcome != "ok":
            return "failed"
        if self.share_better is None:
            return "nodata"
        if self.share_better >= 0.9:
            return "poor"
        return "fair" if self.share_better >= 0.5 else "good"


def share_better(history: FloatArray, latest: float, better: str) -> float:
    """Share of the history that was better than the latest value: 0 = the best seen."""
    if better == "higher":
        return float(np.mean(history > latest))
    return float(np.mean(history < latest))


def overview(q: Queries, now: datetime) -> dict[str, Any]:
    since = now - HISTORY
    keys = sorted({METRICS[name].key for name in HEADLINE})
    frame = q.frame(["ping", "iperf3"], keys, since=since, until=now + timedelta(minutes=5))
    paths: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    probes = [METRICS[n].probe for n in HEADLINE]
    for i in range(len(frame)):
        paths[(frame.monitor[i], frame.target[i], frame.probe[i])].append(i)
    ok = frame.ok()
    cells: dict[tuple[str, str], dict[str, Cell]] = defaultdict(dict)
    for (monitor, target, probe), idx in paths.items():
        ids = np.array(idx)
        last = ids[-1]
        for name, metric_probe in zip(HEADLINE, probes, strict=True):
            if metric_probe != probe:
                continue
            metric = METRICS[name]
            vals = frame.values[metric.key][ids]
            history = vals[ok[ids] & np.isfinite(vals)]
            latest = frame.values[metric.key][last] if ok[last] else math.nan
            cells[(monitor, target)][name] = Cell(
                metric=metric,
                started_at=at(frame.t[last]),
                outcome=frame.outcome[last],
                value=_num(latest),
                share_better=(
                    share_better(history, latest, metric.better) if math.isfinite(latest) else None
                ),
                count=len(history),
            )
    monitors = sorted({m for m, _ in cells})
    targets = sorted({t for _, t in cells})
    rows = []
    for (monitor, target), by_metric in sorted(cells.items()):
        for name, cell in by_metric.items():
            rows.append(
                [
                    monitor,
                    target,
                    name,
                    cell.started_at,
                    cell.outcome,
                    cell.value,
                    cell.share_better,
                    cell.count,
                    round((now - cell.started_at).total_seconds()),
                ]
            )
    grid = Table(
        "paths",
        "latest result per path against its last 28 days",
        [
            col("monitor", "monitoring host"),
            col("target", "target name"),
            col("metric", "probe.metric, unit in the name"),
            col("started_at", "start of the latest result, UTC"),
            col("outcome", "outcome of the latest result"),
            col("value", "latest value, in the metric's unit (empty when it failed)"),
            col("share_better", "share of the 28 days' successful results better than latest"),
            col("count_28d", "successful results in the last 28 days"),
            col("age_s", "seconds since the latest result started"),
        ],
        rows,
    )
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for monitor, probe, outcome, n in q.outcome_counts(since=since, until=now):
        counts[(monitor, probe)][outcome] += n
    outcome_names = ["ok", "failed", "timeout", "skipped"]
    outcomes = Table(
        "outcomes",
        "runs by outcome in the last 28 days",
        [col("monitor", "monitoring host"), col("probe", "probe")]
        + [col(o, f"runs that ended {o}") for o in outcome_names],
        [[m, p, *(c.get(o, 0) for o in outcome_names)] for (m, p), c in sorted(counts.items())],
    )
    cycles = Table(
        "cycles",
        "scheduler cycles (whole archive)",
        [
            col("monitor", "monitoring host"),
            col("cycles", "cycles recorded"),
            col("overruns", "cycles longer than their interval"),
        ],
        [list(r) for r in q.cycle_counts()],
    )
    silent = sorted(set(q.targets()) - set(targets))
    means: dict[tuple[str, str], float] = {}
    for (monitor, target, probe), idx in paths.items():
        if probe == "iperf3":
            values = frame.values["throughput_bps"][np.array(idx)][ok[np.array(idx)]]
            values = values[np.isfinite(values)]
            if len(values):
                means[(monitor, target)] = float(values.mean())
    routes = route_map(q.latest("traceroute", None, since, now + timedelta(minutes=5)), means)
    alert_total, alert_rows = q.alerts(since=since, until=now, limit=PAGE_ROWS)
    alerts = alerts_table(alert_rows, alert_total, "in the last 28 days")
    return {
        "monitors": monitors,
        "targets": targets,
        "cells": cells,
        "silent": silent,
        "routes": routes,
        "tables": {t.name: t for t in (grid, outcomes, cycles, alerts, *routes["tables"])},
    }


# -- route map -------------------------------------------------------------------------------

MAP_COLUMN_PX = 150
MAP_ROW_PX = 34
MAP_MARGIN_PX = 24


@dataclass
class MapNode:
    id: str
    label: str
    kind: Literal["monitor", "hop", "silent", "target"]
    column: int
    x: float = 0.0
    y: float = 0.0
    title: str = ""
    sublabel: str = ""


@dataclass
class MapEdge:
    a: str
    b: str
    paths: list[str] = field(default_factory=list)
    reached: bool = True


def route_map(traces: list[Any], throughput: dict[tuple[str, str], float]) -> dict[str, Any]:
    """The graph of the hops seen by each path's latest traceroute, shared hops and links
    merged (as the seeds' Figure 1): monitors on the left, one column per TTL, every target
    labelled with its mean iperf3 throughput over 28 days. A silent hop (``*``) belongs to its
    path alone: nothing says two silent hops are one router. ``traces`` are Result envelopes;
    ``throughput`` maps (monitor, target) to the mean.

    Returns the laid-out ``nodes`` and ``edges`` (pixels), the SVG size and two tables."""
    nodes: dict[str, MapNode] = {}
    edges: dict[tuple[str, str], MapEdge] = {}
    order: list[str] = []
    path_rows: list[list[Any]] = []

    def node(key: str, label: str, kind: Any, column: int, title: str = "") -> str:
        if key not in nodes:
            nodes[key] = MapNode(key, label, kind, column, title=title)
            order.append(key)
        else:  # a router seen at several TTLs sits at the earliest
            nodes[key].column = min(nodes[key].column, column)
        return key

    for trace in sorted(traces, key=lambda r: (r.target, r.monitor)):
        path = f"{trace.monitor} → {trace.target}"
        previous = node(f"monitor:{trace.monitor}", trace.monitor, "monitor", 0, "monitor")
        hops = [h for h in (trace.data.get("hops") or []) if isinstance(h, dict)]
        reached = bool(trace.data.get("reached")) and trace.succeeded
        destination = trace.data.get("destination_address") or trace.target_address
        column = 0
        for hop in hops:
            address = hop.get("address")
            ttl = int(hop.get("ttl") or column + 1)
            column = ttl
            if reached and address == destination:
                break  # the destination is drawn as the target node
            if address:
                key = node(f"hop:{address}", str(address), "hop", ttl, str(address))
            else:
                key = node(
                    f"silent:{path}:{ttl}", "*", "silent", ttl, f"silent hop {ttl} of {path}"
                )
            edges.setdefault((previous, key), MapEdge(previous, key)).paths.append(path)
            previous = key
        mean = throughput.get((trace.monitor, trace.target))
        target_key = node(
            f"target:{trace.target}",
            trace.target,
            "target",
            max(column, 1),
            f"{trace.target} ({trace.target_address})",
        )
        nodes[target_key].sublabel = _bps_text(mean)
        edge = edges.setdefault((previous, target_key), MapEdge(previous, target_key))
        edge.paths.append(path)
        edge.reached = edge.reached and reached
        path_rows.append(
            [
                trace.monitor,
                trace.target,
                trace.started_at,
                trace.outcome.value,
                1 if reached else 0,
                route_text(hop_addresses(trace.data)),
                mean,
            ]
        )
    # Targets in the last column, so routes of different lengths end aligned.
    last = max((n.column for n in nodes.values()), default=0)
    for n in nodes.values():
        if n.kind == "target":
            n.column = max(last, 1)
    # Room on the left for the monitors' names (written left of their node).
    left = MAP_MARGIN_PX + 7 * max(
        (len(n.label) for n in nodes.values() if n.kind == "monitor"), default=0
    )
    rows_in: dict[int, int] = defaultdict(int)
    for key in order:  # first seen first: each path's hops stay near each other
        n = nodes[key]
        n.x = left + n.column * MAP_COLUMN_PX
        n.y = MAP_MARGIN_PX + rows_in[n.column] * MAP_ROW_PX
        rows_in[n.column] += 1
    height = MAP_MARGIN_PX * 2 + max(rows_in.values(), default=0) * MAP_ROW_PX
    width = left + MAP_MARGIN_PX + last * MAP_COLUMN_PX + 160
    links = Table(
        "route_links",
        "links of the route map (hops merged across paths)",
        [
            col("from", "monitor or hop address (* silent)"),
            col("to", "hop address (* silent) or target name"),
            col("paths", "paths (monitor -> target) whose latest traceroute uses the link"),
            col("path_count", "number of such paths"),
        ],
        [
            [nodes[e.a].label, nodes[e.b].label, "; ".join(e.paths), len(e.paths)]
            for e in edges.values()
        ],
    )
    routes = Table(
        "route_paths",
        "latest traceroute of each path with its mean throughput",
        [
            col("monitor", "monitoring host"),
            col("target", "target name"),
            col("started_at", "start of the latest traceroute, UTC"),
            col("outcome", "outcome of that traceroute"),
            col("reached", "1 when the traceroute reached the target"),
            col("route", "hop addresses in TTL order, * for a silent hop"),
            col("throughput_bps_mean", "mean iperf3 throughput over 28 days, bit/s"),
        ],
        path_rows,
    )
    return {
        "nodes": [nodes[k] for k in order],
        "edges": [(nodes[e.a], nodes[e.b], e) for e in edges.values()],
        "width": width,
        "height": max(height, 60),
        "tables": [links, routes],
    }


def _bps_text(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "no throughput"
    for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} bit/s"


# -- target page -----------------------------------------------------------------------------

PING_KEYS = ["rtt_min_ms", "rtt_avg_ms", "rtt_max_ms", "loss_percent"]
IPERF_KEYS = ["throughput_bps", "window_bytes", "stream_count", "retransmits"]
STAT_METRICS = [
    "ping.rtt_min_ms",
    "ping.rtt_avg_ms",
    "ping.rtt_max_ms",
    "ping.loss_percent",
    "iperf3.throughput_bps",
    "iperf3.retransmits",
    "traceroute.hop_count",
]


def route_rows(docs: list[tuple[datetime, str, dict[str, Any]]]) -> list[list[Any]]:
    """[started_at, hop_count, route, changed] for each successful traceroute; ``changed`` is 1
    when the route differs from the ones before it (a silent hop matches any address)."""
    ok = [(started, data) for started, outcome, data in docs if outcome == "ok"]
    routes = [hop_addresses(data) for _started, data in ok]
    return [
        [started, data.get("hop_count"), route_text(route), 1 if changed else 0]
        for (started, data), route, changed in zip(ok, routes, route_changes(routes), strict=True)
    ]


def series_table(name: str, title: str, frame: Frame, keys: list[str], probe: str) -> Table:
    described = {c.name: c.description for c in _probe_columns(probe)}
    return Table(
        name,
        title,
        [col("started_at", "start of the run, UTC"), col("outcome", "ok, failed, timeout, skipped")]
        + [col(k, described.get(k, k)) for k in keys],
        [
            [at(frame.t[i]), frame.outcome[i], *(_num(frame.values[k][i]) for k in keys)]
            for i in range(len(frame))
        ],
    )


def _probe_columns(probe: str) -> list[Column]:
    from iepm.probes import PROBES

    module = PROBES.get(probe)
    return list(module.COLUMNS) if module is not None else []


def stats_table(frames: dict[str, Frame]) -> Table:
    rows = []
    for name in STAT_METRICS:
        metric = METRICS[name]
        frame = frames.get(metric.probe)
        if frame is None or len(frame) == 0:
            continue
        ok = frame.ok()
        values = frame.values[metric.key][ok]
        d = describe(values)
        count = int(np.isfinite(values).sum())
        rows.append(
            [
                name,
                d["median"],
                d["p25"],
                d["p75"],
                d["iqr"],
                d["mean"],
                d["stdev"],
                count,
                len(frame),
                float(ok.sum()) / len(frame),
            ]
        )
    return Table(
        "stats",
        "statistics per metric (successful runs)",
        [
            col("metric", "probe.metric, unit in the name"),
            col("median", "median"),
            col("p25", "25th percentile (linear interpolation)"),
            col("p75", "75th percentile (linear interpolation)"),
            col("iqr", "p75 - p25"),
            col("mean", "arithmetic mean"),
            col("stdev", "sample standard deviation"),
            col("count", "successful runs with a value"),
            col("runs", "all runs of the probe, whatever their outcome"),
            col("success_rate", "share of runs that ended ok"),
        ],
        rows,
    )


def histogram_table(values: FloatArray) -> Table:
    v = values[np.isfinite(values)]
    rows: list[list[Any]] = []
    if len(v):
        bins = min(40, max(5, int(math.sqrt(len(v)))))
        counts, edges = np.histogram(v, bins=bins)
        rows = [[float(edges[i]), float(edges[i + 1]), int(c)] for i, c in enumerate(counts)]
    return Table(
        "throughput_histogram",
        "histogram of iperf3 throughput",
        [
            col("bin_low_bps", "lower edge of the bin, bit/s (inclusive)"),
            col("bin_high_bps", "upper edge of the bin, bit/s (exclusive; the last inclusive)"),
            col("count", "successful runs in the bin"),
        ],
        rows,
    )


def cdf_table(values: FloatArray) -> Table:
    v = np.sort(values[np.isfinite(values)])
    n = len(v)
    return Table(
        "rtt_cdf",
        "cumulative distribution of the average RTT",
        [
            col("rtt_avg_ms", "average RTT of a run, ms"),
            col("fraction", "share of successful runs with this RTT or less"),
        ],
        [[float(x), (i + 1) / n] for i, x in enumerate(v)],
    )


def _facts(doc: tuple[datetime, str, dict[str, Any]] | None) -> Table:
    rows: list[list[Any]] = []
    if doc is not None:
        started, _outcome, data = doc
        rows.append(["measured_at", started])
        for key in sorted(data):
            value = data[key]
            if key in ("unreadable",):
                continue
            if key == "nics" and isinstance(value, dict):
                for nic, facts in sorted(value.items()):
                    if isinstance(facts, dict):
                        text = ", ".join(f"{k}={v}" for k, v in sorted(facts.items()))
                        rows.append([f"nic {nic}", text])
                continue
            if isinstance(value, list):
                value = " ".join(str(x) for x in value)
            rows.append([key, value])
    return Table(
        "host_facts",
        "host facts from the latest load result",
        [col("fact", "name, unit in the name"), col("value", "value")],
        rows,
    )


def _alerts_of(q: Queries, target: str, now: datetime) -> tuple[list[dict[str, Any]], int]:
    total, rows = q.alerts(target=target, until=now, limit=PAGE_ROWS)
    return rows, total


def _studies_of(q: Queries, target: str) -> tuple[list[dict[str, Any]], int]:
    total, rows = q.studies(target=target, limit=PAGE_ROWS)
    return rows, total


def target_page(q: Queries, target: str, monitor: str | None, now: datetime) -> dict[str, Any]:
    # The monitors of the last 28 days (cheap through the index), else of all time.
    monitors = q.target_monitors(target, since=now - HISTORY) or q.target_monitors(target)
    if monitor is None and monitors:
        monitor = monitors[0][0]
    since = now - HISTORY
    window = {"target": target, "monitor": monitor, "since": since, "until": now}
    ping = q.frame("ping", PING_KEYS, **window)
    iperf = q.frame("iperf3", IPERF_KEYS, **window)
    trace = q.frame("traceroute", ["hop_count"], **window)
    routes = route_rows(q.documents("traceroute", **window))
    events = [r[0].timestamp() for r in routes if r[3]]
    alert_rows, alert_total = _alerts_of(q, target, now)

    def marks(*metrics: str) -> list[tuple[float, str]]:
        """This path's alerts on ``metrics`` whose change lies in the 28 days."""
        return [
            (a["change_at"].timestamp(), f"{a['metric']} {a['direction']}: {a['cause']}")
            for a in alert_rows
            if a["metric"] in metrics and a["monitor"] == monitor and since <= a["change_at"] < now
        ]

    ping_ok, iperf_ok = ping.ok(), iperf.ok()
    tables = {
        t.name: t
        for t in (
            series_table("ping", "ping results", ping, PING_KEYS, "ping"),
            series_table("iperf3", "iperf3 results", iperf, IPERF_KEYS, "iperf3"),
            Table(
                "routes",
                "traceroute routes (changed = differs from the previous route)",
                [
                    col("started_at", "start of the traceroute, UTC"),
                    col("hop_count", "hops printed"),
                    col("route", "hop addresses in TTL order, * for a silent hop"),
                    col("changed", "1 when the route changed"),
                ],
                routes,
            ),
            stats_table({"ping": ping, "iperf3": iperf, "traceroute": trace}),
            histogram_table(iperf.values["throughput_bps"][iperf_ok]),
            cdf_table(ping.values["rtt_avg_ms"][ping_ok]),
            weekly_table(q, target, monitor, now),
            _facts(
                latest_document(q, "load", target, monitor) or latest_document(q, "load", target)
            ),
            alerts_table(alert_rows, alert_total, f"of {target}"),
            studies_table(*_studies_of(q, target)),
        )
    }

    def masked(frame: Frame, key: str) -> list[float]:
        return [v if o else math.nan for v, o in zip(frame.values[key], frame.ok(), strict=True)]

    charts = [
        Chart(
            "rtt",
            "ping RTT (ms)",
            "time",
            list(ping.t),
            [
                {"label": "rtt_min_ms", "values": masked(ping, "rtt_min_ms")},
                {"label": "rtt_avg_ms", "values": masked(ping, "rtt_avg_ms")},
                {"label": "rtt_max_ms", "values": masked(ping, "rtt_max_ms")},
            ],
            "ping",
            events=events,
            alerts=marks("ping.rtt_avg_ms", "ping.rtt_min_ms", "ping.rtt_max_ms"),
        ),
        Chart(
            "loss",
            "ping loss (%)",
            "time",
            list(ping.t),
            [{"label": "loss_percent", "values": masked(ping, "loss_percent")}],
            "ping",
            events=events,
            alerts=marks("ping.loss_percent"),
        ),
        Chart(
            "throughput",
            "iperf3 throughput (bit/s) with the window and streams used",
            "time",
            list(iperf.t),
            [
                {"label": "throughput_bps", "values": masked(iperf, "throughput_bps")},
                {"label": "window_bytes", "values": masked(iperf, "window_bytes"), "axis": 2},
                {"label": "stream_count", "values": masked(iperf, "stream_count"), "axis": 3},
            ],
            "iperf3",
            events=events,
            alerts=marks("iperf3.throughput_bps"),
        ),
        Chart(
            "hops",
            "traceroute hops (vertical lines: route changes)",
            "time",
            [r[0].timestamp() for r in routes],
            [{"label": "hop_count", "values": [r[1] for r in routes]}],
            "routes",
            events=events,
        ),
    ]
    hist = tables["throughput_histogram"]
    charts.append(
        Chart(
            "histogram",
            "throughput histogram (runs per bin)",
            "bars",
            [r[0] for r in hist.rows],
            [{"label": "count", "values": [r[2] for r in hist.rows]}],
            "throughput_histogram",
            x_label="throughput (bit/s), bin lower edge",
        )
    )
    cdf = tables["rtt_cdf"]
    charts.append(
        Chart(
            "cdf",
            "CDF of the average RTT",
            "line",
            [r[0] for r in cdf.rows],
            [{"label": "fraction", "values": [r[1] for r in cdf.rows]}],
            "rtt_cdf",
            x_label="rtt_avg_ms",
        )
    )
    weekly = tables["weekly"]
    charts.append(
        Chart(
            "longterm",
            "weekly means over a year",
            "time",
            [r[0].timestamp() for r in weekly.rows],
            [
                {"label": "rtt_avg_ms_mean", "values": [r[2] for r in weekly.rows]},
                {"label": "throughput_bps_mean", "values": [r[4] for r in weekly.rows], "axis": 2},
            ],
            "weekly",
        )
    )
    return {
        "target": target,
        "monitor": monitor,
        "monitors": monitors,
        "since": since,
        "until": now,
        "tables": tables,
        "charts": [c for c in charts if c.x],
        "counts": {"ping": len(ping), "iperf3": len(iperf), "traceroute": len(trace)},
    }


# -- aggregation views (RTPL) ----------------------------------------------------------------

AGG_KEYS = ["rtt_min_ms", "rtt_avg_ms", "rtt_max_ms", "loss_percent", "throughput_bps"]


def period_table(frame: Frame, period: Period, name: str, title: str) -> Table:
    """Per period: ping runs, mean RTT, mean loss, iperf3 runs, mean throughput."""
    ok = frame.ok()
    is_ping = np.array([p == "ping" for p in frame.probe], dtype=bool)
    starts = bucket_starts(frame.t, period)
    rtt = group(starts[ok & is_ping], frame.values["rtt_avg_ms"][ok & is_ping])
    loss = group(starts[ok & is_ping], frame.values["loss_percent"][ok & is_ping])
    thr = group(starts[ok & ~is_ping], frame.values["throughput_bps"][ok & ~is_ping])
    rows = []
    for key in sorted(set(rtt) | set(thr)):
        r, lo, th = rtt.get(key), loss.get(key), thr.get(key)
        rows.append(
            [
                at(key),
                r[0] if r else 0,
                r[2] if r else None,
                lo[2] if lo else None,
                th[2] if th else None,
                th[0] if th else 0,
            ]
        )
    return Table(name, title, period_columns(period), rows)


def period_columns(period: str) -> list[Column]:
    return [
        col("period_start", f"start of the {period}, UTC"),
        col("ping_count", "successful ping runs"),
        col("rtt_avg_ms_mean", "mean of the runs' average RTT, ms"),
        col("loss_percent_mean", "mean loss, percent"),
        col("throughput_bps_mean", "mean iperf3 throughput, bit/s"),
        col("iperf3_count", "successful iperf3 runs"),
    ]


def weekly_table(q: Queries, target: str, monitor: str | None, now: datetime) -> Table:
    """Week means over the year before ``now`` (from whole UTC days, as ``period_table``,
    computed in the database)."""
    rows = q.period_means(
        7 * 86400,
        MONDAY_SHIFT_DAYS * 86400,
        target=target,
        monitor=monitor,
        since=day_start(day_of(now - YEAR)),
        until=now,
    )
    return Table(
        "weekly",
        "weekly means",
        period_columns("week"),
        [
            [at(start), n_ping, rtt, loss, thr, n_iperf]
            for start, n_ping, rtt, loss, thr, n_iperf in rows
        ],
    )


def monthly_table(frame: Frame) -> Table:
    ok = frame.ok()
    is_ping = np.array([p == "ping" for p in frame.probe], dtype=bool)
    starts = bucket_starts(frame.t, "month")
    pm, im = ok & is_ping, ok & ~is_ping
    g = {k: group(starts[pm], frame.values[k][pm]) for k in AGG_KEYS[:4]}
    thr = group(starts[im], frame.values["throughput_bps"][im])
    rows = []
    for key in sorted(set(g["rtt_avg_ms"]) | set(thr)):
        lo, avg, hi = g["rtt_min_ms"].get(key), g["rtt_avg_ms"].get(key), g["rtt_max_ms"].get(key)
        loss, th = g["loss_percent"].get(key), thr.get(key)
        rows.append(
            [
                at(key).strftime("%Y-%m"),
                lo[1] if lo else None,
                avg[2] if avg else None,
                hi[3] if hi else None,
                loss[2] if loss else None,
                loss[3] if loss else None,
                th[1] if th else None,
                th[2] if th else None,
                th[3] if th else None,
                avg[0] if avg else 0,
                th[0] if th else 0,
            ]
        )
    return Table(
        "monthly",
        "monthly min/avg/max",
        [
            col("month", "UTC month, YYYY-MM"),
            col("rtt_min_ms", "smallest RTT of the month, ms"),
            col("rtt_avg_ms", "mean of the runs' average RTT, ms"),
            col("rtt_max_ms", "largest RTT of the month, ms"),
            col("loss_percent_avg", "mean loss, percent"),
            col("loss_percent_max", "worst run's loss, percent"),
            col("throughput_bps_min", "lowest iperf3 throughput, bit/s"),
            col("throughput_bps_avg", "mean iperf3 throughput, bit/s"),
            col("throughput_bps_max", "highest iperf3 throughput, bit/s"),
            col("ping_count", "successful ping runs"),
            col("iperf3_count", "successful iperf3 runs"),
        ],
        rows,
    )


def time_of_day_table(
    frame: Frame, metric: Metric, groups: list[tuple[str, Any]], name: str, title: str
) -> Table:
    """Mean of ``metric`` by UTC hour of day (rows) for each group (columns); ``groups`` is a
    list of (column label, boolean mask over the frame)."""
    ok = frame.ok() & np.array([p == metric.probe for p in frame.probe], dtype=bool)
    hours = np.floor((frame.t % 86400) / 3600)
    values = frame.values[metric.key]
    per_group = [group(hours[ok & mask], values[ok & mask]) for _label, mask in groups]
    rows = [
        [hour, *(g[float(hour)][2] if float(hour) in g else None for g in per_group)]
        for hour in range(24)
    ]
    return Table(
        name,
        title,
        [col("hour_utc", "hour of the day, UTC")]
        + [col(label, f"mean {metric.name} in this hour") for label, _mask in groups],
        rows,
    )


AGG_VIEWS = {
    "last7": "last 7 days",
    "weekly": "week means over a year",
    "daily": "day means over a year",
    "weekday": "means by time of day per weekday (one quarter)",
    "workday": "workday means by time of day, per month",
    "monthly": "monthly min/avg/max",
}
AGG_METRICS = ["ping.rtt_avg_ms", "ping.loss_percent", "iperf3.throughput_bps"]


def aggregate_page(
    q: Queries, target: str, monitor: str | None, view: str, metric_name: str, now: datetime
) -> dict[str, Any]:
    # The monitors of the last 28 days (cheap through the index), else of all time.
    monitors = q.target_monitors(target, since=now - HISTORY) or q.target_monitors(target)
    if monitor is None and monitors:
        monitor = monitors[0][0]
    metric = METRICS[metric_name]
    span = timedelta(days=7) if view == "last7" else YEAR
    frame = q.frame(
        ["ping", "iperf3"], AGG_KEYS, target=target, monitor=monitor, since=now - span, until=now
    )
    charts: list[Chart] = []
    tables: list[Table] = []
    if view in ("last7", "weekly", "daily"):
        if view == "last7":
            ok = frame.ok() & np.array([p == metric.probe for p in frame.probe], dtype=bool)
            raw = Table(
                "points",
                f"{metric.name}, every successful run of the last 7 days",
                [col("started_at", "start of the run, UTC"), col(metric.name, metric.label)],
                [[at(frame.t[i]), _num(frame.values[metric.key][i])] for i in np.flatnonzero(ok)],
            )
            tables.append(raw)
            charts.append(
                Chart(
                    "agg",
                    f"{metric.label}, last 7 days",
                    "time",
                    [r[0].timestamp() for r in raw.rows],
                    [{"label": metric.name, "values": [r[1] for r in raw.rows]}],
                    "points",
                )
            )
            table = period_table(frame, "day", "days", "day means, last 7 days")
        else:
            period: Period = "week" if view == "weekly" else "day"
            table = period_table(frame, period, view, f"{period} means over a year")
            column = {"ping.rtt_avg_ms": 2, "ping.loss_percent": 3, "iperf3.throughput_bps": 4}
            charts.append(
                Chart(
                    "agg",
                    f"{period} means of {metric.label}",
                    "time",
                    [r[0].timestamp() for r in table.rows],
                    [
                        {
                            "label": f"{metric.name} mean",
                            "values": [r[column[metric_name]] for r in table.rows],
                        }
                    ],
                    table.name,
                )
            )
        tables.append(table)
    elif view == "monthly":
        table = monthly_table(frame)
        tables.append(table)
        x = [datetime.strptime(r[0], "%Y-%m").replace(tzinfo=UTC).timestamp() for r in table.rows]
        charts.append(
            Chart(
                "agg",
                "monthly RTT min/avg/max (ms)",
                "time",
                x,
                [
                    {"label": "rtt_min_ms", "values": [r[1] for r in table.rows]},
                    {"label": "rtt_avg_ms", "values": [r[2] for r in table.rows]},
                    {"label": "rtt_max_ms", "values": [r[3] for r in table.rows]},
                ],
                "monthly",
            )
        )
    else:
        weekday = (np.floor(frame.t / 86400) + MONDAY_SHIFT_DAYS) % 7
        if view == "weekday":
            # The latest quarter with data: RTPL compared weekdays within one season.
            quarter_start = _quarter_start(at(frame.t[-1]) if len(frame) else now)
            in_quarter = frame.t >= quarter_start.timestamp()
            groups = [(WEEKDAYS[d], in_quarter & (weekday == d)) for d in range(7)]
            title = f"mean {metric.name} by hour, per weekday, quarter from {quarter_start:%Y-%m}"
            table = time_of_day_table(frame, metric, groups, "weekday", title)
        else:
            months = bucket_starts(frame.t, "month")
            workday = weekday < 5
            groups = [
                (at(m).strftime("%Y-%m"), workday & (months == m)) for m in sorted(set(months))
            ]
            title = f"mean {metric.name} by hour over workdays, per month"
            table = time_of_day_table(frame, metric, groups, "workday", title)
        tables.append(table)
        labels = [c.name for c in table.columns[1:]]
        charts.append(
            Chart(
                "agg",
                title,
                "line",
                [float(r[0]) for r in table.rows],
                [
                    {"label": label, "values": [r[i + 1] for r in table.rows]}
                    for i, label in enumerate(labels)
                ],
                table.name,
                x_label="hour of day (UTC)",
            )
        )
    return {
        "target": target,
        "monitor": monitor,
        "monitors": monitors,
        "view": view,
        "metric": metric_name,
        "tables": {t.name: t for t in tables},
        "charts": [c for c in charts if c.x],
    }


def _quarter_start(moment: datetime) -> datetime:
    return datetime(moment.year, 3 * ((moment.month - 1) // 3) + 1, 1, tzinfo=UTC)


# -- compare page ----------------------------------------------------------------------------


def compare_page(
    q: Queries,
    x_name: str,
    y_name: str,
    mode: Literal["targets", "time"],
    target: str | None,
    now: datetime,
    pair_s: float = 3600.0,
) -> dict[str, Any]:
    """Scatter of two metrics: one point per target×monitor (medians over 28 days), or one per
    pair of runs against one target no more than ``pair_s`` apart (same cycle)."""
    x_metric, y_metric = METRICS[x_name], METRICS[y_name]
    since = now - HISTORY
    probes = sorted({x_metric.probe, y_metric.probe})
    keys = sorted({x_metric.key, y_metric.key})
    frame = q.frame(probes, keys, target=target if mode == "time" else None, since=since, until=now)
    ok = frame.ok()
    points: list[list[Any]] = []
    if mode == "targets":
        by_path: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i in np.flatnonzero(ok):
            by_path[(frame.target[i], frame.monitor[i])].append(int(i))
        for (tgt, mon), idx in sorted(by_path.items()):
            ids = np.array(idx)
            xs = _of(frame, ids, x_metric)
            ys = _of(frame, ids, y_metric)
            if len(xs) and len(ys):
                points.append([f"{tgt} ({mon})", float(np.median(xs)), float(np.median(ys))])
    else:
        xi = np.array([i for i in np.flatnonzero(ok) if frame.probe[i] == x_metric.probe])
        yi = np.array([i for i in np.flatnonzero(ok) if frame.probe[i] == y_metric.probe])
        xi = xi[np.isfinite(frame.values[x_metric.key][xi])] if len(xi) else xi
        yi = yi[np.isfinite(frame.values[y_metric.key][yi])] if len(yi) else yi
        if x_metric.probe == y_metric.probe:
            # Two figures of one probe: each run is a point.
            for j in np.intersect1d(xi, yi):
                points.append(
                    [
                        at(frame.t[j]),
                        float(frame.values[x_metric.key][j]),
                        float(frame.values[y_metric.key][j]),
                    ]
                )
        elif len(xi) and len(yi):
            xt = frame.t[xi]
            for j in yi:
                k = int(np.argmin(np.abs(xt - frame.t[j])))
                if abs(xt[k] - frame.t[j]) <= pair_s:
                    points.append(
                        [
                            at(frame.t[j]),
                            float(frame.values[x_metric.key][xi[k]]),
                            float(frame.values[y_metric.key][j]),
                        ]
                    )
    x = np.array([p[1] for p in points], dtype=float)
    y = np.array([p[2] for p in points], dtype=float)
    slope, r2 = through_origin(x, y)
    label = "path (target, monitor)" if mode == "targets" else "started_at of the y run, UTC"
    table = Table(
        "points",
        f"{y_name} against {x_name}",
        [col("point", label), col(x_name, x_metric.label), col(y_name, y_metric.label)],
        points,
    )
    fit = Table(
        "fit",
        "least-squares fit through the origin",
        [
            col("slope", f"b in {y_name} = b * {x_name}"),
            col("r_squared", "1 - SSE / sum of squares about the mean of y"),
            col("n", "points"),
        ],
        [[slope, r2, len(points)]],
    )
    order = np.argsort(x, kind="stable")
    chart = Chart(
        "scatter",
        f"{y_metric.label} against {x_metric.label}",
        "scatter",
        # A first point at x = 0 (no observation) starts the fit line at the origin.
        [0.0, *(float(v) for v in x[order])],
        [
            {"label": y_name, "values": [None, *(float(v) for v in y[order])]},
            {
                "label": "fit through origin",
                "values": [
                    None if slope is None else slope * v for v in [0.0, *map(float, x[order])]
                ],
            },
        ],
        "points",
        x_label=x_name,
        note="" if slope is None else f"y = {slope:.4g}·x, R² = {r2:.3f}" if r2 is not None else "",
    )
    return {
        "x": x_name,
        "y": y_name,
        "mode": mode,
        "target": target,
        "slope": slope,
        "r2": r2,
        "tables": {"points": table, "fit": fit},
        "charts": [chart] if points else [],
    }


def _of(frame: Frame, ids: Any, metric: Metric) -> FloatArray:
    mine = np.array([frame.probe[i] == metric.probe for i in ids], dtype=bool)
    values = frame.values[metric.key][ids][mine]
    return values[np.isfinite(values)]

"""A target's page: 28 days of every registered probe's metrics as charts and tables, its
routes and their changes, statistics per metric, a year of weekly means, host facts, alerts
and studies.

Which charts a page draws comes from the probe registry: the charts of ``LAYOUT`` (the
figures IEPM-BW drew, named by metric) for the metrics they name, and one chart per other
registered probe with all its metrics, so a probe added later is charted with no edit here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import numpy as np

from iepm.analysis.cause import HOST_PROBE, ROUTE_PROBE, hop_addresses, route_changes, route_text
from iepm.analysis.statistics import FloatArray, at, describe
from iepm.probes import PROBES, all_metrics
from iepm.probes.base import Metric
from iepm.web.health import run_value
from iepm.web.pages.aggregate import weekly
from iepm.web.pages.flows import target_passive
from iepm.web.pages.predict import forecast_panel
from iepm.web.queries import Frame, Queries, latest_document
from iepm.web.tables import (
    HISTORY,
    PAGE_ROWS,
    Chart,
    Series,
    Table,
    alert_metric,
    alerts_table,
    col,
    num,
    studies_table,
)


class ChartLayout(NamedTuple):
    """A time chart of some metrics of one probe: (metric name, y axis) per series."""

    id: str
    title: str
    series: tuple[tuple[str, int], ...]


LAYOUT = (
    ChartLayout(
        "rtt",
        "ping RTT (ms)",
        (("ping.rtt_min_ms", 1), ("ping.rtt_avg_ms", 1), ("ping.rtt_max_ms", 1)),
    ),
    ChartLayout("loss", "ping loss (%)", (("ping.loss_percent", 1),)),
    ChartLayout(
        "throughput",
        "iperf3 throughput (bit/s) with the window and streams used",
        (("iperf3.throughput_bps", 1), ("iperf3.window_bytes", 2), ("iperf3.stream_count", 3)),
    ),
)
HISTOGRAM = "iperf3.throughput_bps"  # the distribution of a path's capacity
CDF = "ping.rtt_avg_ms"
# The smoke chart (Smokeping's): every packet's RTT of each run, from the list a run stores
# beside its mean, with its loss colouring the median; over the last SMOKE_WINDOW.
SMOKE = ("ping.rtt_avg_ms", "rtts_ms", "ping.loss_percent")
SMOKE_WINDOW = timedelta(days=2)
SMOKE_LEVELS = (0, 10, 25, 50, 75, 90, 100)  # percentiles drawn: bands about the median
UNIT = ("_ms", "_s", "_bps", "_bytes", "_percent")


class SmokeRow(NamedTuple):
    started_at: datetime
    outcome: str
    loss_percent: float | None
    p0: float | None
    p10: float | None
    p25: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    p100: float | None
    samples: int


def smoke_rows(
    docs: list[tuple[datetime, str, dict[str, Any]]], samples: str, loss: str
) -> list[SmokeRow]:
    """Per run: the percentiles of its packets' RTTs (none for a run with no reply) and its
    loss (a failed run's as its data has it, else 100 %: nothing came back)."""
    rows = []
    for started, outcome, data in docs:
        values = data.get(samples)
        rtts = np.array(
            [v for v in values if isinstance(v, int | float)] if isinstance(values, list) else [],
            dtype=float,
        )
        lost = data.get(loss)
        lost_value = float(lost) if isinstance(lost, int | float) else None
        if outcome != "ok" and lost_value is None:
            lost_value = 100.0
        levels = (
            [float(v) for v in np.percentile(rtts, SMOKE_LEVELS)]
            if len(rtts)
            else [None] * len(SMOKE_LEVELS)
        )
        rows.append(SmokeRow(started, outcome, lost_value, *levels, len(rtts)))
    return rows


def _smoke(
    q: Queries,
    target: str,
    monitor: str | None,
    now: datetime,
    metrics: dict[str, Metric],
    frame: Frame | None,
    end: float,
    start: datetime,
) -> tuple[Table, Chart] | None:
    """The smoke chart and its table; ``frame``: the probe's runs (for their outages)."""
    name, samples, loss_name = SMOKE
    if name not in metrics or loss_name not in metrics or frame is None:
        return None
    metric, loss = metrics[name], metrics[loss_name]
    since = max(now - SMOKE_WINDOW, start)
    docs = q.documents(metric.probe, target=target, monitor=monitor, since=since, until=now)
    rows = smoke_rows(docs, samples, loss.key)
    unit = _unit(metric.key)
    table = Table(
        "smoke",
        f"every packet's {metric.label.split(' (')[0]} per run (percentiles), last "
        f"{SMOKE_WINDOW.days} days",
        [
            col("started_at", "start of the run, UTC"),
            col("outcome", "ok, failed, timeout"),
            col(loss.key, loss.label),
            *(col(f"p{p}", f"{p}th percentile of the run's packets{unit}") for p in SMOKE_LEVELS),
            col("samples", "packets that came back"),
        ],
        rows,
    )
    chart = Chart(
        "smoke",
        # "RTT avg (ms)" → "RTT (ms)": the chart is of packets, not of the runs' means.
        f"smoke: every packet's {metric.label.split(' ')[0]} ({unit.strip('_')}) per run "
        "(bands: 0–100, 10–90, 25–75 %; dots: median coloured by loss)",
        "smoke",
        [r.started_at.timestamp() for r in rows],
        [Series(f"p{p}", [getattr(r, f"p{p}") for r in rows]) for p in SMOKE_LEVELS],
        "smoke",
        outages=[o for o in outages(frame, end) if o[1] >= since.timestamp()],
        extra={"loss": [r.loss_percent for r in rows]},
    )
    return table, chart


class RouteRow(NamedTuple):
    started_at: datetime
    hop_count: int | None
    route: str
    changed: int


class StatsRow(NamedTuple):
    metric: str
    median: float | None
    p25: float | None
    p75: float | None
    iqr: float | None
    mean: float | None
    stdev: float | None
    count: int
    runs: int
    success_rate: float


class HistogramRow(NamedTuple):
    bin_low: float
    bin_high: float
    count: int


class CdfRow(NamedTuple):
    value: float
    fraction: float


class FactRow(NamedTuple):
    fact: str
    value: Any


@dataclass
class TargetPage:
    target: str
    monitor: str | None
    monitors: list[tuple[str, int]]
    since: datetime
    until: datetime
    tables: dict[str, Table]
    charts: list[Chart]
    counts: dict[str, int]  # runs per probe in the window
    result_tables: list[str]  # one per probe with metrics


def route_rows(docs: list[tuple[datetime, str, dict[str, Any]]]) -> list[RouteRow]:
    """Each successful traceroute; ``changed`` is 1 when the route differs from the ones
    before it (a silent hop matches any address: analysis.cause.route_changes)."""
    ok = [(started, data) for started, outcome, data in docs if outcome == "ok"]
    routes = [hop_addresses(data) for _started, data in ok]
    return [
        RouteRow(started, data.get("hop_count"), route_text(route), 1 if changed else 0)
        for (started, data), route, changed in zip(ok, routes, route_changes(routes), strict=True)
    ]


def _columns_of(probe: str) -> dict[str, str]:
    module = PROBES.get(probe)
    return {c.name: c.description for c in module.COLUMNS} if module is not None else {}


def series_table(probe: str, frame: Frame, metrics: list[Metric]) -> Table:
    """Every run of ``probe`` in the window with its metrics (empty when it failed)."""
    described = _columns_of(probe)
    keys = [m.key for m in metrics]
    return Table(
        probe,
        f"{probe} results",
        [col("started_at", "start of the run, UTC"), col("outcome", "ok, failed, timeout, skipped")]
        + [col(m.key, described.get(m.key, m.label)) for m in metrics],
        [
            (at(frame.t[i]), frame.outcome[i], *(num(frame.values[k][i]) for k in keys))
            for i in range(len(frame))
        ],
    )


def stats_table(frames: dict[str, Frame], metrics: list[Metric]) -> Table:
    rows = []
    for metric in metrics:
        frame = frames.get(metric.probe)
        if frame is None or len(frame) == 0:
            continue
        ok = frame.ok()
        values = frame.values[metric.key][ok]
        count = int(np.isfinite(values).sum())
        share = float(ok.sum()) / len(frame)
        rows.append(StatsRow(metric.name, *describe(values), count, len(frame), share))
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


def _unit(key: str) -> str:
    return next((u for u in UNIT if key.endswith(u)), "")


def histogram(values: FloatArray) -> list[HistogramRow]:
    v = values[np.isfinite(values)]
    if not len(v):
        return []
    bins = min(40, max(5, int(math.sqrt(len(v)))))
    counts, edges = np.histogram(v, bins=bins)
    return [
        HistogramRow(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)
    ]


def histogram_table(rows: list[HistogramRow], metric: Metric) -> Table:
    stem = metric.key.removesuffix(_unit(metric.key))
    unit = _unit(metric.key)
    return Table(
        f"{stem}_histogram",
        f"histogram of {metric.name}",
        [
            col(f"bin_low{unit}", f"lower edge of the bin, {metric.label} (inclusive)"),
            col(
                f"bin_high{unit}",
                f"upper edge of the bin, {metric.label} (exclusive; the last inclusive)",
            ),
            col("count", "successful runs in the bin"),
        ],
        [tuple(r) for r in rows],  # plain rows: the edges' columns carry the metric's unit
    )


def cdf(values: FloatArray) -> list[CdfRow]:
    v = np.sort(values[np.isfinite(values)])
    return [CdfRow(float(x), (i + 1) / len(v)) for i, x in enumerate(v)]


def cdf_table(rows: list[CdfRow], metric: Metric) -> Table:
    return Table(
        f"{metric.key.split('_')[0]}_cdf",
        f"cumulative distribution of {metric.name}",
        [
            col(metric.key, f"{metric.label} of a run"),
            col("fraction", "share of successful runs with this value or less"),
        ],
        [tuple(r) for r in rows],  # plain rows: the first column is named by the metric
    )


def facts_table(doc: tuple[datetime, str, dict[str, Any]] | None) -> Table:
    rows: list[FactRow] = []
    if doc is not None:
        started, _outcome, data = doc
        rows.append(FactRow("measured_at", started))
        for key in sorted(data):
            value = data[key]
            if key in ("unreadable",):
                continue
            if key == "nics" and isinstance(value, dict):
                for nic, facts in sorted(value.items()):
                    if isinstance(facts, dict):
                        text = ", ".join(f"{k}={v}" for k, v in sorted(facts.items()))
                        rows.append(FactRow(f"nic {nic}", text))
                continue
            if isinstance(value, list):
                value = " ".join(str(x) for x in value)
            rows.append(FactRow(key, value))
    return Table(
        "host_facts",
        f"host facts from the latest {HOST_PROBE} result",
        [col("fact", "name, unit in the name"), col("value", "value")],
        rows,
    )


def _plotted(frame: Frame, metric: Metric) -> list[float]:
    """A metric's value per run as charted: a failed run at the metric's down value (a dead
    ping at 100 % loss), or a gap when it stands for nothing (a failed iperf3 has no rate)."""
    out = []
    for value, ok in zip(frame.values[metric.key], frame.ok(), strict=True):
        shown = run_value(metric, bool(ok), value)
        out.append(math.nan if shown is None else shown)
    return out


def outages(frame: Frame, end: float) -> list[tuple[float, float, str]]:
    """The periods a probe's runs failed (skipped runs measured nothing: they neither start
    nor end one): from the first failed run's start to the next success's, or to ``end``."""
    out: list[tuple[float, float, str]] = []
    start: float | None = None
    reason = ""
    for t, outcome, error in zip(frame.t, frame.outcome, frame.error, strict=True):
        if outcome == "skipped":
            continue
        if outcome != "ok" and start is None:
            start, reason = float(t), f"{outcome}: {error or 'no reason recorded'}"
        elif outcome == "ok" and start is not None:
            out.append((start, float(t), reason))
            start = None
    if start is not None:
        out.append((start, max(end, start), reason))
    return out


def _charts(
    frames: dict[str, Frame],
    metrics: dict[str, Metric],
    events: list[float],
    marks: Callable[..., list[tuple[float, str]]],
    end: float,
) -> list[Chart]:
    """The layout's charts, then one per registered probe the layout does not chart."""
    charts = []
    charted: set[str] = {ROUTE_PROBE}  # its chart is the routes' (below)
    for layout in LAYOUT:
        placed = [(metrics[name], axis) for name, axis in layout.series if name in metrics]
        if not placed:
            continue
        frame = frames[placed[0][0].probe]
        charted.add(placed[0][0].probe)
        charts.append(
            Chart(
                layout.id,
                layout.title,
                "time",
                list(frame.t),
                [Series(m.key, _plotted(frame, m), axis) for m, axis in placed],
                placed[0][0].probe,
                events=events,
                alerts=marks(*(m.name for m, _axis in placed)),
                outages=outages(frame, end),
            )
        )
    for probe, frame in frames.items():
        if probe in charted:
            continue
        mine = [m for m in metrics.values() if m.probe == probe]
        units = list(dict.fromkeys(_unit(m.key) for m in mine))
        charts.append(
            Chart(
                probe,
                f"{probe}: " + ", ".join(m.label for m in mine),
                "time",
                list(frame.t),
                [
                    Series(m.key, _plotted(frame, m), min(3, 1 + units.index(_unit(m.key))))
                    for m in mine
                ],
                probe,
                events=events,
                alerts=marks(*(m.name for m in mine)),
                outages=outages(frame, end),
            )
        )
    return charts


# The time picker's windows (the charts' and tables' span; the year of weekly means stays).
WINDOWS = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
    "28d": HISTORY,
    "90d": timedelta(days=90),
    "365d": timedelta(days=365),
}


def target_page(
    q: Queries, target: str, monitor: str | None, now: datetime, span: timedelta = HISTORY
) -> TargetPage:
    """The page of ``target`` for the ``span`` before ``now`` (28 days unless picked)."""
    # The monitors of the last 28 days (cheap through the index), else of all time.
    monitors = q.target_monitors(target, since=now - HISTORY) or q.target_monitors(target)
    if monitor is None and monitors:
        monitor = monitors[0][0]
    since = now - span
    window = {"target": target, "monitor": monitor, "since": since, "until": now}
    metrics = all_metrics()
    by_probe: dict[str, list[Metric]] = {}
    for m in metrics.values():
        by_probe.setdefault(m.probe, []).append(m)
    frames = {
        probe: q.frame(probe, [m.key for m in ms], **window) for probe, ms in by_probe.items()
    }
    routes = route_rows(q.documents(ROUTE_PROBE, **window))
    events = [r.started_at.timestamp() for r in routes if r.changed]
    alert_total, alert_rows = q.alerts(target=target, until=now, limit=PAGE_ROWS)
    study_total, study_rows = q.studies(target=target, limit=PAGE_ROWS)

    def marks(*names: str) -> list[tuple[float, str]]:
        """This path's alerts on the metrics ``names`` whose change lies in the 28 days."""
        return [
            (a["change_at"].timestamp(), f"{alert_metric(a)} {a['direction']}: {a['cause']}")
            for a in alert_rows
            if alert_metric(a) in names
            and a["monitor"] == monitor
            and since <= a["change_at"] < now
        ]

    tables = [series_table(probe, frames[probe], ms) for probe, ms in by_probe.items()]
    result_tables = [t.name for t in tables]
    weekly_means, long_term = weekly(q, target, monitor, now)
    tables += [
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
        stats_table(frames, list(metrics.values())),
        weekly_means,
        facts_table(
            latest_document(q, HOST_PROBE, target, monitor)
            or latest_document(q, HOST_PROBE, target)
        ),
        alerts_table(alert_rows, alert_total, f"of {target}"),
        studies_table(study_rows, study_total),
    ]
    charts = _charts(frames, metrics, events, marks, now.timestamp())
    # The forecast with its interval and the diurnal fit (iepm.web.pages.predict).
    forecast_tables, forecast_charts = forecast_panel(frames, metrics, now)
    tables += forecast_tables
    charts += forecast_charts
    charts.append(
        Chart(
            "hops",
            "traceroute hops (vertical lines: route changes)",
            "time",
            [r.started_at.timestamp() for r in routes],
            [Series("hop_count", [r.hop_count for r in routes])],
            "routes",
            events=events,
        )
    )
    for name, chart_of in ((HISTOGRAM, _histogram_chart), (CDF, _cdf_chart)):
        if name in metrics:
            metric = metrics[name]
            frame = frames[metric.probe]
            table, chart = chart_of(frame.values[metric.key][frame.ok()], metric)
            tables.append(table)
            charts.append(chart)
    charts.append(long_term)
    passive = target_passive(q, target, since, now)  # flow records: source "passive"
    if passive is not None:
        tables.append(passive[0])
        charts.append(passive[1])
    smoke_probe = metrics[SMOKE[0]].probe if SMOKE[0] in metrics else None
    smoke_frame = frames.get(smoke_probe or "")
    smoke = _smoke(q, target, monitor, now, metrics, smoke_frame, now.timestamp(), since)
    if smoke is not None:
        tables.append(smoke[0])
        charts.insert(0, smoke[1])
    return TargetPage(
        target=target,
        monitor=monitor,
        monitors=monitors,
        since=since,
        until=now,
        tables={t.name: t for t in tables},
        charts=[c for c in charts if c.x],
        counts={probe: len(frame) for probe, frame in frames.items()},
        result_tables=result_tables,
    )


def _histogram_chart(values: FloatArray, metric: Metric) -> tuple[Table, Chart]:
    rows = histogram(values)
    table = histogram_table(rows, metric)
    chart = Chart(
        "histogram",
        f"{metric.label.split(' (')[0]} histogram (runs per bin)",
        "bars",
        [r.bin_low for r in rows],
        [Series("count", [r.count for r in rows])],
        table.name,
        x_label=f"{metric.label}, bin lower edge",
    )
    return table, chart


def _cdf_chart(values: FloatArray, metric: Metric) -> tuple[Table, Chart]:
    rows = cdf(values)
    table = cdf_table(rows, metric)
    chart = Chart(
        "cdf",
        f"CDF of {metric.label}",
        "line",
        [r.value for r in rows],
        [Series("fraction", [r.fraction for r in rows])],
        table.name,
        x_label=metric.key,
    )
    return table, chart

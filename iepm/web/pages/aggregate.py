"""The aggregation views of one target (after RTPL): the last 7 days, week and day means over a
year, means by time of day per weekday or per month, and monthly min/avg/max.

They are drawn for the metrics of ``AGG_METRICS`` (RTPL's RTT, loss and throughput, named by
metric); a metric whose probe is not registered is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import numpy as np

from iepm.analysis.statistics import (
    MONDAY_SHIFT_DAYS,
    WEEKDAYS,
    Group,
    Period,
    at,
    bucket_starts,
    group,
    weekday,
)
from iepm.probes import all_metrics
from iepm.probes.base import Column, Metric
from iepm.store.rollup import day_of, day_start
from iepm.web.queries import Frame, Queries
from iepm.web.tables import HISTORY, YEAR, Chart, Month, Series, Table, col, num

VIEWS = {
    "last7": "last 7 days",
    "weekly": "week means over a year",
    "daily": "day means over a year",
    "weekday": "means by time of day per weekday (one quarter)",
    "workday": "workday means by time of day, per month",
    "monthly": "monthly min/avg/max",
}
AGG_METRICS = ("ping.rtt_avg_ms", "ping.loss_percent", "iperf3.throughput_bps")
# The weekly means the target page draws over a year (the second on its own axis).
LONG_TERM = ("ping.rtt_avg_ms", "iperf3.throughput_bps")
# The monthly view: RTT min/avg/max, loss avg/max and throughput min/avg/max (RTPL's table).
RTT = ("ping.rtt_min_ms", "ping.rtt_avg_ms", "ping.rtt_max_ms")
LOSS = "ping.loss_percent"
THROUGHPUT = "iperf3.throughput_bps"


def agg_metrics() -> list[Metric]:
    """The registered metrics of the aggregation views."""
    known = all_metrics()
    return [known[name] for name in AGG_METRICS if name in known]


class PeriodFigures(NamedTuple):
    """One period: (successful runs with a value, their mean) per metric name."""

    start: datetime
    figures: dict[str, tuple[int, float | None]]


def period_columns(period: str, metrics: list[Metric]) -> list[Column]:
    """period_start, the mean of each metric, the successful runs of each probe (those with
    a value of its first metric)."""
    probes = list(dict.fromkeys(m.probe for m in metrics))
    return (
        [col("period_start", f"start of the {period}, UTC")]
        + [col(f"{m.key}_mean", f"mean {m.label}") for m in metrics]
        + [col(f"{p}_count", f"successful {p} runs") for p in probes]
    )


def period_table(
    name: str, title: str, period: str, metrics: list[Metric], periods: list[PeriodFigures]
) -> Table:
    firsts: dict[str, str] = {}  # probe → its first metric
    for m in metrics:
        firsts.setdefault(m.probe, m.name)
    return Table(
        name,
        title,
        period_columns(period, metrics),
        [
            (
                p.start,
                *(p.figures[m.name][1] for m in metrics),
                *(p.figures[first][0] for first in firsts.values()),
            )
            for p in periods
        ],
    )


def frame_periods(frame: Frame, period: Period, metrics: list[Metric]) -> list[PeriodFigures]:
    """Per period of the frame's successful runs."""
    ok = frame.ok()
    starts = bucket_starts(frame.t, period)
    grouped: dict[str, dict[float, Group]] = {}
    for m in metrics:
        mine = ok & np.array([p == m.probe for p in frame.probe], dtype=bool)
        grouped[m.name] = group(starts[mine], frame.values[m.key][mine])
    keys = sorted({k for g in grouped.values() for k in g})
    return [
        PeriodFigures(
            at(k),
            {name: (g[k].count, g[k].mean) if k in g else (0, None) for name, g in grouped.items()},
        )
        for k in keys
    ]


def weekly_periods(
    q: Queries, target: str, monitor: str | None, now: datetime, metrics: list[Metric]
) -> list[PeriodFigures]:
    """Week means over the year before ``now`` (from whole UTC days, computed in the
    database: the daily summaries, and the results for the partial days at either end)."""
    means = q.period_means(
        metrics,
        7 * 86400,
        MONDAY_SHIFT_DAYS * 86400,
        target=target,
        monitor=monitor,
        since=day_start(day_of(now - YEAR)),
        until=now,
    )
    return [
        PeriodFigures(at(p.start), {m.name: f for m, f in zip(metrics, p.figures, strict=True)})
        for p in means
    ]


def weekly(q: Queries, target: str, monitor: str | None, now: datetime) -> tuple[Table, Chart]:
    """The target page's weekly means over a year: the table (every aggregated metric) and
    the chart of ``LONG_TERM`` (the second on its own axis)."""
    metrics = agg_metrics()
    periods = weekly_periods(q, target, monitor, now, metrics)
    table = period_table("weekly", "weekly means", "week", metrics, periods)
    drawn = [m for m in metrics if m.name in LONG_TERM]
    chart = Chart(
        "longterm",
        "weekly means over a year",
        "time",
        [p.start.timestamp() for p in periods],
        [
            Series(f"{m.key}_mean", [p.figures[m.name][1] for p in periods], axis)
            for axis, m in enumerate(drawn, start=1)
        ],
        table.name,
        sync="year",  # a year's scale of its own, below the window's charts
    )
    return table, chart


class MonthRow(NamedTuple):
    month: Month
    rtt_min_ms: float | None
    rtt_avg_ms: float | None
    rtt_max_ms: float | None
    loss_percent_avg: float | None
    loss_percent_max: float | None
    throughput_bps_min: float | None
    throughput_bps_avg: float | None
    throughput_bps_max: float | None
    ping_count: int
    iperf3_count: int


def monthly_table(frame: Frame) -> Table:
    ok = frame.ok()
    known = all_metrics()
    starts = bucket_starts(frame.t, "month")

    def of(name: str) -> dict[float, Group]:
        m = known[name]
        mine = ok & np.array([p == m.probe for p in frame.probe], dtype=bool)
        return group(starts[mine], frame.values[m.key][mine])

    lo, avg, hi = (of(n) for n in RTT)
    loss, thr = of(LOSS), of(THROUGHPUT)
    rows = []
    for key in sorted(set(avg) | set(thr)):
        rows.append(
            MonthRow(
                Month(at(key)),
                lo[key].min if key in lo else None,
                avg[key].mean if key in avg else None,
                hi[key].max if key in hi else None,
                loss[key].mean if key in loss else None,
                loss[key].max if key in loss else None,
                thr[key].min if key in thr else None,
                thr[key].mean if key in thr else None,
                thr[key].max if key in thr else None,
                avg[key].count if key in avg else 0,
                thr[key].count if key in thr else 0,
            )
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


@dataclass
class HourMeans:
    """Mean of one metric by UTC hour of the day, per group of days (a column each)."""

    labels: list[str]
    means: list[dict[float, Group]]  # per label: hour → figures

    def table(self, name: str, title: str, metric: Metric) -> Table:
        return Table(
            name,
            title,
            [col("hour_utc", "hour of the day, UTC")]
            + [col(label, f"mean {metric.name} in this hour") for label in self.labels],
            [
                (hour, *(g[float(hour)].mean if float(hour) in g else None for g in self.means))
                for hour in range(24)
            ],
        )

    def chart(self, title: str, table: str) -> Chart:
        return Chart(
            "agg",
            title,
            "line",
            [float(hour) for hour in range(24)],
            [
                Series(label, [g[float(h)].mean if float(h) in g else None for h in range(24)])
                for label, g in zip(self.labels, self.means, strict=True)
            ],
            table,
            x_label="hour of day (UTC)",
        )


def hour_means(frame: Frame, metric: Metric, groups: list[tuple[str, Any]]) -> HourMeans:
    """``groups``: (column label, boolean mask over the frame)."""
    ok = frame.ok() & np.array([p == metric.probe for p in frame.probe], dtype=bool)
    hours = np.floor((frame.t % 86400) / 3600)
    values = frame.values[metric.key]
    return HourMeans(
        [label for label, _mask in groups],
        [group(hours[ok & mask], values[ok & mask]) for _label, mask in groups],
    )


class PointRow(NamedTuple):
    started_at: datetime
    value: float | None


@dataclass
class AggregatePage:
    target: str
    monitor: str | None
    monitors: list[tuple[str, int]]
    view: str
    metric: str
    tables: dict[str, Table]
    charts: list[Chart]


def aggregate_page(
    q: Queries, target: str, monitor: str | None, view: str, metric_name: str, now: datetime
) -> AggregatePage:
    # The monitors of the last 28 days (cheap through the index), else of all time.
    monitors = q.target_monitors(target, since=now - HISTORY) or q.target_monitors(target)
    if monitor is None and monitors:
        monitor = monitors[0][0]
    known = all_metrics()
    metric = known[metric_name]
    metrics = agg_metrics()
    wanted = [known[n] for n in (*AGG_METRICS, *RTT) if n in known]
    span = timedelta(days=7) if view == "last7" else YEAR
    frame = q.frame(
        sorted({m.probe for m in wanted}),
        sorted({m.key for m in wanted}),
        target=target,
        monitor=monitor,
        since=now - span,
        until=now,
    )
    charts: list[Chart] = []
    tables: list[Table] = []
    if view in ("last7", "weekly", "daily"):
        if view == "last7":
            ok = frame.ok() & np.array([p == metric.probe for p in frame.probe], dtype=bool)
            points = [
                PointRow(at(frame.t[i]), num(frame.values[metric.key][i]))
                for i in np.flatnonzero(ok)
            ]
            tables.append(
                Table(
                    "points",
                    f"{metric.name}, every successful run of the last 7 days",
                    [col("started_at", "start of the run, UTC"), col(metric.name, metric.label)],
                    [tuple(p) for p in points],  # plain rows: the value's column is the metric
                )
            )
            charts.append(
                Chart(
                    "agg",
                    f"{metric.label}, last 7 days",
                    "time",
                    [p.started_at.timestamp() for p in points],
                    [Series(metric.name, [p.value for p in points])],
                    "points",
                )
            )
            periods = frame_periods(frame, "day", metrics)
            tables.append(period_table("days", "day means, last 7 days", "day", metrics, periods))
        else:
            period: Period = "week" if view == "weekly" else "day"
            periods = frame_periods(frame, period, metrics)
            title = f"{period} means over a year"
            tables.append(period_table(view, title, period, metrics, periods))
            charts.append(
                Chart(
                    "agg",
                    f"{period} means of {metric.label}",
                    "time",
                    [p.start.timestamp() for p in periods],
                    [Series(f"{metric.name} mean", [p.figures[metric.name][1] for p in periods])],
                    view,
                )
            )
    elif view == "monthly":
        table = monthly_table(frame)
        rows: list[MonthRow] = list(table.rows)  # type: ignore[arg-type]
        tables.append(table)
        charts.append(
            Chart(
                "agg",
                "monthly RTT min/avg/max (ms)",
                "time",
                [r.month.start.timestamp() for r in rows],
                [
                    Series("rtt_min_ms", [r.rtt_min_ms for r in rows]),
                    Series("rtt_avg_ms", [r.rtt_avg_ms for r in rows]),
                    Series("rtt_max_ms", [r.rtt_max_ms for r in rows]),
                ],
                "monthly",
            )
        )
    else:
        days = weekday(frame.t)
        if view == "weekday":
            # The latest quarter with data: RTPL compared weekdays within one season.
            quarter_start = _quarter_start(at(frame.t[-1]) if len(frame) else now)
            in_quarter = frame.t >= quarter_start.timestamp()
            groups = [(WEEKDAYS[d], in_quarter & (days == d)) for d in range(7)]
            title = f"mean {metric.name} by hour, per weekday, quarter from {quarter_start:%Y-%m}"
        else:
            months = bucket_starts(frame.t, "month")
            groups = [(str(Month(at(m))), (days < 5) & (months == m)) for m in sorted(set(months))]
            title = f"mean {metric.name} by hour over workdays, per month"
        means = hour_means(frame, metric, groups)
        tables.append(means.table(view, title, metric))
        charts.append(means.chart(title, view))
    return AggregatePage(
        target=target,
        monitor=monitor,
        monitors=monitors,
        view=view,
        metric=metric_name,
        tables={t.name: t for t in tables},
        charts=[c for c in charts if c.x],
    )


def _quarter_start(moment: datetime) -> datetime:
    return datetime(moment.year, 3 * ((moment.month - 1) // 3) + 1, 1, tzinfo=UTC)

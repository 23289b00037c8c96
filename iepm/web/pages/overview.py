"""The overview: every path's latest headline figures against its own last 28 days, runs by
outcome, cycles, recent alerts and the route map; targets grouped by their group and site."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from iepm.analysis.cause import ROUTE_PROBE
from iepm.analysis.statistics import at, share_better
from iepm.probes import all_metrics
from iepm.probes.base import Metric
from iepm.web.health import Thresholds, Verdict, judge
from iepm.web.pages.routes import RouteMap, route_map
from iepm.web.places import GROUP_TEXT, NOWHERE, SITE_TEXT, Places, sort_key
from iepm.web.queries import Queries
from iepm.web.tables import HISTORY, PAGE_ROWS, Table, alerts_table, col, num

# Results started up to this long after ``now`` still count as its latest (clock skew).
AHEAD = timedelta(minutes=5)


def headline_metrics() -> list[Metric]:
    """What the overview grid colours each path by: the registry's headline metrics."""
    return [m for m in all_metrics().values() if m.headline]


def capacity_metric() -> Metric | None:
    """The figure the route map labels each target with: the first headline metric that is
    better higher (a path's capacity: throughput)."""
    return next((m for m in headline_metrics() if m.better == "higher"), None)


# A latest value worse than this share of its path's own 28 days is marked unusual (beside
# the colour, which the thresholds decide).
UNUSUAL = 0.9
COLOUR = {"ok": "good", "warn": "fair", "critical": "poor", "nodata": "nodata"}


@dataclass
class Cell:
    metric: Metric
    started_at: datetime
    outcome: str
    value: float | None
    share_better: float | None
    count: int
    verdict: Verdict
    error: str | None = None

    @property
    def status(self) -> str:
        """The cell's colour: failed, or the thresholds' verdict (good, fair, poor, nodata)."""
        return "failed" if self.outcome != "ok" else COLOUR[self.verdict.status]

    @property
    def unusual(self) -> bool:
        """Worse than UNUSUAL of its own last 28 days: the path's second mark."""
        return self.share_better is not None and self.share_better >= UNUSUAL


class TargetLine(NamedTuple):
    """A row of the grid: a target, its place, and whether it opens its group."""

    target: str
    site: str | None
    group: str | None
    opens_group: bool


class GridRow(NamedTuple):
    monitor: str
    target: str
    metric: str
    started_at: datetime
    outcome: str
    value: float | None
    share_better: float | None
    count_28d: int
    age_s: int
    group: str | None
    site: str | None
    health: str
    reference: float | None
    error: str | None


class OutcomeRow(NamedTuple):
    monitor: str
    probe: str
    ok: int
    failed: int
    timeout: int
    skipped: int


class CycleRow(NamedTuple):
    monitor: str
    cycles: int
    overruns: int


@dataclass
class Overview:
    headline: list[Metric]
    monitors: list[str]
    lines: list[TargetLine]
    cells: dict[tuple[str, str], dict[str, Cell]]
    silent: list[str]
    routes: RouteMap
    tables: dict[str, Table]

    @property
    def targets(self) -> list[str]:
        return [line.target for line in self.lines]

    @property
    def headline_probes(self) -> list[str]:
        return list(dict.fromkeys(m.probe for m in self.headline))


def overview(
    q: Queries,
    now: datetime,
    places: Places,
    *,
    ahead: bool = False,
    thresholds: Thresholds | None = None,
) -> Overview:
    """The overview of the 28 days before ``now``; ``ahead``: also results started up to AHEAD
    after it (a live page, whose clock may trail a monitor's; never a page asked for a past
    moment, which must show nothing after it). Cells are coloured by ``thresholds`` (the
    registry's defaults with a site's overrides)."""
    thresholds = thresholds or Thresholds()
    since = now - HISTORY
    end = now + AHEAD if ahead else now
    headline = headline_metrics()
    keys = sorted({m.key for m in headline})
    probes = sorted({m.probe for m in headline})
    frame = q.frame(probes, keys, since=since, until=end)
    paths: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for i in range(len(frame)):
        paths[(frame.monitor[i], frame.target[i], frame.probe[i])].append(i)
    ok = frame.ok()
    cells: dict[tuple[str, str], dict[str, Cell]] = defaultdict(dict)
    for (monitor, target, probe), idx in paths.items():
        ids = np.array(idx)
        last = ids[-1]
        for metric in headline:
            if metric.probe != probe:
                continue
            vals = frame.values[metric.key][ids]
            history = vals[ok[ids] & np.isfinite(vals)]
            latest = frame.values[metric.key][last] if ok[last] else math.nan
            rule = thresholds.rule(metric, target, places.get(target, NOWHERE).group)
            cells[(monitor, target)][metric.name] = Cell(
                metric=metric,
                started_at=at(frame.t[last]),
                outcome=frame.outcome[last],
                value=num(latest),
                share_better=(
                    share_better(history, latest, metric.better) if math.isfinite(latest) else None
                ),
                count=len(history),
                verdict=judge(metric, rule, num(latest), history),
                error=frame.error[last],
            )
    monitors = sorted({m for m, _ in cells})
    targets = sorted({t for _, t in cells}, key=lambda t: sort_key(places, t))
    lines = []
    for i, target in enumerate(targets):
        place = places.get(target, NOWHERE)
        before = places.get(targets[i - 1], NOWHERE).group if i else None
        lines.append(
            TargetLine(target, place.site, place.group, bool(place.group) and place.group != before)
        )
    rows = [
        GridRow(
            monitor,
            target,
            name,
            cell.started_at,
            cell.outcome,
            cell.value,
            cell.share_better,
            cell.count,
            round((now - cell.started_at).total_seconds()),
            places.get(target, NOWHERE).group,
            places.get(target, NOWHERE).site,
            cell.status,
            cell.verdict.reference,
            cell.error,
        )
        for (monitor, target), by_metric in sorted(cells.items())
        for name, cell in by_metric.items()
    ]
    grid = Table(
        "paths",
        "latest result per path: health by thresholds, and against its own last 28 days",
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
            col("group", GROUP_TEXT),
            col("site", SITE_TEXT),
            col("health", "good, fair, poor by the metric's thresholds; failed; nodata"),
            col("reference", "baseline or expected rate the thresholds judged against"),
            col("error", "why the latest run failed (empty when it did not)"),
        ],
        rows,
    )
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for monitor, probe, outcome, n in q.outcome_counts(since=since, until=now):
        counts[(monitor, probe)][outcome] += n
    outcomes = Table(
        "outcomes",
        "runs by outcome in the last 28 days",
        [col("monitor", "monitoring host"), col("probe", "probe")]
        + [col(o, f"runs that ended {o}") for o in OutcomeRow._fields[2:]],
        [
            OutcomeRow(m, p, *(c.get(o, 0) for o in OutcomeRow._fields[2:]))
            for (m, p), c in sorted(counts.items())
        ],
    )
    cycles = Table(
        "cycles",
        "scheduler cycles (whole archive)",
        [
            col("monitor", "monitoring host"),
            col("cycles", "cycles recorded"),
            col("overruns", "cycles longer than their interval"),
        ],
        [CycleRow(*r) for r in q.cycle_counts()],
    )
    silent = sorted(set(q.targets()) - set(targets))
    capacity = capacity_metric()
    means: dict[tuple[str, str], float] = {}
    for (monitor, target, probe), idx in paths.items():
        if capacity is not None and probe == capacity.probe:
            ids = np.array(idx)
            values = frame.values[capacity.key][ids][ok[ids]]
            values = values[np.isfinite(values)]
            if len(values):
                means[(monitor, target)] = float(values.mean())
    routes = route_map(
        q.latest(ROUTE_PROBE, None, since, end),
        means,
        capacity.name if capacity is not None else "capacity",
        places,
    )
    alert_total, alert_rows = q.alerts(since=since, until=now, limit=PAGE_ROWS)
    alerts = alerts_table(alert_rows, alert_total, "in the last 28 days")
    tables = (grid, outcomes, cycles, alerts, routes.links, routes.paths)
    return Overview(
        headline=headline,
        monitors=monitors,
        lines=lines,
        cells=cells,
        silent=silent,
        routes=routes,
        tables={t.name: t for t in tables},
    )

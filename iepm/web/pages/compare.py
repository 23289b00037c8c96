"""The compare page: one metric against another, as one point per path (28-day medians) or one
per pair of runs of one target, with a least-squares fit through the origin."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np

from iepm.analysis.statistics import FloatArray, at, through_origin
from iepm.probes import metric as metric_named
from iepm.probes.base import Metric
from iepm.web.queries import Frame, Queries
from iepm.web.tables import HISTORY, Chart, Series, Table, col

Mode = Literal["targets", "time"]


class Point(NamedTuple):
    """A point: the path ("target (monitor)") or the start of the y run, and its x and y."""

    point: str | datetime
    x: float
    y: float


class FitRow(NamedTuple):
    slope: float | None
    r_squared: float | None
    n: int


@dataclass
class ComparePage:
    x: str
    y: str
    mode: Mode
    target: str | None
    slope: float | None
    r2: float | None
    tables: dict[str, Table]
    charts: list[Chart]


def _of(frame: Frame, ids: Any, metric: Metric) -> FloatArray:
    mine = np.array([frame.probe[i] == metric.probe for i in ids], dtype=bool)
    values = frame.values[metric.key][ids][mine]
    return values[np.isfinite(values)]


def _path_points(frame: Frame, x_metric: Metric, y_metric: Metric) -> list[Point]:
    by_path: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i in np.flatnonzero(frame.ok()):
        by_path[(frame.target[i], frame.monitor[i])].append(int(i))
    points = []
    for (tgt, mon), idx in sorted(by_path.items()):
        ids = np.array(idx)
        xs, ys = _of(frame, ids, x_metric), _of(frame, ids, y_metric)
        if len(xs) and len(ys):
            points.append(Point(f"{tgt} ({mon})", float(np.median(xs)), float(np.median(ys))))
    return points


def _run_points(frame: Frame, x_metric: Metric, y_metric: Metric, pair_s: float) -> list[Point]:
    ok = np.flatnonzero(frame.ok())
    xi = np.array([i for i in ok if frame.probe[i] == x_metric.probe])
    yi = np.array([i for i in ok if frame.probe[i] == y_metric.probe])
    xi = xi[np.isfinite(frame.values[x_metric.key][xi])] if len(xi) else xi
    yi = yi[np.isfinite(frame.values[y_metric.key][yi])] if len(yi) else yi
    xv, yv = frame.values[x_metric.key], frame.values[y_metric.key]
    if x_metric.probe == y_metric.probe:
        # Two figures of one probe: each run is a point.
        return [Point(at(frame.t[j]), float(xv[j]), float(yv[j])) for j in np.intersect1d(xi, yi)]
    points = []
    if len(xi) and len(yi):
        xt = frame.t[xi]
        for j in yi:
            k = int(np.argmin(np.abs(xt - frame.t[j])))
            if abs(xt[k] - frame.t[j]) <= pair_s:
                points.append(Point(at(frame.t[j]), float(xv[xi[k]]), float(yv[j])))
    return points


def compare_page(
    q: Queries,
    x_name: str,
    y_name: str,
    mode: Mode,
    target: str | None,
    now: datetime,
    pair_s: float = 3600.0,
) -> ComparePage:
    """Scatter of two metrics: one point per target×monitor (medians over 28 days), or one per
    pair of runs against one target no more than ``pair_s`` apart (same cycle)."""
    x_metric, y_metric = metric_named(x_name), metric_named(y_name)
    probes = sorted({x_metric.probe, y_metric.probe})
    keys = sorted({x_metric.key, y_metric.key})
    frame = q.frame(
        probes, keys, target=target if mode == "time" else None, since=now - HISTORY, until=now
    )
    if mode == "targets":
        points = _path_points(frame, x_metric, y_metric)
    else:
        points = _run_points(frame, x_metric, y_metric, pair_s)
    x = np.array([p.x for p in points], dtype=float)
    y = np.array([p.y for p in points], dtype=float)
    slope, r2 = through_origin(x, y)
    label = "path (target, monitor)" if mode == "targets" else "started_at of the y run, UTC"
    table = Table(
        "points",
        f"{y_name} against {x_name}",
        [col("point", label), col(x_name, x_metric.label), col(y_name, y_metric.label)],
        [tuple(p) for p in points],  # plain rows: the x and y columns are named by the metrics
    )
    fit = Table(
        "fit",
        "least-squares fit through the origin",
        [
            col("slope", f"b in {y_name} = b * {x_name}"),
            col("r_squared", "1 - SSE / sum of squares about the mean of y"),
            col("n", "points"),
        ],
        [FitRow(slope, r2, len(points))],
    )
    order = np.argsort(x, kind="stable")
    # A first point at x = 0 (no observation) starts the fit line at the origin.
    xs = [0.0, *(float(v) for v in x[order])]
    chart = Chart(
        "scatter",
        f"{y_metric.label} against {x_metric.label}",
        "scatter",
        xs,
        [
            Series(y_name, [None, *(float(v) for v in y[order])]),
            Series("fit through origin", [None if slope is None else slope * v for v in xs]),
        ],
        "points",
        x_label=x_name,
        note="" if slope is None else f"y = {slope:.4g}·x, R² = {r2:.3f}" if r2 is not None else "",
    )
    return ComparePage(
        x=x_name,
        y=y_name,
        mode=mode,
        target=target,
        slope=slope,
        r2=r2,
        tables={"points": table, "fit": fit},
        charts=[chart] if points else [],
    )

"""The compare page: one metric against another, as one point per path (28-day medians) or one
per pair of runs of one target, with a least-squares fit.

The default fit assumes no direction: a power law y = a·x^b (a line in log-log, so b < 0 when
y falls as x grows: TCP throughput ∝ 1/RTT, Mathis et al.) when every value is positive, else
a straight line with an intercept. Either has R² ≥ 0 by construction; the fit through the
origin (y = b·x, which assumes y grows with x) is there when asked for."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np

from iepm.analysis.statistics import FloatArray, at, through_origin
from iepm.probes import PROBES
from iepm.probes import metric as metric_named
from iepm.probes.base import Metric, Probe
from iepm.web.queries import Frame, Queries
from iepm.web.tables import HISTORY, Chart, Series, Table, col

Mode = Literal["targets", "time"]
Fit = Literal["auto", "power", "linear", "origin"]


class Point(NamedTuple):
    """A point: the path ("target (monitor)") or the start of the y run, and its x and y."""

    point: str | datetime
    x: float
    y: float


class FitRow(NamedTuple):
    model: str
    slope: float | None
    intercept: float | None
    coefficient: float | None
    exponent: float | None
    r_squared: float | None
    n: int

    def at(self, x: float) -> float | None:
        """The fitted y at ``x`` (None where the model has none)."""
        if self.model == "power":
            if self.coefficient is None or self.exponent is None or x <= 0:
                return None
            return self.coefficient * x**self.exponent
        if self.slope is None:
            return None
        return (self.intercept or 0.0) + self.slope * x

    @property
    def text(self) -> str:
        r2 = "" if self.r_squared is None else f", R² = {self.r_squared:.3f}"
        if self.model == "power" and self.coefficient is not None:
            return f"y = {self.coefficient:.4g}·x^{self.exponent:.3g}{r2} (log-log)"
        if self.model == "linear" and self.slope is not None:
            return f"y = {self.intercept:.4g} + {self.slope:.4g}·x{r2}"
        if self.slope is not None:
            return f"y = {self.slope:.4g}·x{r2}"
        return ""


def fit_points(x: FloatArray, y: FloatArray, model: Fit) -> FitRow:
    """The least-squares fit ``model`` asks for ("auto": power law when every value is
    positive and there are 3 points, else a line with an intercept)."""
    n = len(x)
    if model == "auto":
        model = "power" if n >= 3 and bool(np.all(x > 0) and np.all(y > 0)) else "linear"
    if model == "origin":
        slope, r2 = through_origin(x, y)
        return FitRow("origin", slope, None, None, None, r2, n)
    if model == "power":
        keep = (x > 0) & (y > 0)
        if keep.sum() < 2 or np.ptp(np.log(x[keep])) == 0:
            return FitRow("power", None, None, None, None, None, n)
        b, log_a, r2 = _line(np.log(x[keep]), np.log(y[keep]))
        return FitRow("power", None, None, float(np.exp(log_a)), b, r2, int(keep.sum()))
    if n < 2 or np.ptp(x) == 0:
        return FitRow("linear", None, None, None, None, None, n)
    slope, intercept, r2 = _line(x, y)
    return FitRow("linear", slope, intercept, None, None, r2, n)


def _line(x: FloatArray, y: FloatArray) -> tuple[float, float, float | None]:
    """Ordinary least squares y = c + m·x: (m, c, R²)."""
    m, c = np.polyfit(x, y, 1)
    sst = float(np.sum((y - y.mean()) ** 2))
    sse = float(np.sum((y - (c + m * x)) ** 2))
    return float(m), float(c), (1.0 - sse / sst) if sst > 0 else None


@dataclass
class ComparePage:
    x: str
    y: str
    mode: Mode
    target: str | None
    fit: FitRow
    tables: dict[str, Table]
    charts: list[Chart]
    # The seed's comparisons (links to each scatter) with their figures, from the registry.
    seed: list[SeedRow]


# --- the seed's comparisons (IEPM-BW Fig. 8) ----------------------------------------------------


class Comparison(NamedTuple):
    title: str
    x: str
    y: str


class SeedRow(NamedTuple):
    """One comparison over the paths: y = a·x through the origin (the seed's fit), its R², and
    the quartiles of y / x per path (the seed: bbcp memory copies at 58-96% of iperf's)."""

    comparison: str
    x: str
    y: str
    paths: int
    a: float | None
    r_squared: float | None
    ratio_p25: float | None
    ratio_median: float | None
    ratio_p75: float | None


def _rate(probe: Probe) -> Metric | None:
    """A probe's headline rate: its first metric in bit/s."""
    return next((m for m in probe.METRICS if m.key.endswith("_bps")), None)


def seed_comparisons() -> list[Comparison]:
    """From the registry: every network throughput probe (exclusive, server-backed, not a copy:
    iperf3) against every memory-to-memory copy, and every memory copy against the disk copy
    of the same tool."""
    probes = list(PROBES.values())
    networks = [
        p for p in probes if p.META.scheduling == "exclusive" and p.META.server and not p.META.copy
    ]
    memory = [p for p in probes if p.META.copy == "memory"]
    disk = [p for p in probes if p.META.copy == "disk"]
    found = []
    for net in networks:
        for mem in memory:
            x, y = _rate(net), _rate(mem)
            if x is not None and y is not None:
                found.append(Comparison(f"{net.NAME} vs memory copy ({mem.TOOL})", x.name, y.name))
    for mem in memory:
        for dsk in (d for d in disk if d.TOOL == mem.TOOL):
            x, y = _rate(mem), _rate(dsk)
            if x is not None and y is not None:
                found.append(Comparison(f"memory vs disk copy ({mem.TOOL})", x.name, y.name))
    return found


def seed_rows(q: Queries, now: datetime) -> list[SeedRow]:
    comparisons = seed_comparisons()
    named = {name: metric_named(name) for c in comparisons for name in (c.x, c.y)}
    if not named:
        return []
    probes = sorted({m.probe for m in named.values()})
    keys = sorted({m.key for m in named.values()})
    frame = q.frame(probes, keys, target=None, since=now - HISTORY, until=now)
    rows = []
    for c in comparisons:
        points = _path_points(frame, named[c.x], named[c.y])
        x = np.array([p.x for p in points], dtype=float)
        y = np.array([p.y for p in points], dtype=float)
        a = r2 = None
        if len(points) >= 2:
            a, r2 = through_origin(x, y)
        ratio = y[x > 0] / x[x > 0]
        quartiles = (
            [float(v) for v in np.percentile(ratio, [25, 50, 75])] if len(ratio) else [None] * 3
        )
        rows.append(SeedRow(c.title, c.x, c.y, len(points), a, r2, *quartiles))
    return rows


SEED_COLUMNS = [
    col("comparison", "what is set against what (the seed's Fig. 8 and its disk-copy finding)"),
    col("x", "metric on the x axis"),
    col("y", "metric on the y axis"),
    col("paths", "paths (target, monitor) with both, 28-day medians"),
    col("a", "slope of the fit y = a·x through the origin"),
    col("r_squared", "R² of that fit (1 - SSE / sum of squares about the mean)"),
    col("ratio_p25", "25th percentile over the paths of y / x"),
    col("ratio_median", "median over the paths of y / x"),
    col("ratio_p75", "75th percentile over the paths of y / x"),
]


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
    model: Fit = "auto",
) -> ComparePage:
    """Scatter of two metrics: one point per target×monitor (medians over 28 days), or one per
    pair of runs against one target no more than ``pair_s`` apart (same cycle), and the fit
    ``model``."""
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
    fitted = fit_points(x, y, model)
    label = "path (target, monitor)" if mode == "targets" else "started_at of the y run, UTC"
    table = Table(
        "points",
        f"{y_name} against {x_name}",
        [col("point", label), col(x_name, x_metric.label), col(y_name, y_metric.label)],
        [tuple(p) for p in points],  # plain rows: the x and y columns are named by the metrics
    )
    fit = Table(
        "fit",
        f"least-squares fit ({fitted.model})",
        [
            col("model", "power: y = a·x^b (in log-log); linear: y = c + m·x; origin: y = m·x"),
            col("slope", f"m in {y_name} = [c +] m * {x_name}"),
            col("intercept", "c of the linear fit"),
            col("coefficient", "a of the power law"),
            col("exponent", "b of the power law (negative: y falls as x grows)"),
            col("r_squared", "1 - SSE / sum of squares about the mean (of log y: power law)"),
            col("n", "points fitted"),
        ],
        [fitted],
    )
    order = np.argsort(x, kind="stable")
    # The line is drawn over a grid across the points (a curve for the power law), from the
    # origin for the fit through it; the grid's own x have no observation.
    low = 0.0 if fitted.model == "origin" or not len(x) else float(x.min())
    grid = np.linspace(low, float(x.max()), 48) if len(x) else np.array([])
    xs = np.concatenate([x[order], grid])
    ys = np.concatenate([y[order], np.full(len(grid), np.nan)])
    by_x = np.argsort(xs, kind="stable")
    xs, ys = xs[by_x], ys[by_x]
    chart = Chart(
        "scatter",
        f"{y_metric.label} against {x_metric.label}",
        "scatter",
        [float(v) for v in xs],
        [
            Series(y_name, [None if np.isnan(v) else float(v) for v in ys]),
            Series(f"fit ({fitted.model})", [fitted.at(float(v)) for v in xs]),
        ],
        "points",
        x_label=x_name,
        note=fitted.text,
    )
    seed = seed_rows(q, now)
    seed_table = Table(
        "seed", "the seed's comparisons over the paths (IEPM-BW Fig. 8)", SEED_COLUMNS, seed
    )
    return ComparePage(
        x=x_name,
        y=y_name,
        mode=mode,
        target=target,
        fit=fitted,
        tables={"points": table, "fit": fit, "seed": seed_table},
        charts=[chart] if points else [],
        seed=seed,
    )

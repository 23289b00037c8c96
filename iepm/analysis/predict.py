"""Predictions per path, for the API, the pages and the CLI: a path's routine series read from
the archive, its forecast now and at a horizon with the 80% interval, the method chosen and its
recent error, its diurnal fit, the forecast-error table per host × probe (the IEPM-BW seeds'
Table 1) and the advice a data-movement service asks for before choosing a replica.

The algorithms are :mod:`iepm.analysis.forecast` and :mod:`iepm.analysis.diurnal`; this module
only chooses the series and summarises. Errors are relative, |f − o| / o, as
``benchmarks/forecast.py`` scores them (observations ≤ 0 have none); coverage is the share of
observations inside the 80% interval.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import Float, func, select

from iepm.analysis.diurnal import SineFit, fit_diurnal
from iepm.analysis.forecast import Forecast, forecast_next, walk_forward_all
from iepm.analysis.methods import START
from iepm.analysis.series import FloatArray
from iepm.errors import AnalysisError
from iepm.probes import PROBES, all_metrics
from iepm.probes.base import Metric
from iepm.results import Outcome
from iepm.store import Archive
from iepm.store.filters import result_conditions
from iepm.store.schema import results as RESULTS
from iepm.tuned import load_tuned

COVERAGE = 0.8
# The latest forecasts the "recent error" is measured on (about a week of hourly runs).
RECENT = 50
# At most this many of the latest samples are walked: the ensemble needs ~100 of the current
# level, and a year of 90-minute runs (5,800) would take a second per path.
MAX_SAMPLES = 2000
# Table 1's baselines beside the ensemble (the seeds' own forecasters).
TABLE_METHODS = ("ma5", "ewma", "auto")
THROUGHPUT = "iperf3.throughput_bps"


def find_metric(
    metric: str, probe: str | None = None, measured: Sequence[str] | None = None
) -> Metric:
    """A registered metric by name (``iperf3.throughput_bps``) or by key with its probe
    (``throughput_bps`` and ``iperf3``); a key several probes have is the one of the probes
    ``measured`` (those with results on the path) when that leaves one. AnalysisError naming
    the known ones otherwise."""
    known = all_metrics()
    if "." in metric:
        found = known.get(metric)
        if found is not None and probe not in (None, found.probe):
            raise AnalysisError(f"metric {metric!r} is not of probe {probe!r}")
    else:
        keyed = [m for m in known.values() if m.key == metric and probe in (None, m.probe)]
        if len(keyed) > 1 and measured is not None:
            keyed = [m for m in keyed if m.probe in measured] or keyed
        if len(keyed) > 1:
            probes = ", ".join(m.probe for m in keyed)
            raise AnalysisError(f"metric {metric!r} is measured by {probes}: name the probe")
        found = keyed[0] if keyed else None
    if found is None:
        if probe is not None and probe not in PROBES:
            raise AnalysisError(f"unknown probe {probe!r} (known: {', '.join(PROBES)})")
        raise AnalysisError(f"unknown metric {metric!r} (known: {', '.join(known)})")
    return found


@dataclass(frozen=True)
class PathSeries:
    """One metric of one path (monitor → target), routine results only, oldest first."""

    monitor: str
    target: str
    metric: Metric
    t: FloatArray
    y: FloatArray

    def __len__(self) -> int:
        return int(self.y.size)


def measured_probes(archive: Archive, target: str) -> list[str]:
    """Probes with routine results for ``target``."""
    query = select(RESULTS.c.probe).where(*result_conditions(target=target)).distinct()
    with archive.reading(f"cannot read the probes of {target}") as conn:
        return [row[0] for row in conn.execute(query)]


def path_monitors(archive: Archive, target: str, probe: str) -> list[str]:
    """Monitors with routine results of ``probe`` for ``target``, most results first."""
    query = (
        select(RESULTS.c.monitor, func.count())
        .where(*result_conditions(probe=probe, target=target))
        .group_by(RESULTS.c.monitor)
        .order_by(func.count().desc(), RESULTS.c.monitor)
    )
    with archive.reading(f"cannot read the monitors of {target}") as conn:
        return [row[0] for row in conn.execute(query)]


def read_path(
    archive: Archive,
    *,
    target: str,
    metric: Metric,
    monitor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = MAX_SAMPLES,
) -> PathSeries:
    """The latest ``limit`` samples (None: all) of ``metric`` on the path: successful routine
    runs (and failed ones whose value still counts, a ping with no reply); never a study's
    runs. ``monitor`` None: the one with most results for the target (a path has one monitor;
    series never mix them)."""
    if monitor is None:
        monitors = path_monitors(archive, target, metric.probe)
        if not monitors:
            raise AnalysisError(f"no routine {metric.probe} results for target {target!r}")
        monitor = monitors[0]
    value = RESULTS.c.data[metric.key].as_float().cast(Float)
    conditions = result_conditions(
        probe=metric.probe, target=target, monitor=monitor, since=since, until=until
    )
    if not metric.failed_runs:
        conditions.append(RESULTS.c.outcome == Outcome.OK.value)
    query = (
        select(RESULTS.c.started_at, value)
        .where(*conditions, value.is_not(None))
        .order_by(RESULTS.c.started_at.desc(), RESULTS.c.id.desc())
        .limit(limit)
    )
    with archive.reading(f"cannot read {metric.name} of {target}") as conn:
        rows = list(conn.execute(query))[::-1]
    pairs = [(r[0].timestamp(), float(r[1])) for r in rows if math.isfinite(r[1])]
    # Two runs can share a start second (a clock step): the walk needs time not to go back.
    t = np.array([p[0] for p in pairs], dtype=np.float64)
    y = np.array([p[1] for p in pairs], dtype=np.float64)
    return PathSeries(monitor, target, metric, t, y)


@dataclass(frozen=True)
class ErrorSummary:
    """How one method's forecasts did: relative errors and 80% interval coverage."""

    forecasts: int
    mean_relative_error: float
    median_relative_error: float
    p90_relative_error: float
    coverage: float

    def as_dict(self) -> dict[str, float | int | None]:
        return {k: _finite(v) for k, v in self.__dict__.items()}


def summarise(fcs: Sequence[Forecast]) -> ErrorSummary:
    obs = np.array([f.observed for f in fcs], dtype=np.float64)
    fc = np.array([f.forecast for f in fcs], dtype=np.float64)
    lo = np.array([f.lower for f in fcs], dtype=np.float64)
    hi = np.array([f.upper for f in fcs], dtype=np.float64)
    positive = obs > 0
    rel = np.abs(fc[positive] - obs[positive]) / obs[positive]
    nan = math.nan
    return ErrorSummary(
        len(fcs),
        float(np.mean(rel)) if rel.size else nan,
        float(np.median(rel)) if rel.size else nan,
        float(np.quantile(rel, 0.9)) if rel.size else nan,
        float(np.mean((lo <= obs) & (obs <= hi))) if len(fcs) else nan,
    )


@dataclass(frozen=True)
class Prediction:
    """A path's forecast for ``now`` and for ``now + horizon_s``, and how the ensemble did on
    the path's last ``RECENT`` measurements."""

    series: PathSeries
    horizon_s: float
    now: Forecast
    ahead: Forecast
    recent: ErrorSummary
    walk: list[Forecast]  # the ensemble's walk-forward forecasts of the series

    @property
    def last_at(self) -> float:
        return float(self.series.t[-1])


def _finite(v: float | int) -> float | int | None:
    return v if isinstance(v, int) or math.isfinite(v) else None


def predict(s: PathSeries, now: float, horizon_s: float) -> Prediction:
    """The ensemble's forecast at ``now`` (the next measurement; the last one's time if
    later) and at ``now + horizon_s``, from the whole series before them."""
    if len(s) < START + 1:
        raise AnalysisError(
            f"only {len(s)} sample(s) of {s.metric.name} on {s.monitor} → {s.target}; "
            f"at least {START + 1} are needed to forecast"
        )
    t, y = increasing(s.t, s.y)
    at_now = max(now, float(t[-1]))
    # One walk gives the history's forecasts and, from a dummy step at ``at_now`` (as
    # forecast_next does it), the next one: the dummy's value is never seen by a forecast.
    walk = walk_forward_all(
        np.append(t, at_now), np.append(y, y[-1]), coverage=COVERAGE, methods=("auto",)
    )["auto"]
    f = walk.pop()
    current = Forecast(f.index, f.t, math.nan, f.forecast, f.lower, f.upper, f.method)
    ahead = current
    if horizon_s > 0:
        ahead = forecast_next(t, y, at_now + horizon_s, coverage=COVERAGE)
    return Prediction(s, horizon_s, current, ahead, summarise(walk[-RECENT:]), walk)


def increasing(t: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Keep the first of samples that share a time (the analyses need time to move on)."""
    if t.size < 2:
        return t, y
    keep = np.concatenate(([True], np.diff(t) > 0))
    return t[keep], y[keep]


def diurnal(s: PathSeries, utc_offset_hours: float = 0.0) -> dict[str, SineFit]:
    """The weekday and weekend sine fits of the series (``fit_diurnal``)."""
    if len(s) < 2:
        raise AnalysisError(
            f"only {len(s)} sample(s) of {s.metric.name} on {s.monitor} → {s.target}; "
            "at least 2 are needed for a diurnal fit"
        )
    return fit_diurnal(s.t, s.y, utc_offset_hours=utc_offset_hours)


# -- Table 1: forecast error per host × probe ------------------------------------------------


def forecast_metrics() -> list[Metric]:
    """The metrics forecast per path on the pages: every one the monitor alerts on, except
    shares (a loss of 0 % has no relative error)."""
    return [
        m for m in all_metrics().values() if m.alert is not None and not m.key.endswith("_percent")
    ]


def table_metrics() -> list[Metric]:
    """The metrics Table 1 scores, as the seeds' table did: each transfer probe's rate (those
    of the forecast metrics where higher is better)."""
    return [m for m in forecast_metrics() if m.better == "higher"]


@dataclass(frozen=True)
class ErrorRow:
    """One path and metric of Table 1: each method's errors over the window."""

    monitor: str
    target: str
    metric: Metric
    by_method: dict[str, ErrorSummary]
    chosen: dict[str, int]  # the ensemble's choices: member → forecasts


# Table 1's walks by the series walked: a page asked for again (its window ending now, a few
# seconds later) walks the same runs, and a walk is the page's cost. Bounded, thread-safe.
_WALKS: OrderedDict[bytes, dict[str, list[Forecast]]] = OrderedDict()
_WALKS_LOCK = threading.Lock()
WALKS_KEPT = 64


def _table_walks(t: FloatArray, y: FloatArray) -> dict[str, list[Forecast]]:
    key = hashlib.blake2b(t.tobytes() + b"|" + y.tobytes(), digest_size=16).digest()
    with _WALKS_LOCK:
        found = _WALKS.get(key)
        if found is not None:
            _WALKS.move_to_end(key)
            return found
    walks = walk_forward_all(t, y, coverage=COVERAGE, methods=TABLE_METHODS)
    with _WALKS_LOCK:
        _WALKS[key] = walks
        while len(_WALKS) > WALKS_KEPT:
            _WALKS.popitem(last=False)
    return walks


def paths(archive: Archive, since: datetime, until: datetime) -> list[tuple[str, str, str]]:
    """(monitor, target, probe) of every path with routine results in the window."""
    query = (
        select(RESULTS.c.monitor, RESULTS.c.target, RESULTS.c.probe)
        .where(*result_conditions(since=since, until=until))
        .group_by(RESULTS.c.monitor, RESULTS.c.target, RESULTS.c.probe)
        .order_by(RESULTS.c.target, RESULTS.c.monitor, RESULTS.c.probe)
    )
    with archive.reading("cannot read the paths") as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(query)]


def error_table(
    archive: Archive, since: datetime, until: datetime, warmup_s: float = 7 * 86400.0
) -> list[ErrorRow]:
    """Table 1 over [since, until): each path's forecasts of the measurements in the window,
    made walk-forward from the history before them (``warmup_s`` before the window too)."""
    metrics = table_metrics()
    rows = []
    start = datetime.fromtimestamp(since.timestamp() - warmup_s, UTC)
    for monitor, target, probe in paths(archive, since, until):
        for metric in (m for m in metrics if m.probe == probe):
            s = read_path(
                archive, target=target, metric=metric, monitor=monitor, since=start, until=until
            )
            t, y = increasing(s.t, s.y)
            if t.size < START + 1:
                continue
            walks = _table_walks(t, y)
            cut = since.timestamp()
            scored = {m: [f for f in fcs if f.t >= cut] for m, fcs in walks.items()}
            if not scored["auto"]:
                continue
            chosen: dict[str, int] = {}
            for f in scored["auto"]:
                chosen[f.method] = chosen.get(f.method, 0) + 1
            rows.append(
                ErrorRow(
                    monitor,
                    target,
                    metric,
                    {m: summarise(fcs) for m, fcs in scored.items()},
                    chosen,
                )
            )
    return rows


# -- advice for applications ------------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    """One candidate path: its forecast now and at the horizon, and the parameters to use."""

    prediction: Prediction
    tuning: dict[str, Any]  # window, streams and where they came from


def tuning_of(archive: Archive, monitor: str, target: str) -> dict[str, Any]:
    """The iperf3 window/streams to use on the path: those a tuning study chose (``iepm tune``,
    stored per path), else those of the latest successful routine run, else none known."""
    tuned = load_tuned(archive, monitor=monitor, target=target, probe="iperf3")
    if tuned:
        return {
            "source": "tuned",
            "window": tuned.get("window"),
            "streams": tuned.get("streams"),
        }
    window = RESULTS.c.data["window_bytes"].as_float()
    streams = RESULTS.c.data["stream_count"].as_float()
    query = (
        select(window, streams)
        .where(
            *result_conditions(probe="iperf3", target=target, monitor=monitor, outcome="ok"),
        )
        .order_by(RESULTS.c.started_at.desc())
        .limit(1)
    )
    with archive.reading(f"cannot read the last iperf3 run of {target}") as conn:
        row = conn.execute(query).first()
    if row is None:
        return {"source": "none", "window": None, "streams": None}
    return {
        "source": "last_run",
        "window": None if row[0] is None else int(row[0]),
        "streams": None if row[1] is None else int(row[1]),
    }


def advise(
    archive: Archive,
    candidates: Sequence[tuple[str, str]],
    *,
    metric: Metric,
    now: datetime,
    horizon_s: float,
    since: datetime | None = None,
) -> tuple[list[Advice], dict[tuple[str, str], str]]:
    """Each (monitor, target) candidate's forecast, best first (highest expected value at the
    horizon for a metric where higher is better, lowest otherwise); candidates that cannot be
    forecast are returned apart with the reason."""
    out: list[Advice] = []
    skipped: dict[tuple[str, str], str] = {}
    for monitor, target in candidates:
        try:
            s = read_path(
                archive, target=target, metric=metric, monitor=monitor, since=since, until=now
            )
            prediction = predict(s, now.timestamp(), horizon_s)
        except AnalysisError as exc:
            skipped[(monitor, target)] = str(exc)
            continue
        out.append(Advice(prediction, tuning_of(archive, monitor, target)))
    sign = -1.0 if metric.better == "higher" else 1.0
    out.sort(key=lambda a: (sign * a.prediction.ahead.forecast, a.prediction.series.target))
    return out, skipped

"""``/api/v1/forecast``, ``/api/v1/diurnal`` and ``/api/v1/advice``: predictions per path from
the archive's routine results (iepm.analysis.predict), mounted by iepm.web.api."""

# No "from __future__ import annotations": FastAPI must see the annotations as objects.

import re
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from iepm.analysis import predict
from iepm.analysis.forecast import Forecast
from iepm.analysis.series import iso
from iepm.errors import AnalysisError
from iepm.probes.base import Metric
from iepm.web.context import UNKNOWN, Since, Until, WebContext, now_of, utc, web

Context = Annotated[WebContext, Depends(web)]
HORIZON_PATTERN = r"^[0-9]{1,7}[smhd]$"
MAX_HORIZON = timedelta(days=30)
HISTORY = timedelta(days=28)  # default series window before until (or now)
MAX_CANDIDATES = 50
Horizon = Annotated[
    str,
    Query(
        pattern=HORIZON_PATTERN,
        description="how far past now: a number and s, m, h or d (30m, 6h, 1d); at most 30 d",
    ),
]
MetricQuery = Annotated[
    str,
    Query(
        description="a registered metric: its name (iperf3.throughput_bps) or its key "
        "(throughput_bps) with probe=",
    ),
]
Monitor = Annotated[
    str | None, Query(description="the path's monitor (default: the one with most results)")
]


class ForecastPoint(BaseModel):
    at: str = Field(description="the moment forecast, UTC")
    value: float = Field(description="the forecast, in the metric's unit")
    lower: float = Field(description="lower bound of the 80% prediction interval")
    upper: float = Field(description="upper bound of the 80% prediction interval")
    method: str = Field(description="the ensemble member (or baseline) that made it")


class RecentError(BaseModel):
    forecasts: int = Field(description="walk-forward forecasts scored (the latest ones)")
    mean_relative_error: float | None = Field(description="mean of |f - o| / o")
    median_relative_error: float | None
    p90_relative_error: float | None
    coverage: float | None = Field(description="share of observations inside the 80% interval")


class ForecastAnswer(BaseModel):
    target: str
    monitor: str
    probe: str
    metric: str = Field(description="probe.key, unit in the key")
    samples: int = Field(description="routine measurements the forecast is made from")
    last_at: str = Field(description="the latest measurement, UTC")
    last_value: float
    horizon_s: float
    coverage: float = Field(description="nominal coverage of the intervals")
    now: ForecastPoint = Field(description="the next measurement (made now)")
    ahead: ForecastPoint = Field(description="a measurement made horizon_s from now")
    recent_error: RecentError = Field(description="the ensemble on the path's latest runs")


class SineFitModel(BaseModel):
    n: int = Field(description="samples fitted")
    a: float | None = Field(description="amplitude |a|, in the metric's unit")
    b: float | None = Field(description="phase, radians in [0, 2π)")
    c: float | None = Field(description="mean level, in the metric's unit")
    delta_b: float | None = Field(description="standard error of b (null: undetermined)")
    diurnal: bool = Field(description="delta_b < 0.2 and the samples span the day")
    peak_hour: float | None = Field(description="time of day of the maximum, hours")
    day_coverage: float | None
    rmse: float | None
    simple_a: float | None
    simple_b: float | None
    simple_c: float | None
    simple_rmse: float | None


class DiurnalAnswer(BaseModel):
    target: str
    monitor: str
    probe: str
    metric: str
    since: str
    until: str
    utc_offset_hours: float
    weekdays: SineFitModel
    weekends: SineFitModel


class Tuning(BaseModel):
    source: str = Field(description="tuned (a study chose them), last_run, or none")
    window: Any = Field(description="TCP window (bytes, or as the study wrote it, e.g. 4M)")
    streams: int | None = Field(description="parallel streams")


class Candidate(BaseModel):
    rank: int = Field(description="1 = best expected value at the horizon")
    target: str
    monitor: str
    samples: int
    last_at: str
    now: ForecastPoint
    ahead: ForecastPoint
    recent_error: RecentError
    tuning: Tuning = Field(description="the iperf3 window/streams to use on this path")


class Skipped(BaseModel):
    target: str
    monitor: str
    reason: str


class AdviceAnswer(BaseModel):
    metric: str
    horizon_s: float
    candidates: list[Candidate] = Field(description="best first")
    skipped: list[Skipped] = Field(description="candidates that cannot be forecast, and why")


def horizon_seconds(text: str) -> float:
    """Seconds of ``30m``/``6h``/``1d``; a 422 naming the field beyond 30 days."""
    match = re.fullmatch(HORIZON_PATTERN, text)
    if match is None:  # the Query pattern checks first; kept for direct callers
        raise HTTPException(422, f"query.horizon: {text!r} is not like 30m, 6h or 1d")
    seconds = int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]]
    if seconds > MAX_HORIZON.total_seconds():
        raise HTTPException(422, f"query.horizon: {text!r} is beyond 30 days")
    return float(seconds)


def metric_of(metric: str, probe: Any, w: WebContext | None = None, target: str = "") -> Metric:
    """The metric asked for (a key several probes share: the one measured on ``target``)."""
    measured = None
    if w is not None and "." not in metric:
        w.known_target(target)
        measured = predict.measured_probes(w.queries.archive, target)
    try:
        return predict.find_metric(metric, probe.value if probe is not None else None, measured)
    except AnalysisError as exc:
        raise HTTPException(422, f"query.metric: {exc}") from None


def point(f: Forecast) -> ForecastPoint:
    return ForecastPoint(
        at=iso(f.t), value=f.forecast, lower=f.lower, upper=f.upper, method=f.method
    )


def recent(summary: predict.ErrorSummary) -> RecentError:
    return RecentError(**summary.as_dict())


def _series(
    w: WebContext,
    target: str,
    metric: Metric,
    monitor: str | None,
    since: datetime | None,
    until: datetime,
) -> predict.PathSeries:
    w.known_target(target)
    w.known_monitor(target, monitor)
    start = utc(since, "since") or until - HISTORY
    try:
        s = predict.read_path(
            w.queries.archive,
            target=target,
            metric=metric,
            monitor=monitor,
            since=start,
            until=until,
        )
    except AnalysisError as exc:
        raise HTTPException(404, str(exc)) from None
    return s


def routes(api: APIRouter, probe_name: type[StrEnum]) -> None:
    """Add the prediction endpoints to ``api``; ``probe_name``: the registry's probe enum."""
    ProbeName = probe_name

    @api.get("/forecast", response_model=ForecastAnswer, responses=UNKNOWN)
    def api_forecast(
        w: Context,
        target: str,
        metric: MetricQuery,
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        horizon: Horizon = "1h",
        monitor: Monitor = None,
        since: Since = None,
        until: Until = None,
    ) -> ForecastAnswer:
        """A path's forecast for the next measurement and for one ``horizon`` ahead, with
        80% prediction intervals, the method the ensemble chose and its error on the path's
        latest runs. Made from the routine results (never a study's) in [since, until)
        (default: the 28 days before until, or now). 404: unknown target or monitor, or too
        few measurements; 422: an unknown metric or a bad horizon."""
        m = metric_of(metric, probe, w, target)
        seconds = horizon_seconds(horizon)
        utc(since, "since")

        def compute(end: datetime) -> ForecastAnswer:
            s = _series(w, target, m, monitor, since, end)
            try:
                p = predict.predict(s, end.timestamp(), seconds)
            except AnalysisError as exc:
                raise HTTPException(404, str(exc)) from None
            return ForecastAnswer(
                target=target,
                monitor=s.monitor,
                probe=m.probe,
                metric=m.name,
                samples=len(s),
                last_at=iso(p.last_at),
                last_value=float(s.y[-1]),
                horizon_s=seconds,
                coverage=predict.COVERAGE,
                now=point(p.now),
                ahead=point(p.ahead),
                recent_error=recent(p.recent),
            )

        # A walk over the path's runs takes ~0.1-1 s; the runs change once per cycle, so an
        # answer is reused for the app's cache TTL (as the pages are).
        key = ("api-forecast", target, m.name, monitor, seconds, since)
        return w.page_data(key, until, compute)  # type: ignore[no-any-return]

    @api.get("/diurnal", response_model=DiurnalAnswer, responses=UNKNOWN)
    def api_diurnal(
        w: Context,
        target: str,
        metric: MetricQuery,
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        monitor: Monitor = None,
        utc_offset: Annotated[
            float, Query(ge=-14, le=14, description="hours to add to UTC for the time of day")
        ] = 0.0,
        since: Since = None,
        until: Until = None,
    ) -> DiurnalAnswer:
        """A path's diurnal model |a|·sin(x + b) + c over the time of day, weekdays and
        weekends apart, with δb (the phase's standard error) and the diurnal flag, from the
        routine results in [since, until) (default: the 28 days before until, or now)."""
        m = metric_of(metric, probe, w, target)
        end = now_of(until)
        start = utc(since, "since") or end - HISTORY
        s = _series(w, target, m, monitor, start, end)
        try:
            fits = predict.diurnal(s, utc_offset)
        except AnalysisError as exc:
            raise HTTPException(404, str(exc)) from None
        return DiurnalAnswer(
            target=target,
            monitor=s.monitor,
            probe=m.probe,
            metric=m.name,
            since=iso(start.timestamp()),
            until=iso(end.timestamp()),
            utc_offset_hours=utc_offset,
            weekdays=SineFitModel(**fits["weekdays"].as_dict()),
            weekends=SineFitModel(**fits["weekends"].as_dict()),
        )

    @api.get("/advice", response_model=AdviceAnswer, responses=UNKNOWN)
    def api_advice(
        w: Context,
        destination: Annotated[
            list[str] | None,
            Query(description="candidate targets (replicas); repeat for several"),
        ] = None,
        source: Annotated[
            list[str] | None,
            Query(description="candidate monitors (sources); default: every one with results"),
        ] = None,
        metric: MetricQuery = predict.THROUGHPUT,
        horizon: Horizon = "1h",
        until: Until = None,
    ) -> AdviceAnswer:
        """What a data-movement service asks before choosing a replica: for each candidate
        path (every source × destination with results), the expected value now and one
        ``horizon`` ahead with its 80% interval, and the iperf3 window/streams to use (those
        a tuning study chose, else the latest run's); ranked best first."""
        m = metric_of(metric, None)
        seconds = horizon_seconds(horizon)
        if not destination:
            raise HTTPException(422, "query.destination: give at least one candidate target")
        key = ("api-advice", tuple(destination), tuple(source or ()), m.name, seconds)
        return w.page_data(  # type: ignore[no-any-return]
            key, until, lambda end: advice(w, destination, source, m, seconds, end)
        )

    def advice(
        w: WebContext,
        destination: list[str],
        source: list[str] | None,
        m: Metric,
        seconds: float,
        end: datetime,
    ) -> AdviceAnswer:
        archive = w.queries.archive
        pairs: list[tuple[str, str]] = []
        for target in dict.fromkeys(destination):
            w.known_target(target)
            monitors = predict.path_monitors(archive, target, m.probe)
            for monitor in source or monitors:
                if monitor in monitors:
                    pairs.append((monitor, target))
        if len(pairs) > MAX_CANDIDATES:
            raise HTTPException(
                422, f"query.destination: {len(pairs)} paths; at most {MAX_CANDIDATES}"
            )
        advice, skipped = predict.advise(
            archive, pairs, metric=m, now=end, horizon_s=seconds, since=end - HISTORY
        )
        missing = [
            Skipped(target=t, monitor=s, reason=f"no routine {m.probe} results on this path")
            for t in dict.fromkeys(destination)
            for s in source or []
            if (s, t) not in pairs
        ]
        return AdviceAnswer(
            metric=m.name,
            horizon_s=seconds,
            candidates=[
                Candidate(
                    rank=i + 1,
                    target=a.prediction.series.target,
                    monitor=a.prediction.series.monitor,
                    samples=len(a.prediction.series),
                    last_at=iso(a.prediction.last_at),
                    now=point(a.prediction.now),
                    ahead=point(a.prediction.ahead),
                    recent_error=recent(a.prediction.recent),
                    tuning=Tuning(**a.tuning),
                )
                for i, a in enumerate(advice)
            ],
            skipped=[
                *(Skipped(target=t, monitor=s, reason=why) for (s, t), why in skipped.items()),
                *missing,
            ],
        )

"""Predictions on the pages: the target page's forecast and diurnal panel, and ``/forecasts``,
the forecast error per host × probe over a chosen window (the IEPM-BW seeds' Table 1) with
its CSV/TSV downloads (``/forecasts/tables/NAME?format=csv``)."""

# No "from __future__ import annotations": FastAPI must see the routes' annotations as objects.

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal, NamedTuple

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response

from iepm.analysis import predict
from iepm.analysis.methods import START
from iepm.analysis.statistics import at
from iepm.probes.base import Metric
from iepm.results import format_time
from iepm.web.context import UNKNOWN, Until, WebContext, now_of, web
from iepm.web.queries import Frame
from iepm.web.tables import Chart, Series, Table, TableFormat, col, download, num, pick

Context = Annotated[WebContext, Depends(web)]
ErrorWindow = Literal["1d", "7d", "28d", "90d", "365d"]


# -- the target page's panel --------------------------------------------------------------------


class ForecastRow(NamedTuple):
    metric: str
    samples: int
    last_at: datetime
    last_value: float
    forecast: float | None
    lower: float | None
    upper: float | None
    method: str
    recent_mean_error_percent: float | None
    recent_coverage_percent: float | None


class DiurnalRow(NamedTuple):
    metric: str
    days: str
    n: int
    a: float | None
    b: float | None
    c: float | None
    delta_b: float | None
    diurnal: int
    peak_hour: float | None
    rmse: float | None


def _percent(v: float) -> float | None:
    return num(100.0 * v)


def panel_metrics(metrics: dict[str, Metric]) -> list[Metric]:
    """What the panel forecasts: the forecast metrics that the page has."""
    return [m for m in predict.forecast_metrics() if m.name in metrics]


def forecast_panel(
    frames: dict[str, Frame], metrics: dict[str, Metric], now: datetime
) -> tuple[list[Table], list[Chart]]:
    """The ``forecast`` and ``diurnal`` tables and one forecast chart per metric, from the
    page's own (routine, one-monitor) results in its window."""
    rows: list[ForecastRow] = []
    fits: list[DiurnalRow] = []
    charts: list[Chart] = []
    for metric in panel_metrics(metrics):
        frame = frames.get(metric.probe)
        if frame is None:
            continue
        values = frame.values[metric.key]
        keep = np.isfinite(values) & (frame.ok() | metric.failed_runs)
        # The latest runs only, as the API reads them: a 365-day window is ~6,000 runs.
        t, y = predict.increasing(
            frame.t[keep][-predict.MAX_SAMPLES :], values[keep][-predict.MAX_SAMPLES :]
        )
        if t.size < START + 1:
            continue
        s = predict.PathSeries("", "", metric, t, y)
        p = predict.predict(s, now.timestamp(), 0.0)
        rows.append(
            ForecastRow(
                metric.name,
                len(s),
                at(p.last_at),
                float(y[-1]),
                num(p.now.forecast),
                num(p.now.lower),
                num(p.now.upper),
                p.now.method,
                _percent(p.recent.mean_relative_error),
                _percent(p.recent.coverage),
            )
        )
        for days, fit in predict.diurnal(s).items():
            fits.append(
                DiurnalRow(
                    metric.name,
                    days,
                    fit.n,
                    num(fit.a),
                    num(fit.b),
                    num(fit.c),
                    num(fit.delta_b),
                    1 if fit.diurnal else 0,
                    num(fit.peak_hour),
                    num(fit.rmse),
                )
            )
        walk = [*p.walk, p.now]
        charts.append(
            Chart(
                f"forecast-{metric.key}",
                f"forecast of {metric.label} with its 80% interval (the last point: the next run)",
                "time",
                [f.t for f in walk],
                [
                    Series("observed", [f.observed for f in walk]),
                    Series("forecast", [f.forecast for f in walk]),
                    Series("lower_80", [f.lower for f in walk]),
                    Series("upper_80", [f.upper for f in walk]),
                ],
                "forecast",
            )
        )
    forecast_table = Table(
        "forecast",
        "forecast of the next run (80% interval) and the ensemble's recent error",
        [
            col("metric", "probe.metric, unit in the name"),
            col("samples", "successful runs in the window"),
            col("last_at", "the latest run, UTC"),
            col("last_value", "its value, in the metric's unit"),
            col("forecast", "the next run's forecast"),
            col("lower", "lower bound of the 80% prediction interval"),
            col("upper", "upper bound of the 80% prediction interval"),
            col("method", "the ensemble member chosen"),
            col(
                "recent_mean_error_percent",
                f"mean |forecast - observed| / observed over the last {predict.RECENT} runs",
            ),
            col("recent_coverage_percent", "share of those inside their 80% interval"),
        ],
        rows,
    )
    diurnal_table = Table(
        "diurnal",
        "diurnal fit |a|·sin(x + b) + c over the time of day (UTC), weekdays and weekends",
        [
            col("metric", "probe.metric, unit in the name"),
            col("days", "weekdays (Mon-Fri) or weekends"),
            col("n", "runs fitted"),
            col("a", "amplitude, in the metric's unit"),
            col("b", "phase, radians"),
            col("c", "level, in the metric's unit"),
            col("delta_b", "standard error of b (empty: undetermined)"),
            col("diurnal", "1 when delta_b < 0.2 and the runs span the day"),
            col("peak_hour", "time of day of the maximum, hours UTC"),
            col("rmse", "RMS error of the fit"),
        ],
        fits,
    )
    return [forecast_table, diurnal_table], charts


# -- Table 1 ------------------------------------------------------------------------------------


ERROR_WINDOWS: dict[str, float] = {
    "1d": 86400.0,
    "7d": 7 * 86400.0,
    "28d": 28 * 86400.0,
    "90d": 90 * 86400.0,
    "365d": 365 * 86400.0,
}


class ErrorTableRow(NamedTuple):
    monitor: str
    target: str
    probe: str
    metric: str
    forecasts: int
    mean_error_percent: float | None
    median_error_percent: float | None
    p90_error_percent: float | None
    coverage_percent: float | None
    ma5_mean_error_percent: float | None
    ewma_mean_error_percent: float | None
    methods_chosen: str


@dataclass
class ForecastsPage:
    since: datetime
    until: datetime
    window: str
    tables: dict[str, Table]


def forecasts_page(w: WebContext, until: datetime, window: str) -> ForecastsPage:
    since = datetime.fromtimestamp(until.timestamp() - ERROR_WINDOWS[window], until.tzinfo)
    rows = predict.error_table(w.queries.archive, since, until)
    detail = Table(
        "forecast_errors",
        "forecast error per path and metric: the ensemble (auto) beside MA(5) and EWMA",
        [
            col("monitor", "monitoring host"),
            col("target", "target name"),
            col("probe", "probe"),
            col("metric", "probe.metric, unit in the name"),
            col("forecasts", "runs in the window forecast one step ahead"),
            col("mean_error_percent", "the ensemble's mean |forecast - observed| / observed"),
            col("median_error_percent", "its median"),
            col("p90_error_percent", "its 90th percentile"),
            col("coverage_percent", "share of runs inside the ensemble's 80% interval"),
            col("ma5_mean_error_percent", "MA(5)'s mean relative error (the seeds' forecaster)"),
            col("ewma_mean_error_percent", "EWMA's (w = 0.7) mean relative error"),
            col("methods_chosen", "the ensemble's members and how often each was used"),
        ],
        [
            ErrorTableRow(
                r.monitor,
                r.target,
                r.metric.probe,
                r.metric.name,
                r.by_method["auto"].forecasts,
                _percent(r.by_method["auto"].mean_relative_error),
                _percent(r.by_method["auto"].median_relative_error),
                _percent(r.by_method["auto"].p90_relative_error),
                _percent(r.by_method["auto"].coverage),
                _percent(r.by_method["ma5"].mean_relative_error),
                _percent(r.by_method["ewma"].mean_relative_error),
                ", ".join(f"{m}={n}" for m, n in sorted(r.chosen.items())),
            )
            for r in rows
        ],
    )
    # The seeds' layout: a row per host (path), a column per probe's metric.
    names = list(dict.fromkeys(r.metric.name for r in rows))
    hosts = list(dict.fromkeys((r.monitor, r.target) for r in rows))
    cell = {(r.monitor, r.target, r.metric.name): r for r in rows}
    matrix = Table(
        "forecast_error_matrix",
        "the ensemble's mean forecast error (%) per host × probe (the seeds' Table 1)",
        [col("monitor", "monitoring host"), col("target", "target name")]
        + [col(f"{n}_error_percent", f"mean relative error of {n}, percent") for n in names],
        [
            (
                monitor,
                target,
                *(
                    _percent(c.by_method["auto"].mean_relative_error)
                    if (c := cell.get((monitor, target, n)))
                    else None
                    for n in names
                ),
            )
            for monitor, target in hosts
        ],
    )
    return ForecastsPage(since, until, window, {t.name: t for t in (matrix, detail)})


def router() -> APIRouter:
    pages = APIRouter(tags=["pages"], responses=UNKNOWN)

    def data(w: WebContext, until: datetime | None, window: str) -> ForecastsPage:
        return w.page_data(  # type: ignore[no-any-return]
            ("forecasts", window), until, lambda end: forecasts_page(w, end, window)
        )

    @pages.get("/forecasts", response_class=HTMLResponse, summary="Forecast error per host")
    async def forecasts(
        w: Context, request: Request, window: ErrorWindow = "28d", until: Until = None
    ) -> HTMLResponse:
        page = await w.computed(data, w, until, window)
        context = {
            "request": request,
            "page": page,
            "tables": page.tables,
            "until": until,
            "now": now_of(until),
            "windows": list(ERROR_WINDOWS),
        }
        return HTMLResponse(w.templates.get_template("forecasts.html").render(context))

    # Documented as what it answers (CSV or TSV text), not FastAPI's default JSON.
    table_types = {"text/csv": {}, "text/tab-separated-values": {}}

    @pages.get(
        "/forecasts/tables/{name}",
        summary="Download a forecast-error table",
        response_class=Response,
        responses={200: {"description": "the table", "content": table_types}},
    )
    def forecasts_table(
        w: Context,
        name: str,
        format: Literal["csv", "tsv"] = "csv",
        window: ErrorWindow = "28d",
        until: Until = None,
    ) -> Response:
        page = data(w, until, window)
        selection = f"window={window} until={format_time(page.until)}"
        return download(pick(page.tables, name), TableFormat(format), selection, "forecasts")

    return pages

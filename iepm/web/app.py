"""``iepm serve``: report pages, the REST API (``/api/v1``) and ``/metrics`` over one archive.

Pages are rendered on the server with Jinja2; their charts are drawn by uPlot from JSON embedded
in the page, and every table and chart's data can be downloaded as CSV or TSV from the same
URL with ``/tables/NAME?format=csv``. Nothing is loaded from outside the server.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from iepm import __version__
from iepm.errors import StoreError
from iepm.export import format_number
from iepm.results import Outcome, Result, format_time
from iepm.scheduler import SchedulerHealth
from iepm.web import views
from iepm.web.metrics import metrics_text
from iepm.web.queries import METRICS, Queries

HERE = Path(__file__).parent
MAX_LIMIT = 10_000
# Pages are computed by this many threads per worker, not by anyio's pool of 40: computing a
# page is Python holding the GIL, and many threads that also wait on the database pass it to
# each other in 5 ms turns. 20 concurrent first visits (benchmarks/web.py, at Python's 5 ms
# switch interval): p99 1.7–2.6 s with anyio's pool, 0.6–0.7 s with 2 threads (1 thread:
# 1.2 s); with SWITCH_INTERVAL_S below as well, 1.0–1.1 s (it favours the cached pages).
PAGE_THREADS = 2
# While a thread computes a page (0.7–2.5 s for the overview's background refresh), the event
# loop waits up to the GIL's switch interval each time it wants the GIL back (every socket
# call): at Python's 5 ms, cached pages answered during a refresh took up to 0.7–1.3 s (p99).
# At 0.5 ms: p99 17–19 ms in every run (benchmarks/web.py, SQLite, 2 runs each). Set for the
# whole process: the web app's (iepm serve's workers, or the demo's monitor).
SWITCH_INTERVAL_S = 0.0005
INLINE_LIMIT = 1000  # /api/v1/results pages up to this size are built on the event loop
# Offsets beyond this are refused: SQLite's integers are 64-bit and nobody pages that far.
MAX_OFFSET = 1_000_000_000
# How far before and after a given since/until the pages read (a year back, minutes ahead).
EARLIEST_MARGIN = timedelta(days=800)
LATEST_MARGIN = timedelta(days=1)
PROBE_NAMES = ("ping", "traceroute", "iperf3", "load")

MetricName = StrEnum("MetricName", {name: name for name in METRICS})  # type: ignore[misc]
AggMetric = StrEnum("AggMetric", {name: name for name in views.AGG_METRICS})  # type: ignore[misc]
ProbeName = StrEnum("ProbeName", {name: name for name in PROBE_NAMES})  # type: ignore[misc]


class View(StrEnum):
    last7 = "last7"
    weekly = "weekly"
    daily = "daily"
    weekday = "weekday"
    workday = "workday"
    monthly = "monthly"


class TableFormat(StrEnum):
    csv = "csv"
    tsv = "tsv"


class Problem(BaseModel):
    """Every error answer: one readable line (several problems joined by "; ")."""

    detail: str = Field(description='what was wrong, e.g. "query.since: Input should be …"')


def _problem(description: str) -> dict[str, Any]:
    # Inline JSON, not {"model": Problem}: FastAPI would file the schema under an HTML
    # page's own media type, while errors are always JSON.
    schema = {"application/json": {"schema": Problem.model_json_schema()}}
    return {"description": description, "content": schema}


INVALID = {422: _problem("Invalid input: a parameter out of its type or range")}
UNAVAILABLE = {503: _problem("The archive cannot be read right now")}
UNKNOWN = {404: _problem("Unknown target (no result for it in the archive), monitor or table")}


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class TargetProbe(BaseModel):
    target: str
    probe: str
    count: int = Field(description="results in the archive")
    first_started_at: str | None
    last_started_at: str | None


class TargetInfo(BaseModel):
    target: str
    monitor: str
    probe: str
    count: int = Field(description="results in the archive")
    first_started_at: str | None
    last_started_at: str | None


class ResultsPage(BaseModel):
    total: int = Field(description="results matching the filters, whatever limit/offset")
    limit: int
    offset: int
    results: list[Result] = Field(description="result envelopes (schema 1), oldest first")


class Bucket(BaseModel):
    start: str = Field(description="start of the period, UTC")
    count: int
    min: float
    mean: float
    max: float
    median: float


class Aggregates(BaseModel):
    target: str
    monitor: str | None
    metric: str
    period: str
    buckets: list[Bucket]


class Alert(BaseModel):
    id: str
    monitor: str
    target: str
    probe: str
    metric: str
    detected_at: str = Field(description="when the change was detected, UTC")
    change_at: str = Field(description="when the series changed, UTC")
    direction: str
    before: float | None
    after: float | None
    change_percent: float | None
    cause: str = Field(description="route, host, tuning or unknown")
    details: Any = Field(description="the evidence for the cause")
    delivered_at: str | None = Field(description="when the webhook delivered it, UTC")
    delivery_attempts: int


class AlertsPage(BaseModel):
    total: int = Field(description="alerts matching the filters, whatever limit/offset")
    limit: int
    offset: int
    alerts: list[Alert] = Field(description="newest first")


class Study(BaseModel):
    id: str
    kind: str
    monitor: str
    target: str
    started_at: str
    finished_at: str | None
    partial: bool = Field(description="true when the study was interrupted")
    params: Any
    data: Any = Field(description="every point measured")
    summary: Any = Field(description="what the study concluded")


class StudiesPage(BaseModel):
    total: int
    limit: int
    offset: int
    studies: list[Study] = Field(description="newest first")


def _times(row: dict[str, Any], *names: str) -> dict[str, Any]:
    return {**row, **{n: format_time(row[n]) if row[n] is not None else None for n in names}}


Since = Annotated[
    datetime | None, Query(description="from this moment, inclusive (ISO 8601; naive = UTC)")
]
Until = Annotated[
    datetime | None, Query(description="before this moment, exclusive (ISO 8601; naive = UTC)")
]


def _utc(moment: datetime | None, name: str) -> datetime | None:
    if moment is None:
        return None
    try:
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
        # Windows reach back a year from the moment given and a few minutes past it (the
        # overview's latest results): refuse moments where either overflows.
        moment - EARLIEST_MARGIN
        moment + LATEST_MARGIN
    except (OverflowError, ValueError):
        first, last = datetime.min + EARLIEST_MARGIN, datetime.max - LATEST_MARGIN
        raise HTTPException(
            422,
            f"{name}: {moment.isoformat()} is out of range "
            f"(from {first:%Y-%m-%d} to {last:%Y-%m-%d})",
        ) from None
    return moment


def _now(until: datetime | None) -> datetime:
    return _utc(until, "until") or datetime.now(UTC)


def _human(value: float | None, name: str) -> str:
    """Short text for a grid cell: 941 Mbit/s, 40.5 ms, 0.2 %."""
    if value is None or not math.isfinite(value):
        return "–"
    if name.endswith("_bps"):
        for scale, unit in ((1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {unit}"
        return f"{value:.3g} bit/s"
    if name.endswith("_ms"):
        return f"{value:.3g} ms"
    if name.endswith("_percent"):
        return f"{value:.2g} %"
    return f"{value:.4g}"


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def cell_text(value: Any) -> str:
    """A table cell as the CSV download writes it, so page and download agree."""
    if isinstance(value, datetime):
        return format_time(value)
    if value is None:
        return ""
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def create_app(
    archive_url: str, *, health: SchedulerHealth | None = None, cache_ttl_s: float = 30.0
) -> FastAPI:
    """The web app over the archive at ``archive_url`` (created or upgraded if needed).
    ``health``: a scheduler's counters when the app runs in the monitor's process (the demo),
    for the figures the archive cannot hold (failed archive writes, spooled results)."""
    queries = Queries(archive_url, cache_ttl_s=cache_ttl_s)
    archive = queries.archive
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Made on first use and shut down with the app (which may be started again, as tests do).
    page_pools: list[ThreadPoolExecutor] = []

    async def computed(fn: Callable[..., str], *args: Any) -> str:
        if not page_pools:
            page_pools.append(ThreadPoolExecutor(PAGE_THREADS, "iepm-page"))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(page_pools[0], functools.partial(fn, *args))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        while page_pools:
            page_pools.pop().shutdown(wait=False, cancel_futures=True)
        queries.close()

    app = FastAPI(
        lifespan=lifespan,
        responses={**INVALID, **UNAVAILABLE},
        title="iepm",
        version=__version__,
        description=(
            "Network performance reports, REST API and Prometheus metrics over an iepm "
            "archive. Units live in field names (_ms, _bps, _bytes, _percent, _s); times UTC."
        ),
    )
    app.state.archive = archive
    app.state.queries = queries
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals.update(
        human=_human, age=_age, cell=cell_text, metrics=METRICS, views=views.AGG_VIEWS
    )
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.exception_handler(StoreError)
    async def _store_error(_request: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # One readable line per problem, e.g. "query.since: Input should be a valid datetime".
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
            + (f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else "")
            for e in exc.errors()
        ]
        return JSONResponse({"detail": "; ".join(problems)}, status_code=422)

    def known_target(target: str) -> str:
        if not queries.cached(("has", target), lambda: queries.has_target(target)):
            raise HTTPException(404, f"unknown target {target!r}: no results for it in the archive")
        return target

    def known_monitor(target: str, monitor: str | None) -> None:
        if monitor is None:
            return
        if not queries.has_monitor(target, monitor):
            monitors = [m for m, _n in queries.target_monitors(target)]
            raise HTTPException(
                404,
                f"monitor {monitor!r} has no results for target {target!r} "
                f"(monitors: {', '.join(monitors)})",
            )

    def download(table: views.Table, fmt: TableFormat, selection: str, stem: str) -> Response:
        media = "text/csv" if fmt == TableFormat.csv else "text/tab-separated-values"
        body = table.render(fmt.value, selection)
        filename = f"{stem}-{table.name}.{fmt.value}".replace("/", "_")
        return Response(
            body,
            media_type=f"{media}; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )

    def pick(tables: dict[str, views.Table], name: str) -> views.Table:
        if name not in tables:
            raise HTTPException(404, f"no table {name!r} here (tables: {', '.join(tables)})")
        return tables[name]

    # -- pages ---------------------------------------------------------------------------------

    def page_data(key: tuple[Any, ...], until: datetime | None, compute: Any) -> Any:
        """A page's figures, reused for ``cache_ttl_s`` (default 30 s): the figures move once
        per cycle, while wall screens reload every few seconds and 20 people may open the same
        target at once. Without ``until`` the window ends when the figures were computed."""
        if until is not None:
            now = _now(until)
            return queries.cached((*key, now), lambda: compute(now))
        # "Now": one entry per page, refreshed every cache_ttl_s (stale while refreshing).
        return queries.cached((*key, "now"), lambda: compute(datetime.now(UTC)))

    def overview_data(until: datetime | None) -> dict[str, Any]:
        return page_data(("overview",), until, lambda now: views.overview(queries, now))

    @app.get("/", response_class=HTMLResponse, summary="Overview page", tags=["pages"])
    async def overview_page(request: Request, until: Until = None) -> HTMLResponse:
        # A shared page that is ready is answered on the event loop; computing goes to a thread.
        if until is None:
            html = queries.ready(("overview-html",), lambda: overview_html(request, None))
            if html is not None:
                return HTMLResponse(html)
        return HTMLResponse(await computed(overview_html, request, until))

    def overview_html(request: Request, until: datetime | None) -> str:
        now = _now(until)

        def render() -> str:
            context = {
                **overview_data(until),
                "request": request,
                "now": now,
                "until": until,
                "headline": views.HEADLINE,
            }
            return templates.get_template("overview.html").render(context)

        if until is not None:
            return render()
        # Everyone lands here: the rendered page is shared (refreshed every cache_ttl_s).
        return queries.cached(("overview-html",), render)

    @app.get(
        "/tables/{name}", summary="Download an overview table", tags=["pages"], responses=UNKNOWN
    )
    def overview_table(
        name: str, format: TableFormat = TableFormat.csv, until: Until = None
    ) -> Response:
        now = _now(until)
        table = pick(overview_data(until)["tables"], name)
        return download(table, format, f"until={format_time(now)}", "overview")

    @app.get(
        "/targets/{target}",
        response_class=HTMLResponse,
        summary="Target page",
        tags=["pages"],
        responses=UNKNOWN,
    )
    async def target_page(
        request: Request, target: str, monitor: str | None = None, until: Until = None
    ) -> HTMLResponse:
        # A shared page that is ready is answered on the event loop; computing goes to a thread.
        if until is None:
            key = ("target-html", target, monitor, request.url.query)
            html = queries.ready(key, lambda: target_html(request, target, monitor, None))
            if html is not None:
                return HTMLResponse(html)
        return HTMLResponse(await computed(target_html, request, target, monitor, until))

    def target_html(
        request: Request, target: str, monitor: str | None, until: datetime | None
    ) -> str:
        known_target(target)
        known_monitor(target, monitor)
        now = _now(until)

        def render(data: dict[str, Any]) -> str:
            context = {**data, "request": request, "now": now, "until": until}
            return templates.get_template("target.html").render(
                {**context, "window_end": data["until"]}
            )

        if until is not None:
            return render(
                page_data(
                    ("target", target, monitor),
                    until,
                    lambda end: views.target_page(queries, target, monitor, end),
                )
            )
        # Only the rendered page is kept (one string, not the figures' many small objects), and
        # shared (its links carry the query string, hence the key).
        return queries.cached(
            ("target-html", target, monitor, request.url.query),
            lambda: render(views.target_page(queries, target, monitor, datetime.now(UTC))),
        )

    @app.get(
        "/targets/{target}/tables/{name}",
        summary="Download a target-page table",
        tags=["pages"],
        responses=UNKNOWN,
    )
    def target_table(
        target: str,
        name: str,
        format: TableFormat = TableFormat.csv,
        monitor: str | None = None,
        until: Until = None,
    ) -> Response:
        known_target(target)
        known_monitor(target, monitor)
        data = page_data(
            ("target", target, monitor),
            until,
            lambda end: views.target_page(queries, target, monitor, end),
        )
        selection = f"target={target} monitor={data['monitor']} until={format_time(data['until'])}"
        return download(pick(data["tables"], name), format, selection, target)

    @app.get(
        "/aggregate/{target}",
        response_class=HTMLResponse,
        summary="Aggregation views",
        tags=["pages"],
        responses=UNKNOWN,
    )
    def aggregate_page(
        request: Request,
        target: str,
        view: View = View.weekly,
        metric: AggMetric = AggMetric["ping.rtt_avg_ms"],  # type: ignore[valid-type]
        monitor: str | None = None,
        until: Until = None,
    ) -> HTMLResponse:
        known_target(target)
        known_monitor(target, monitor)
        now = _now(until)
        data = page_data(
            ("aggregate", target, monitor, view.value, metric.value),
            until,
            lambda end: views.aggregate_page(
                queries, target, monitor, view.value, metric.value, end
            ),
        )
        return templates.TemplateResponse(
            request,
            "aggregate.html",
            {**data, "now": now, "until": until, "agg_metrics": views.AGG_METRICS},
        )

    @app.get(
        "/aggregate/{target}/tables/{name}",
        summary="Download an aggregation table",
        tags=["pages"],
        responses=UNKNOWN,
    )
    def aggregate_table(
        target: str,
        name: str,
        format: TableFormat = TableFormat.csv,
        view: View = View.weekly,
        metric: AggMetric = AggMetric["ping.rtt_avg_ms"],  # type: ignore[valid-type]
        monitor: str | None = None,
        until: Until = None,
    ) -> Response:
        known_target(target)
        known_monitor(target, monitor)
        data = page_data(
            ("aggregate", target, monitor, view.value, metric.value),
            until,
            lambda end: views.aggregate_page(
                queries, target, monitor, view.value, metric.value, end
            ),
        )
        selection = f"target={target} view={view.value} metric={metric.value}"
        return download(pick(data["tables"], name), format, selection, target)

    def compare_data(
        x: str, y: str, mode: str, target: str | None, until: datetime | None
    ) -> dict[str, Any]:
        if mode == "time":
            if target is None:
                raise HTTPException(422, "mode=time compares runs of one target: give target=")
            known_target(target)
        return page_data(  # type: ignore[no-any-return]
            ("compare", x, y, mode, target),
            until,
            lambda end: views.compare_page(queries, x, y, mode, target, end),  # type: ignore[arg-type]
        )

    @app.get(
        "/compare",
        response_class=HTMLResponse,
        summary="Compare two metrics",
        tags=["pages"],
        responses=UNKNOWN,
    )
    def compare_page(
        request: Request,
        x: MetricName = MetricName["ping.rtt_avg_ms"],  # type: ignore[valid-type]
        y: MetricName = MetricName["iperf3.throughput_bps"],  # type: ignore[valid-type]
        mode: Literal["targets", "time"] = "targets",
        target: str | None = None,
        until: Until = None,
    ) -> HTMLResponse:
        data = compare_data(x.value, y.value, mode, target, until)
        return templates.TemplateResponse(
            request,
            "compare.html",
            {**data, "until": until, "all_metrics": list(METRICS), "targets": queries.targets()},
        )

    @app.get(
        "/compare/tables/{name}",
        summary="Download the compare data",
        tags=["pages"],
        responses=UNKNOWN,
    )
    def compare_table(
        name: str,
        format: TableFormat = TableFormat.csv,
        x: MetricName = MetricName["ping.rtt_avg_ms"],  # type: ignore[valid-type]
        y: MetricName = MetricName["iperf3.throughput_bps"],  # type: ignore[valid-type]
        mode: Literal["targets", "time"] = "targets",
        target: str | None = None,
        until: Until = None,
    ) -> Response:
        data = compare_data(x.value, y.value, mode, target, until)
        selection = f"x={x.value} y={y.value} mode={mode} target={target or 'all'}"
        return download(pick(data["tables"], name), format, selection, "compare")

    # -- REST API ------------------------------------------------------------------------------

    @app.get("/api/v1/health", response_model=Health, tags=["api"])
    def api_health() -> Health:
        """Liveness: answers without touching the archive (the benchmark's baseline)."""
        return Health(status="ok", version=__version__)

    @app.get("/api/v1/targets", response_model=list[TargetProbe], tags=["api"])
    def api_targets() -> list[TargetProbe]:
        """Every target with results, per probe: counts, first and last start (per monitor:
        ``/api/v1/targets/{target}``)."""

        def compute() -> list[TargetProbe]:
            return [
                TargetProbe(
                    target=row["target"],
                    probe=row["probe"],
                    count=row["count"],
                    first_started_at=format_time(row["first"]) if row["first"] else None,
                    last_started_at=format_time(row["last"]) if row["last"] else None,
                )
                for row in queries.target_probes()
            ]

        return queries.cached(("api-targets",), compute)

    @app.get(
        "/api/v1/targets/{target}", response_model=list[TargetInfo], tags=["api"], responses=UNKNOWN
    )
    def api_target(target: str) -> list[TargetInfo]:
        """One target's monitors and probes; 404 when the archive has no result for it."""
        known_target(target)
        return _target_infos(queries, target)

    @app.get("/api/v1/results", response_model=ResultsPage, tags=["api"], responses=UNKNOWN)
    async def api_results(
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        target: str | None = None,
        monitor: str | None = None,
        outcome: Outcome | None = None,
        since: Since = None,
        until: Until = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        order: Literal["asc", "desc"] = "asc",
    ) -> Response:
        """Result envelopes matching every filter (``since`` inclusive, ``until`` exclusive),
        by start time, ``limit`` at a time from ``offset``. An unknown target is a 404."""
        start, end = _utc(since, "since"), _utc(until, "until")
        filters: dict[str, Any] = {
            "probe": probe.value if probe else None,
            "target": target,
            "monitor": monitor,
            "since": start,
            "until": end,
            "outcome": outcome,
        }

        def page() -> str:
            if target is not None:
                known_target(target)
            total, texts = archive.envelope_page(**filters, limit=limit, offset=offset, order=order)
            # The stored envelopes as they were serialised when written (validated then): the
            # page skips decoding, two validations (ours and FastAPI's) and encoding.
            head = f'{{"total": {total}, "limit": {limit}, "offset": {offset}, "results": ['
            return head + ", ".join(texts) + "]}"

        # A page of up to INLINE_LIMIT results takes a few ms: done on the event loop, one at a
        # time. Handed to threads instead, 20 concurrent ones spend most of their time waiting
        # for the GIL after each database call. Larger pages go to a thread.
        body = page() if limit <= INLINE_LIMIT else await run_in_threadpool(page)
        return Response(body, media_type="application/json")

    @app.get("/api/v1/latest", response_model=list[Result], tags=["api"], responses=UNKNOWN)
    def api_latest(
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        target: str | None = None,
        since: Since = None,
    ) -> list[Result]:
        """The newest result envelope of every path (monitor × target × probe) that has a
        result since ``since`` (default: the last 28 days)."""
        if target is not None:
            known_target(target)
        start = _utc(since, "since") or datetime.now(UTC) - views.HISTORY
        return queries.latest(probe.value if probe else None, target, start)

    @app.get("/api/v1/aggregates", response_model=Aggregates, tags=["api"], responses=UNKNOWN)
    def api_aggregates(
        target: str,
        metric: MetricName,  # type: ignore[valid-type]
        period: Literal["hour", "day", "week", "month"] = "day",
        monitor: str | None = None,
        since: Since = None,
        until: Until = None,
    ) -> Aggregates:
        """Count/min/mean/max/median of one metric per period (UTC; weeks start on Monday)
        over successful results; default window: the year before ``until`` (default now)."""
        known_target(target)
        end = _now(until)
        start = _utc(since, "since") or end - views.YEAR
        m = METRICS[metric.value]
        frame = queries.frame(
            m.probe, [m.key], target=target, monitor=monitor, since=start, until=end
        )
        buckets = [
            Bucket(**{**b, "start": format_time(b["start"])})
            for b in views.aggregate(frame, m.key, period)
        ]
        return Aggregates(
            target=target, monitor=monitor, metric=m.name, period=period, buckets=buckets
        )

    @app.get("/api/v1/alerts", response_model=AlertsPage, tags=["api"], responses=UNKNOWN)
    def api_alerts(
        target: str | None = None,
        monitor: str | None = None,
        cause: str | None = None,
        since: Since = None,
        until: Until = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    ) -> AlertsPage:
        """Step changes found in the paths' series, with their likely ``cause`` (route, host,
        tuning, unknown), newest first; ``since``/``until`` select by detection time. An
        unknown target is a 404."""
        if target is not None:
            known_target(target)
        total, rows = queries.alerts(
            target=target,
            monitor=monitor,
            cause=cause,
            since=_utc(since, "since"),
            until=_utc(until, "until"),
            limit=limit,
            offset=offset,
        )
        alerts = [Alert(**_times(r, "detected_at", "change_at", "delivered_at")) for r in rows]
        return AlertsPage(total=total, limit=limit, offset=offset, alerts=alerts)

    @app.get("/api/v1/studies", response_model=StudiesPage, tags=["api"], responses=UNKNOWN)
    def api_studies(
        target: str | None = None,
        kind: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    ) -> StudiesPage:
        """Tuning, duration and impact studies with every point measured, newest first. An
        unknown target is a 404."""
        if target is not None:
            known_target(target)
        total, rows = queries.studies(target=target, kind=kind, limit=limit, offset=offset)
        studies = [Study(**_times(r, "started_at", "finished_at")) for r in rows]
        return StudiesPage(total=total, limit=limit, offset=offset, studies=studies)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        tags=["metrics"],
        summary="Prometheus exposition format",
    )
    def metrics() -> Response:
        """Latest value per path and probe in base units (seconds, bits/s, bytes, ratio), runs
        by outcome and cycle overruns from the archive, and (in the monitor's process) its
        archive write failures."""
        body, content_type = metrics_text(queries, health)
        return Response(body, media_type=content_type)

    return app


def _target_infos(queries: Queries, target: str) -> list[TargetInfo]:
    return [
        TargetInfo(
            target=target,
            monitor=row["monitor"],
            probe=row["probe"],
            count=row["count"],
            first_started_at=format_time(row["first"]) if row["first"] else None,
            last_started_at=format_time(row["last"]) if row["last"] else None,
        )
        for row in queries.target_summary(target)
    ]

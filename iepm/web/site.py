"""The report pages (HTML) and their tables' downloads (``…/tables/NAME?format=csv|tsv``)."""

# No "from __future__ import annotations": the routes' enums are made per app (in router()),
# and FastAPI must see annotations as objects, not as names it cannot resolve.

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from iepm.probes import all_metrics
from iepm.results import format_time
from iepm.web.context import UNKNOWN, Until, WebContext, now_of, web
from iepm.web.pages import aggregate, compare, overview, target
from iepm.web.tables import TableFormat, download, pick

Context = Annotated[WebContext, Depends(web)]
Window = Annotated[
    Literal["1h", "6h", "1d", "7d", "28d", "90d", "365d"],
    Query(description="the span the target page shows, ending at until (or now)"),
]
FitModel = Annotated[
    Literal["auto", "power", "linear", "origin"],
    Query(
        description="auto: a power law y = a·x^b when every value is positive, else a line "
        "y = c + m·x; origin: y = m·x (assumes y grows with x)"
    ),
]


class View(StrEnum):
    last7 = "last7"
    weekly = "weekly"
    daily = "daily"
    weekday = "weekday"
    workday = "workday"
    monthly = "monthly"


def _context(page: Any) -> dict[str, Any]:
    """A page's fields (and properties) for its template."""
    names = [
        *vars(page),
        *(n for n in dir(type(page)) if isinstance(getattr(type(page), n), property)),
    ]
    return {name: getattr(page, name) for name in names}


def router() -> APIRouter:
    """The pages' routes. Metric choices are the registry's when the app is made."""
    metrics = list(all_metrics())
    agg_names = [m.name for m in aggregate.agg_metrics()]
    MetricName = StrEnum("MetricName", {n: n for n in metrics})  # type: ignore[misc]
    AggMetric = StrEnum("AggMetric", {n: n for n in agg_names})  # type: ignore[misc]
    # Defaults: the RTPL pair when registered, else the first metrics there are.
    x_default = MetricName(
        aggregate.AGG_METRICS[0] if aggregate.AGG_METRICS[0] in metrics else metrics[0]
    )
    y_default = MetricName(aggregate.THROUGHPUT if aggregate.THROUGHPUT in metrics else metrics[-1])
    agg_default = AggMetric(agg_names[0])
    pages = APIRouter(tags=["pages"], responses=UNKNOWN)

    def overview_data(w: WebContext, until: datetime | None) -> overview.Overview:
        return w.page_data(  # type: ignore[no-any-return]
            ("overview",),
            until,
            lambda now: overview.overview(
                w.queries, now, w.places, ahead=until is None, thresholds=w.thresholds
            ),
        )

    def overview_html(w: WebContext, request: Request, until: datetime | None) -> str:
        """The overview rendered from figures computed for it now (never a cached copy: this
        is what refreshes the shared page), or from those at ``until``."""
        now = now_of(until)
        if until is None:
            begun = w.queries.clock()
            data = overview.overview(w.queries, now, w.places, ahead=True, thresholds=w.thresholds)
            w.queries.put(("overview", "now"), data, begun)  # the downloads agree with the page
        else:
            data = overview_data(w, until)
        context = {**_context(data), "request": request, "now": now, "until": until}
        return w.templates.get_template("overview.html").render(context)

    @pages.get("/", response_class=HTMLResponse, summary="Overview page")
    async def overview_page(w: Context, request: Request, until: Until = None) -> HTMLResponse:
        if until is not None:
            return HTMLResponse(await w.computed(overview_html, w, request, until))
        # Everyone lands here: the rendered page is shared (refreshed every cache_ttl_s). A
        # page that is ready is answered on the event loop; computing goes to a thread.
        key = ("overview-html",)

        def fresh() -> str:
            return overview_html(w, request, None)

        html = w.queries.ready(key, fresh)
        if html is None:
            html = await w.computed(w.queries.cached, key, fresh)
        return HTMLResponse(html)

    @pages.get("/tables/{name}", summary="Download an overview table")
    def overview_table(
        w: Context, name: str, format: TableFormat = TableFormat.csv, until: Until = None
    ) -> Response:
        now = now_of(until)
        table = pick(overview_data(w, until).tables, name)
        return download(table, format, f"until={format_time(now)}", "overview")

    def target_data(
        w: WebContext, name: str, monitor: str | None, until: datetime | None, window: str
    ) -> target.TargetPage:
        return w.page_data(  # type: ignore[no-any-return]
            ("target", name, monitor, window),
            until,
            lambda end: target.target_page(w.queries, name, monitor, end, target.WINDOWS[window]),
        )

    def target_html(
        w: WebContext,
        request: Request,
        name: str,
        monitor: str | None,
        until: datetime | None,
        window: str,
    ) -> str:
        """The target page rendered from figures computed for it now (never a cached copy:
        this is what refreshes the shared page), or from those at ``until``."""
        w.known_target(name)
        w.known_monitor(name, monitor)
        if until is None:
            span = target.WINDOWS[window]
            page = target.target_page(w.queries, name, monitor, datetime.now(UTC), span)
        else:
            page = target_data(w, name, monitor, until, window)
        context = {
            **_context(page),
            "request": request,
            "now": now_of(until),
            "until": until,
            "window": window,
            # The picker's links: this page's query with another window.
            "window_links": [
                (span, "?" + urlencode({**request.query_params, "window": span}))
                for span in target.WINDOWS
            ],
        }
        return w.templates.get_template("target.html").render({**context, "window_end": page.until})

    @pages.get("/targets/{target}", response_class=HTMLResponse, summary="Target page")
    async def target_page(
        w: Context,
        request: Request,
        target: str,
        monitor: str | None = None,
        until: Until = None,
        window: Window = "28d",
    ) -> HTMLResponse:
        if until is not None:
            html = await w.computed(target_html, w, request, target, monitor, until, window)
            return HTMLResponse(html)
        # Only the rendered page is kept (one string, not the figures' many small objects), and
        # shared (its links carry the query string, hence the key). A page that is ready is
        # answered on the event loop; computing goes to a thread.
        key = ("target-html", target, monitor, request.url.query)

        def fresh() -> str:
            return target_html(w, request, target, monitor, None, window)

        html = w.queries.ready(key, fresh)
        if html is None:
            html = await w.computed(w.queries.cached, key, fresh)
        return HTMLResponse(html)

    @pages.get("/targets/{target}/tables/{name}", summary="Download a target-page table")
    def target_table(
        w: Context,
        target: str,
        name: str,
        format: TableFormat = TableFormat.csv,
        monitor: str | None = None,
        until: Until = None,
        window: Window = "28d",
    ) -> Response:
        w.known_target(target)
        w.known_monitor(target, monitor)
        page = target_data(w, target, monitor, until, window)
        selection = f"target={target} monitor={page.monitor} until={format_time(page.until)}"
        return download(pick(page.tables, name), format, selection, target)

    def aggregate_data(
        w: WebContext,
        name: str,
        monitor: str | None,
        view: View,
        metric: str,
        until: datetime | None,
    ) -> aggregate.AggregatePage:
        w.known_target(name)
        w.known_monitor(name, monitor)
        return w.page_data(  # type: ignore[no-any-return]
            ("aggregate", name, monitor, view.value, metric),
            until,
            lambda end: aggregate.aggregate_page(w.queries, name, monitor, view.value, metric, end),
        )

    @pages.get("/aggregate/{target}", response_class=HTMLResponse, summary="Aggregation views")
    def aggregate_page(
        w: Context,
        request: Request,
        target: str,
        view: View = View.weekly,
        metric: AggMetric = agg_default,  # type: ignore[valid-type]
        monitor: str | None = None,
        until: Until = None,
    ) -> HTMLResponse:
        page = aggregate_data(w, target, monitor, view, metric.value, until)
        return w.templates.TemplateResponse(
            request,
            "aggregate.html",
            {**_context(page), "now": now_of(until), "until": until, "agg_metrics": agg_names},
        )

    @pages.get("/aggregate/{target}/tables/{name}", summary="Download an aggregation table")
    def aggregate_table(
        w: Context,
        target: str,
        name: str,
        format: TableFormat = TableFormat.csv,
        view: View = View.weekly,
        metric: AggMetric = agg_default,  # type: ignore[valid-type]
        monitor: str | None = None,
        until: Until = None,
    ) -> Response:
        page = aggregate_data(w, target, monitor, view, metric.value, until)
        selection = f"target={target} view={view.value} metric={metric.value}"
        return download(pick(page.tables, name), format, selection, target)

    def compare_data(
        w: WebContext,
        x: str,
        y: str,
        mode: compare.Mode,
        name: str | None,
        until: datetime | None,
        fit: compare.Fit,
    ) -> compare.ComparePage:
        if mode == "time":
            if name is None:
                raise HTTPException(422, "mode=time compares runs of one target: give target=")
            w.known_target(name)
        return w.page_data(  # type: ignore[no-any-return]
            ("compare", x, y, mode, name, fit),
            until,
            lambda end: compare.compare_page(w.queries, x, y, mode, name, end, model=fit),
        )

    @pages.get("/compare", response_class=HTMLResponse, summary="Compare two metrics")
    def compare_page(
        w: Context,
        request: Request,
        x: MetricName = x_default,  # type: ignore[valid-type]
        y: MetricName = y_default,  # type: ignore[valid-type]
        mode: Literal["targets", "time"] = "targets",
        target: str | None = None,
        until: Until = None,
        fit: FitModel = "auto",
    ) -> HTMLResponse:
        page = compare_data(w, x.value, y.value, mode, target, until, fit)
        return w.templates.TemplateResponse(
            request,
            "compare.html",
            {
                **_context(page),
                "until": until,
                "all_metrics": metrics,
                "targets": w.queries.targets(),
            },
        )

    @pages.get("/compare/tables/{name}", summary="Download the compare data")
    def compare_table(
        w: Context,
        name: str,
        format: TableFormat = TableFormat.csv,
        x: MetricName = x_default,  # type: ignore[valid-type]
        y: MetricName = y_default,  # type: ignore[valid-type]
        mode: Literal["targets", "time"] = "targets",
        target: str | None = None,
        until: Until = None,
        fit: FitModel = "auto",
    ) -> Response:
        page = compare_data(w, x.value, y.value, mode, target, until, fit)
        selection = f"x={x.value} y={y.value} mode={mode} target={target or 'all'}"
        return download(pick(page.tables, name), format, selection, "compare")

    return pages

"""The REST API (``/api/v1``): targets, result envelopes, aggregates, alerts and studies;
forecasts, diurnal fits and advice per path (iepm.web.predict_api)."""

# No "from __future__ import annotations": the routes' enums are made per app (in router()),
# and FastAPI must see annotations as objects, not as names it cannot resolve.

from enum import StrEnum
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from iepm import __version__
from iepm.analysis.statistics import aggregate
from iepm.probes import PROBES, all_metrics
from iepm.results import Outcome, Purpose, Result, format_time
from iepm.web import predict_api
from iepm.web.context import UNKNOWN, Since, Until, WebContext, now_of, utc, web
from iepm.web.queries import Queries
from iepm.web.tables import HISTORY, YEAR

Context = Annotated[WebContext, Depends(web)]
MAX_LIMIT = 10_000
INLINE_LIMIT = 1000  # /api/v1/results pages up to this size are built on the event loop
# Offsets beyond this are refused: SQLite's integers are 64-bit and nobody pages that far.
MAX_OFFSET = 1_000_000_000


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


def router() -> APIRouter:
    """The API's routes. The probe and metric choices are the registry's when the app is made."""
    ProbeName = StrEnum("ProbeName", {n: n for n in PROBES})  # type: ignore[misc]
    MetricName = StrEnum("MetricName", {n: n for n in all_metrics()})  # type: ignore[misc]
    api = APIRouter(prefix="/api/v1", tags=["api"])

    @api.get("/health", response_model=Health)
    def api_health() -> Health:
        """Liveness: answers without touching the archive (the benchmark's baseline)."""
        return Health(status="ok", version=__version__)

    @api.get("/targets", response_model=list[TargetProbe])
    def api_targets(w: Context) -> list[TargetProbe]:
        """Every target with results, per probe: counts, first and last start (per monitor:
        ``/api/v1/targets/{target}``)."""
        q = w.queries

        def compute() -> list[TargetProbe]:
            return [
                TargetProbe(
                    target=row["target"],
                    probe=row["probe"],
                    count=row["count"],
                    first_started_at=format_time(row["first"]) if row["first"] else None,
                    last_started_at=format_time(row["last"]) if row["last"] else None,
                )
                for row in q.target_probes()
            ]

        return q.cached(("api-targets",), compute)

    @api.get("/targets/{target}", response_model=list[TargetInfo], responses=UNKNOWN)
    def api_target(w: Context, target: str) -> list[TargetInfo]:
        """One target's monitors and probes; 404 when the archive has no result for it."""
        w.known_target(target)
        return _target_infos(w.queries, target)

    @api.get("/results", response_model=ResultsPage, responses=UNKNOWN)
    async def api_results(
        w: Context,
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        target: str | None = None,
        monitor: str | None = None,
        outcome: Outcome | None = None,
        since: Since = None,
        until: Until = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
        order: Literal["asc", "desc"] = "asc",
        purpose: Annotated[
            Purpose, Query(description="routine series, or the runs of tuning/impact studies")
        ] = Purpose.ROUTINE,
    ) -> Response:
        """Result envelopes matching every filter (``since`` inclusive, ``until`` exclusive),
        by start time, ``limit`` at a time from ``offset``. An unknown target is a 404."""
        start, end = utc(since, "since"), utc(until, "until")
        filters: dict[str, Any] = {
            "probe": probe.value if probe else None,
            "target": target,
            "monitor": monitor,
            "since": start,
            "until": end,
            "outcome": outcome,
            "purpose": purpose,
        }

        def page() -> str:
            if target is not None:
                w.known_target(target)
            total, texts = w.queries.archive.envelope_page(
                **filters, limit=limit, offset=offset, order=order
            )
            # The stored envelopes as they were serialised when written (validated then): the
            # page skips decoding, two validations (ours and FastAPI's) and encoding.
            head = f'{{"total": {total}, "limit": {limit}, "offset": {offset}, "results": ['
            return head + ", ".join(texts) + "]}"

        # A page of up to INLINE_LIMIT results takes a few ms: done on the event loop, one at a
        # time. Handed to threads instead, 20 concurrent ones spend most of their time waiting
        # for the GIL after each database call. Larger pages go to a thread.
        body = page() if limit <= INLINE_LIMIT else await run_in_threadpool(page)
        return Response(body, media_type="application/json")

    @api.get("/latest", response_model=list[Result], responses=UNKNOWN)
    def api_latest(
        w: Context,
        probe: ProbeName | None = None,  # type: ignore[valid-type]
        target: str | None = None,
        since: Since = None,
    ) -> list[Result]:
        """The newest result envelope of every path (monitor × target × probe) that has a
        result since ``since`` (default: the last 28 days)."""
        if target is not None:
            w.known_target(target)
        start = utc(since, "since") or now_of(None) - HISTORY
        return w.queries.latest(probe.value if probe else None, target, start)

    @api.get("/aggregates", response_model=Aggregates, responses=UNKNOWN)
    def api_aggregates(
        w: Context,
        target: str,
        metric: MetricName,  # type: ignore[valid-type]
        period: Literal["hour", "day", "week", "month"] = "day",
        monitor: str | None = None,
        since: Since = None,
        until: Until = None,
    ) -> Aggregates:
        """Count/min/mean/max/median of one metric per period (UTC; weeks start on Monday)
        over successful results; default window: the year before ``until`` (default now)."""
        w.known_target(target)
        end = now_of(until)
        start = utc(since, "since") or end - YEAR
        m = all_metrics()[metric.value]
        frame = w.queries.frame(
            m.probe, [m.key], target=target, monitor=monitor, since=start, until=end
        )
        ok = frame.ok()
        buckets = [
            Bucket(**{**b._asdict(), "start": format_time(b.start)})
            for b in aggregate(frame.t[ok], frame.values[m.key][ok], period)
        ]
        return Aggregates(
            target=target, monitor=monitor, metric=m.name, period=period, buckets=buckets
        )

    @api.get("/alerts", response_model=AlertsPage, responses=UNKNOWN)
    def api_alerts(
        w: Context,
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
            w.known_target(target)
        total, rows = w.queries.alerts(
            target=target,
            monitor=monitor,
            cause=cause,
            since=utc(since, "since"),
            until=utc(until, "until"),
            limit=limit,
            offset=offset,
        )
        alerts = [Alert(**_times(r, "detected_at", "change_at", "delivered_at")) for r in rows]
        return AlertsPage(total=total, limit=limit, offset=offset, alerts=alerts)

    @api.get("/studies", response_model=StudiesPage, responses=UNKNOWN)
    def api_studies(
        w: Context,
        target: str | None = None,
        kind: str | None = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    ) -> StudiesPage:
        """Tuning, duration and impact studies with every point measured, newest first. An
        unknown target is a 404."""
        if target is not None:
            w.known_target(target)
        total, rows = w.queries.studies(target=target, kind=kind, limit=limit, offset=offset)
        studies = [Study(**_times(r, "started_at", "finished_at")) for r in rows]
        return StudiesPage(total=total, limit=limit, offset=offset, studies=studies)

    predict_api.routes(api, ProbeName)
    return api

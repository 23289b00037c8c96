"""A mesh pair's page (RTPL's tables per pair): ``/mesh/pair`` and ``/api/v1/mesh/pair``.

Both directions of one pair side by side, for every metric measured between them and every route
label (the QoS route beside the Internet route of the same two sites): over the last ``days``
UTC days, each direction's count, mean, standard deviation, minimum and maximum, and a table of
daily means a → b and b → a. Read from the daily summaries, as the grid is (iepm/web/pages/mesh.py),
so a pair's year is a few hundred rows. ``format=csv`` downloads the daily table.
"""

# No "from __future__ import annotations": FastAPI must see the routes' annotations as objects.

import csv
import html
import io
import math
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import and_, or_, select

from iepm.probes import all_metrics
from iepm.store import rollup
from iepm.store.schema import daily as DAILY
from iepm.web.context import INVALID, UNKNOWN, WebContext, web
from iepm.web.pages.mesh import host_and_route
from iepm.web.queries import Queries

Context = Annotated[WebContext, Depends(web)]
Days = Annotated[int, Query(ge=1, le=366, description="whole UTC days back, today included")]
Host = Annotated[str, Query(min_length=1, max_length=200, description="a mesh host's name")]


class Direction(BaseModel):
    n: int
    mean: float | None
    std: float | None
    minimum: float | None
    maximum: float | None


class PairRow(BaseModel):
    metric: str = Field(description="registry name, e.g. iperf3.throughput_bps")
    label: str
    route: str = Field(description='address label ("" for a host\'s only address)')
    forward: Direction = Field(description="a → b")
    reverse: Direction = Field(description="b → a")


class PairDay(BaseModel):
    day: date
    metric: str
    route: str
    forward: float | None
    reverse: float | None


class Pair(BaseModel):
    a: str
    b: str
    days: int
    since: datetime
    rows: list[PairRow]
    daily: list[PairDay]


class _Acc:
    __slots__ = ("maximum", "minimum", "n", "sq_known", "total", "total_sq")

    def __init__(self) -> None:
        self.n, self.total, self.total_sq = 0, 0.0, 0.0
        self.minimum: float | None = None
        self.maximum: float | None = None
        self.sq_known = True

    def add(self, n: int, total: float, total_sq: float | None, lo: Any, hi: Any) -> None:
        self.n += n
        self.total += total
        if total_sq is None:
            self.sq_known = False
        else:
            self.total_sq += total_sq
        if lo is not None:
            self.minimum = float(lo) if self.minimum is None else min(self.minimum, float(lo))
        if hi is not None:
            self.maximum = float(hi) if self.maximum is None else max(self.maximum, float(hi))

    def direction(self) -> Direction:
        if not self.n:
            return Direction(n=0, mean=None, std=None, minimum=None, maximum=None)
        mean = self.total / self.n
        std = None
        if self.sq_known and self.n > 1:
            # Sample standard deviation from the sums; tiny negative rounding is zero.
            std = math.sqrt(max(0.0, (self.total_sq - self.n * mean * mean) / (self.n - 1)))
        return Direction(n=self.n, mean=mean, std=std, minimum=self.minimum, maximum=self.maximum)


def pair(queries: Queries, a: str, b: str, days: int, now: datetime) -> Pair:
    first = rollup.day_of(now) - timedelta(days=days - 1)
    names = {(m.probe, m.key): m for m in all_metrics().values()}

    def toward(src: str, dst: str) -> Any:
        return and_(
            DAILY.c.monitor == src, or_(DAILY.c.target == dst, DAILY.c.target.like(f"{dst}.%"))
        )

    query = select(
        DAILY.c.monitor, DAILY.c.target, DAILY.c.probe, DAILY.c.metric, DAILY.c.day,
        DAILY.c.n, DAILY.c.total, DAILY.c.total_sq, DAILY.c.minimum, DAILY.c.maximum,
    ).where(DAILY.c.day >= first, or_(toward(a, b), toward(b, a)))  # fmt: skip
    with queries.engine.connect() as conn:
        rows = conn.execute(query).all()
    sums: dict[tuple[str, str, bool], _Acc] = defaultdict(_Acc)
    per_day: dict[tuple[date, str, str, bool], tuple[int, float]] = {}
    for monitor, target, probe, key, day, n, total, total_sq, lo, hi in rows:
        metric = names.get((probe, key))
        host, route = host_and_route(str(target))
        if metric is None or not n or host not in (a, b) or host == monitor:
            continue  # "runs" counts and keys no registered probe declares
        forward = monitor == a
        sums[(metric.name, route, forward)].add(int(n), float(total), total_sq, lo, hi)
        per_day[(day, metric.name, route, forward)] = (int(n), float(total))
    metrics = all_metrics()
    keys = sorted(
        {(name, route) for name, route, _ in sums}, key=lambda k: (list(metrics).index(k[0]), k[1])
    )
    table = [
        PairRow(
            metric=name,
            label=metrics[name].label,
            route=route,
            forward=sums.get((name, route, True), _Acc()).direction(),
            reverse=sums.get((name, route, False), _Acc()).direction(),
        )
        for name, route in keys
    ]

    def mean(key: tuple[date, str, str, bool]) -> float | None:
        n, total = per_day.get(key, (0, 0.0))
        return total / n if n else None

    daily = [
        PairDay(day=day, metric=name, route=route, forward=mean((day, name, route, True)),
                reverse=mean((day, name, route, False)))
        for day, name, route in sorted({(d, m, r) for d, m, r, _ in per_day})
    ]  # fmt: skip
    return Pair(a=a, b=b, days=days, since=rollup.day_start(first), rows=table, daily=daily)


def _figure(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def render(p: Pair) -> str:
    e = html.escape
    head = (
        "<tr><th>metric</th><th>route</th>"
        f'<th colspan="5">{e(p.a)} → {e(p.b)}</th><th colspan="5">{e(p.b)} → {e(p.a)}</th></tr>'
        "<tr><th></th><th></th>" + "<th>n</th><th>mean</th><th>sd</th><th>min</th><th>max</th>" * 2
    )
    body = []
    for row in p.rows:
        cells = []
        for d in (row.forward, row.reverse):
            cells += [str(d.n), *(_figure(v) for v in (d.mean, d.std, d.minimum, d.maximum))]
        body.append(
            f'<tr><td title="{e(row.metric)}">{e(row.label)}</td><td>{e(row.route or "–")}</td>'
            + "".join(f"<td>{c}</td>" for c in cells)
            + "</tr>"
        )
    days = "".join(
        f"<tr><td>{d.day}</td><td>{e(d.metric)}</td><td>{e(d.route or '–')}</td>"
        f"<td>{_figure(d.forward)}</td><td>{_figure(d.reverse)}</td></tr>"
        for d in p.daily
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>iepm pair {e(p.a)} ↔ {e(p.b)}</title>"
        '<link rel="stylesheet" href="/static/iepm.css"></head><body>'
        f'<p><a href="/mesh">mesh grid</a></p><h1>{e(p.a)} ↔ {e(p.b)}</h1>'
        f"<p>Both directions over {p.days} UTC days since {p.since:%Y-%m-%d}, per route "
        "(QoS beside Internet where a site has both), from the daily summaries.</p>"
        f'<table class="pair">{head}{"".join(body)}</table>'
        f'<h2>Daily means</h2><p><a href="/mesh/pair?a={e(p.a)}&amp;b={e(p.b)}&amp;days={p.days}'
        '&amp;format=csv">download CSV</a></p>'
        f"<table><tr><th>day</th><th>metric</th><th>route</th><th>{e(p.a)} → {e(p.b)}</th>"
        f"<th>{e(p.b)} → {e(p.a)}</th></tr>{days}</table></body></html>"
    )


def csv_text(p: Pair) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["day", "metric", "route", f"{p.a}_to_{p.b}", f"{p.b}_to_{p.a}"])
    for d in p.daily:
        writer.writerow([d.day.isoformat(), d.metric, d.route, *(
            "" if v is None else repr(v) for v in (d.forward, d.reverse))])  # fmt: skip
    return out.getvalue()


def router() -> APIRouter:
    routes = APIRouter(responses=INVALID)

    async def compute(w: WebContext, a: str, b: str, days: int) -> Pair:
        if a == b:
            raise HTTPException(422, "query.b: must differ from query.a")
        now = datetime.now(UTC)
        found = await w.computed(
            lambda: w.queries.cached(
                ("mesh-pair", a, b, days, rollup.day_of(now)),
                lambda: pair(w.queries, a, b, days, now),
            )
        )
        if not found.rows:
            raise HTTPException(404, f"no results between {a!r} and {b!r} in the last {days} days")
        return found

    @routes.get("/api/v1/mesh/pair", response_model=Pair, tags=["api"], responses=UNKNOWN)
    async def api_pair(w: Context, a: Host, b: Host, days: Days = 7) -> Pair:
        """One pair of a mesh, both directions side by side, per metric and route."""
        return await compute(w, a, b, days)

    @routes.get("/mesh/pair", response_class=HTMLResponse, tags=["pages"], responses=UNKNOWN)
    async def pair_page(
        w: Context, a: Host, b: Host, days: Days = 7, format: Literal["html", "csv"] = "html"
    ) -> Any:
        """The pair page (``format=csv``: its daily means as CSV)."""
        found = await compute(w, a, b, days)
        if format == "csv":
            return Response(
                csv_text(found),
                media_type="text/csv",
                headers={"Content-Disposition": f'attachment; filename="pair-{a}-{b}.csv"'},
            )
        return HTMLResponse(render(found))

    return routes

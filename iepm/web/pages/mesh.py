"""The mesh grid (MaDDash's view, both directions per cell): ``/mesh`` and
``/api/v1/mesh/grid``.

Rows are sources (monitors), columns destinations (hosts); a mesh's targets are named HOST or
HOST.LABEL (iepm.mesh), so a cell holds one figure per route label, each with its reverse
direction beside it, and is flagged when the two directions differ by more than ``asymmetry``
times. Figures are means of the metric over the last ``days`` whole UTC days, read from the
daily summaries (a 50-host mesh over a year is a few rows per path and day, not its results).
"""

# No "from __future__ import annotations": FastAPI must see the routes' annotations as objects.

import html
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field
from sqlalchemy import func, select

from iepm.probes import all_metrics
from iepm.probes import metric as metric_named
from iepm.probes.base import Metric
from iepm.store import rollup
from iepm.store.schema import daily as DAILY
from iepm.web.context import INVALID, WebContext, web
from iepm.web.queries import Queries

Context = Annotated[WebContext, Depends(web)]
Days = Annotated[int, Query(ge=1, le=366, description="whole UTC days back, today included")]
Ratio = Annotated[
    float, Query(gt=1.0, le=1000.0, description="flag a pair whose directions differ this much")
]


class Cell(BaseModel):
    source: str
    destination: str
    route: str = Field(description='address label of the destination ("" for its only one)')
    forward: float | None = Field(description="source → destination mean")
    reverse: float | None = Field(description="destination → source mean (same route label)")
    n_forward: int
    n_reverse: int
    asymmetric: bool = Field(description="both directions known and differ more than the ratio")


class Grid(BaseModel):
    metric: str
    label: str
    better: str
    days: int
    since: datetime
    hosts: list[str]
    cells: list[Cell]


@dataclass
class _Sums:
    n: int = 0
    total: float = 0.0
    routes: dict[str, tuple[int, float]] = field(default_factory=dict)


def host_and_route(target: str) -> tuple[str, str]:
    host, _, route = target.partition(".")
    return host, route


def grid(queries: Queries, metric: Metric, days: int, ratio: float, now: datetime) -> Grid:
    first = rollup.day_of(now) - timedelta(days=days - 1)
    query = (
        select(DAILY.c.monitor, DAILY.c.target, func.sum(DAILY.c.n), func.sum(DAILY.c.total))
        .where(DAILY.c.probe == metric.probe, DAILY.c.metric == metric.key, DAILY.c.day >= first)
        .group_by(DAILY.c.monitor, DAILY.c.target)
    )
    with queries.engine.connect() as conn:
        rows = conn.execute(query).all()
    means: dict[tuple[str, str, str], tuple[int, float]] = {}
    hosts: set[str] = set()
    for monitor, target, n, total in rows:
        host, route = host_and_route(str(target))
        if n:
            means[(str(monitor), host, route)] = (int(n), float(total) / int(n))
            hosts.update((str(monitor), host))
    cells = []
    for (source, destination, route), (n, value) in sorted(means.items()):
        back_n, back = means.get((destination, source, route), (0, None))
        uneven = (
            back is not None
            and min(value, back) > 0
            and max(value, back) / min(value, back) > ratio
        ) or (back is not None and min(value, back) <= 0 < max(value, back))
        cells.append(
            Cell(
                source=source,
                destination=destination,
                route=route,
                forward=value,
                reverse=back,
                n_forward=n,
                n_reverse=back_n,
                asymmetric=bool(uneven),
            )
        )
    return Grid(
        metric=metric.name,
        label=metric.label,
        better=metric.better,
        days=days,
        since=rollup.day_start(first),
        hosts=sorted(hosts),
        cells=cells,
    )


def _metric(name: str) -> Metric:
    try:
        return metric_named(name)
    except KeyError:
        known = ", ".join(all_metrics())
        raise HTTPException(
            422, f"query.metric: unknown metric {name!r} (known: {known})"
        ) from None


def _default_metric() -> str:
    headline = [m.name for m in all_metrics().values() if m.headline]
    return headline[0] if headline else next(iter(all_metrics()))


def _figure(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"


def render(g: Grid) -> str:
    """The grid as a page: each cell shows → and ←, flagged cells marked."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in g.hosts)
    by_pair: dict[tuple[str, str], list[Cell]] = {}
    for cell in g.cells:
        by_pair.setdefault((cell.source, cell.destination), []).append(cell)
    rows = []
    for source in g.hosts:
        tds = []
        for destination in g.hosts:
            parts = []
            for c in by_pair.get((source, destination), []):
                flag = ' class="asymmetric" title="directions differ"' if c.asymmetric else ""
                route = f"{e(c.route)}: " if c.route else ""
                parts.append(
                    f"<div{flag}>{route}→ {_figure(c.forward)} ← {_figure(c.reverse)}</div>"
                )
            link = f"/mesh/pair?a={e(source)}&amp;b={e(destination)}&amp;days={g.days}"
            inner = f'<a href="{link}">{"".join(parts)}</a>' if parts else ""
            tds.append(f"<td>{inner}</td>")
        rows.append(f"<tr><th>{e(source)}</th>{''.join(tds)}</tr>")
    options = "".join(
        f'<option value="{e(n)}"{" selected" if n == g.metric else ""}>{e(n)}</option>'
        for n in all_metrics()
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>iepm mesh: {e(g.label)}</title>"
        '<link rel="stylesheet" href="/static/iepm.css">'
        "<style>td div.asymmetric{font-weight:bold;color:#b00}</style></head><body>"
        f"<h1>Mesh: {e(g.label)} ({e(g.metric)})</h1>"
        f'<form method="get"><select name="metric">{options}</select> '
        f'<input name="days" type="number" min="1" max="366" value="{g.days}"> days '
        '<button type="submit">show</button></form>'
        f"<p>Means since {g.since:%Y-%m-%d} (UTC); rows: source, columns: destination; "
        f"each cell: → source to destination, ← back; {e(g.better)} is better; "
        "bold red: the two directions differ.</p>"
        f'<table class="grid"><tr><th></th>{head}</tr>{"".join(rows)}</table></body></html>'
    )


def router() -> APIRouter:
    routes = APIRouter(responses=INVALID)

    def grid_of(w: WebContext, chosen: Metric, days: int, ratio: float, now: datetime) -> Grid:
        return w.queries.cached(
            ("mesh-grid", chosen.name, days, ratio, rollup.day_of(now)),
            lambda: grid(w.queries, chosen, days, ratio, now),
        )

    async def compute(w: WebContext, metric: str | None, days: int, ratio: float) -> Grid:
        chosen = _metric(metric or _default_metric())
        now = datetime.now(UTC)
        return await w.computed(lambda: grid_of(w, chosen, days, ratio, now))

    async def page(w: WebContext, metric: str | None, days: int, ratio: float) -> str:
        # A 50-host grid is 2,450 cells: its HTML is kept as long as the figures it shows.
        chosen = _metric(metric or _default_metric())
        now = datetime.now(UTC)
        return await w.computed(
            lambda: w.queries.cached(
                ("mesh-grid-html", chosen.name, days, ratio, rollup.day_of(now)),
                # From fresh figures, not the cached grid: the page is at most one TTL old.
                lambda: render(grid(w.queries, chosen, days, ratio, now)),
            )
        )

    @routes.get("/api/v1/mesh/grid", response_model=Grid, tags=["api"])
    async def api_grid(
        w: Context, metric: str | None = None, days: Days = 7, asymmetry: Ratio = 1.5
    ) -> Grid:
        """Source × destination means of one metric, both directions per cell."""
        return await compute(w, metric, days, asymmetry)

    @routes.get("/mesh", response_class=HTMLResponse, tags=["pages"])
    async def mesh_page(
        w: Context, metric: str | None = None, days: Days = 7, asymmetry: Ratio = 1.5
    ) -> Any:
        """The mesh grid page."""
        return HTMLResponse(await page(w, metric, days, asymmetry))

    return routes

"""``iepm serve``: report pages, the REST API (``/api/v1``) and ``/metrics`` over one archive.

Pages are rendered on the server with Jinja2; their charts are drawn by uPlot from JSON embedded
in the page, and every table and chart's data can be downloaded as CSV or TSV from the same
URL with ``/tables/NAME?format=csv``. Nothing is loaded from outside the server.

The app is assembled from three routers: the pages (iepm.web.site, one module per page in
iepm.web.pages), the REST API (iepm.web.api) and ``/metrics`` (iepm.web.metrics). Probes,
metrics and their choices come from the probe registry when the app is made. Settings of the
whole interpreter (the GIL's switch interval) are the server process's (iepm.web.server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import fastapi_offline
import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from iepm import __version__
from iepm.analysis.statistics import at
from iepm.errors import StoreError
from iepm.scheduler import SchedulerHealth
from iepm.web import api, live, metrics, site
from iepm.web.context import HERE, INVALID, UNAVAILABLE, WebContext, templates
from iepm.web.health import Thresholds, judge
from iepm.web.pages import flows as flows_page
from iepm.web.pages import mesh as mesh_grid
from iepm.web.pages import pair as mesh_pair
from iepm.web.pages import predict as predictions
from iepm.web.pages.aggregate import VIEWS
from iepm.web.pages.overview import UNUSUAL
from iepm.web.places import Place
from iepm.web.queries import Queries
from iepm.web.tables import cell_text, human, shown_cells


def create_app(
    archive_url: str,
    *,
    health: SchedulerHealth | None = None,
    cache_ttl_s: float = 30.0,
    places: Mapping[str, Place] | None = None,
    thresholds: Thresholds | None = None,
) -> FastAPI:
    """The web app over the archive at ``archive_url`` (created or upgraded if needed).
    ``health``: a scheduler's counters when the app runs in the monitor's process (the demo),
    for the figures the archive cannot hold (failed archive writes, spooled results).
    ``places``: each target's site and group (from targets.toml), which pages group by.
    ``thresholds``: what colours a path (the registry's defaults, or a site's overrides)."""
    pages = templates()
    rules = thresholds or Thresholds()
    pages.env.globals.update(
        human=human,
        age=age,
        cell=cell_text,
        shown_cells=shown_cells,
        views=VIEWS,
        at=at,
        unusual_share=UNUSUAL,
        threshold_text=lambda m: judge(m, rules.rule(m, "", None), None, np.array([])).rule,
    )
    context = WebContext(
        Queries(archive_url, cache_ttl_s=cache_ttl_s), places or {}, health, pages, rules
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await live.end_streams(_app)
        context.close()

    app = FastAPI(
        lifespan=lifespan,
        title="iepm",
        version=__version__,
        description=(
            "Network performance reports, REST API and Prometheus metrics over an iepm "
            "archive. Units live in field names (_ms, _bps, _bytes, _percent, _s); times UTC."
        ),
        responses={**INVALID, **UNAVAILABLE},
        # Served below from local assets: FastAPI's own pages load them from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.state.web = context
    app.state.archive = context.queries.archive
    app.state.queries = context.queries
    _api_docs(app)  # before /static, which would otherwise answer /static/docs/…
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.add_exception_handler(StoreError, _store_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.include_router(site.router())
    app.include_router(api.router())
    app.include_router(metrics.router())
    app.include_router(mesh_grid.router())
    app.include_router(mesh_pair.router())
    app.include_router(live.router())
    app.include_router(predictions.router())
    app.include_router(flows_page.router())
    return app


def _api_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) from assets a Python package ships (the README promises no CDN;
    a monitoring host often has no route out). No ``/redoc``: its bundle loads its logo from
    the vendor's CDN whatever it is told."""
    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/static/docs", StaticFiles(directory=str(assets)), name="docs-assets")
    openapi = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi,
            title=f"{app.title} API",
            swagger_js_url="/static/docs/swagger-ui-bundle.js",
            swagger_css_url="/static/docs/swagger-ui.css",
            swagger_favicon_url="/static/docs/favicon.png",
        )


async def _store_error(_request: Request, exc: StoreError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503)


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # One readable line per problem, e.g. "query.since: Input should be a valid datetime".
    problems = [
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
        + (f" (got {e['input']!r})" if isinstance(e.get("input"), str | int | float) else "")
        for e in exc.errors()
    ]
    return JSONResponse({"detail": "; ".join(problems)}, status_code=422)


def age(seconds: float) -> str:
    """An age for a grid cell: 45 s, 12 min, 5 h, 3 d."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"

"""What every router of the web app shares: the archive's queries, the targets' places, the
page-computing threads, the templates, and the checks and answers common to its endpoints."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, TypeVar

from fastapi import HTTPException, Query, Request
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from iepm.scheduler import SchedulerHealth
from iepm.web.health import Thresholds
from iepm.web.places import Places
from iepm.web.queries import Queries

HERE = Path(__file__).parent
T = TypeVar("T")
# Pages are computed by this many threads per worker, not by anyio's pool of 40: computing a
# page is Python holding the GIL, and many threads that also wait on the database pass it to
# each other in 5 ms turns. 20 concurrent first visits (benchmarks/web.py, at Python's 5 ms
# switch interval): p99 1.7–2.6 s with anyio's pool, 0.6–0.7 s with 2 threads (1 thread:
# 1.2 s); with the server's SWITCH_INTERVAL_S as well, 1.0–1.1 s (it favours cached pages).
PAGE_THREADS = 2
# How far before and after a given since/until the pages read (a year back, minutes ahead).
EARLIEST_MARGIN = timedelta(days=800)
LATEST_MARGIN = timedelta(days=1)


@dataclass
class WebContext:
    """The state of one app (``app.state.web``)."""

    queries: Queries
    places: Places
    health: SchedulerHealth | None
    templates: Jinja2Templates
    thresholds: Thresholds = field(default_factory=Thresholds)
    # Made on first use and shut down with the app (which may be started again, as tests do).
    page_pools: list[ThreadPoolExecutor] = field(default_factory=list)

    async def computed(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the app's PAGE_THREADS threads."""
        if not self.page_pools:
            self.page_pools.append(ThreadPoolExecutor(PAGE_THREADS, "iepm-page"))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.page_pools[0], functools.partial(fn, *args))

    def close(self) -> None:
        while self.page_pools:
            self.page_pools.pop().shutdown(wait=False, cancel_futures=True)
        self.queries.close()

    def page_data(self, key: tuple[Any, ...], until: datetime | None, compute: Any) -> Any:
        """A page's figures, reused for ``cache_ttl_s`` (default 30 s): the figures move once
        per cycle, while wall screens reload every few seconds and 20 people may open the same
        target at once. Without ``until`` the window ends when the figures were computed."""
        if until is not None:
            now = now_of(until)
            return self.queries.cached((*key, now), lambda: compute(now))
        # "Now": one entry per page, refreshed every cache_ttl_s (stale while refreshing).
        return self.queries.cached((*key, "now"), lambda: compute(datetime.now(UTC)))

    def known_target(self, target: str) -> str:
        q = self.queries
        if not q.cached(("has", target), lambda: q.has_target(target)):
            raise HTTPException(404, f"unknown target {target!r}: no results for it in the archive")
        return target

    def known_monitor(self, target: str, monitor: str | None) -> None:
        if monitor is None or self.queries.has_monitor(target, monitor):
            return
        monitors = [m for m, _n in self.queries.target_monitors(target)]
        raise HTTPException(
            404,
            f"monitor {monitor!r} has no results for target {target!r} "
            f"(monitors: {', '.join(monitors)})",
        )


def web(request: Request) -> WebContext:
    """The app's context (a FastAPI dependency)."""
    context: WebContext = request.app.state.web
    return context


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

Since = Annotated[
    datetime | None, Query(description="from this moment, inclusive (ISO 8601; naive = UTC)")
]
Until = Annotated[
    datetime | None, Query(description="before this moment, exclusive (ISO 8601; naive = UTC)")
]


def utc(moment: datetime | None, name: str) -> datetime | None:
    """``moment`` in UTC (naive = UTC); a 422 naming ``name`` when it is out of range."""
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


def now_of(until: datetime | None) -> datetime:
    """The end of a page's window: ``until``, or now."""
    return utc(until, "until") or datetime.now(UTC)


def templates() -> Jinja2Templates:
    return Jinja2Templates(directory=str(HERE / "templates"))

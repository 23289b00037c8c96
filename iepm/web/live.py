"""Live pages pushed to browsers: ``GET /live/events`` (server-sent events) and the pages
``/live/bandwidth``, ``/live/ping`` and ``/live/interface`` that follow it.

``iepm run`` and ``iepm serve`` are separate processes, so the archive is their channel
(iepm.store.live). One :class:`Hub` per app watches it for every open stream: on SQLite it asks
``latest_id`` (one indexed ``max(id)``) every ``POLL_S``; on PostgreSQL it LISTENs on the
channel every publish notifies (and still checks every ``PG_CHECK_S``, in case a notification
was lost while its connection was down). New rows go into a bounded ring that streams read from
memory: N browsers cost one query per change, not N. Results (the light probes' estimates, once
a minute) have no growing id, so the hub compares the ids of those started in the last
``RESULTS_LOOKBACK_S`` with those it has seen, every ``RESULTS_POLL_S``.

A stream is resumable: each event's id is ``SAMPLE_ID.RESULT_MARK`` (the last sample sent, and
when the hub saw the last result sent, epoch ms), which the browser sends back as
``Last-Event-ID`` when it reconnects; a stream further behind than the ring reads the archive in
batches of ``BATCH``. Per connection the server holds a cursor and one batch at most; uvicorn
waits for a slow client's socket before the next batch. A keep-alive comment every
``KEEPALIVE_S`` notices a client that went away. When the server shuts down, :func:`end_streams`
ends every stream at once (uvicorn would otherwise wait for them until its graceful timeout).
"""

# No "from __future__ import annotations": FastAPI must see the routes' annotations as objects.

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import anyio
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.responses import HTMLResponse, StreamingResponse

from iepm.analysis import normalise
from iepm.errors import StoreError
from iepm.probes import PROBES
from iepm.store import live
from iepm.store.archive import Archive
from iepm.store.live import LiveResult, LiveSample
from iepm.web.context import INVALID, WebContext, web
from iepm.web.pages import live as live_pages

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLite: how often the hub asks "anything new?" (a browser sees a reply within this).
POLL_S = 0.5
# PostgreSQL: how long one LISTEN wait lasts (the listener notices a stop within it), and how
# often the hub checks anyway (a notification sent while the listener reconnects is lost).
PG_WAIT_S = 1.0
PG_CHECK_S = 5.0
PG_CONNECT_TIMEOUT_S = 5
PG_RETRY_S = 5.0
# New results and the running tests: light probes report once a minute, so every 2 s is prompt.
RESULTS_POLL_S = 2.0
# A result is stored when its run ends: one started this long ago may still arrive.
RESULTS_LOOKBACK_S = 900.0
# The estimator's fits to iperf3 change with each iperf3 run (every 90 min): re-read this often.
FITS_TTL_S = 300.0
# Samples and results the hub keeps in memory for the streams (20 targets × 1/s for ~16 min).
RING_SAMPLES = 20_000
RING_RESULTS = 2_000
# Samples per event (and per archive read of a stream further behind than the ring).
BATCH = 2_000
KEEPALIVE_S = 15.0
# The browser reconnects after this long when a stream ends (server restart, network).
RETRY_MS = 2_000


class Hub:
    """What the archive has that is new, for every stream of one app (one event loop)."""

    def __init__(self, archive: Archive) -> None:
        self.archive = archive
        self.samples: deque[tuple[int, LiveSample]] = deque(maxlen=RING_SAMPLES)
        # The ring holds every sample with an id above ``floor`` (up to ``newest``).
        self.floor = 0
        self.newest = 0
        self.results: deque[tuple[int, LiveResult]] = deque(maxlen=RING_RESULTS)
        self.seen: dict[str, float] = {}
        self.running: list[dict[str, Any]] = []
        self.running_generation = 0
        self.problem: str | None = None
        self.closed = False
        self.listening = False
        # Streams open now (a client that went away is noticed by the next keep-alive write).
        self.open_streams = 0
        self._changed = asyncio.Event()
        self._poke = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._last_mark_ms = 0
        self._fits: dict[str, normalise.Fit] = {}
        self._fits_at = -math.inf

    # -- the watcher -----------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.newest = self.floor = await self._read(live.latest_id, self.archive)
        await self._refresh_results(initial=True)
        await self._refresh_running()
        self._tasks.append(asyncio.create_task(self._watch(), name="iepm-live-watch"))
        conninfo = live.pg_conninfo(self.archive)
        if conninfo is not None:
            self._tasks.append(asyncio.create_task(self._listen(conninfo), name="iepm-live-pg"))

    async def close(self) -> None:
        """End every stream and stop watching (the app's shutdown, or the server's)."""
        self.closed = True
        self._wake()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def waiter(self) -> asyncio.Event:
        """The event the next change sets (taken before reading, so no change is missed)."""
        return self._changed

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        # The archive's calls are synchronous, each with its own deadline (SQLite's busy
        # timeout, PostgreSQL's statement_timeout); a worker thread keeps the loop free.
        return await anyio.to_thread.run_sync(fn, *args)

    async def _watch(self) -> None:
        next_results = time.monotonic() + RESULTS_POLL_S
        while not self.closed:
            try:
                await self._refresh_samples()
                if time.monotonic() >= next_results:
                    next_results = time.monotonic() + RESULTS_POLL_S
                    await self._refresh_results()
                    await self._refresh_running()
                if self.problem is not None:
                    log.warning("live pages: the archive answers again")
                    self.problem = None
                    self._wake()
            except StoreError as exc:
                if self.problem is None:
                    log.warning("live pages: %s", exc)
                    self.problem = str(exc)
                    self._wake()
            wait_s = (PG_CHECK_S if self.listening else POLL_S) if self.problem is None else 2.0
            wait_s = min(wait_s, max(0.05, next_results - time.monotonic()))
            self._poke.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), wait_s)

    async def _listen(self, conninfo: str) -> None:
        """PostgreSQL: wake the watcher on each NOTIFY; reconnect after a failure."""
        import psycopg

        while not self.closed:
            try:
                async with await psycopg.AsyncConnection.connect(
                    conninfo,
                    autocommit=True,
                    connect_timeout=PG_CONNECT_TIMEOUT_S,
                    # A server that vanished without a FIN is noticed within ~30 s.
                    keepalives=1,
                    keepalives_idle=10,
                    keepalives_interval=5,
                    keepalives_count=3,
                ) as conn:
                    await conn.execute(f"LISTEN {live.CHANNEL}")
                    self.listening = True
                    self._poke.set()  # anything published while we connected
                    while not self.closed:
                        async for _notice in conn.notifies(timeout=PG_WAIT_S):
                            self._poke.set()
            except (psycopg.Error, OSError) as exc:
                log.warning("live pages: LISTEN %s failed (%s); polling", live.CHANNEL, exc)
            finally:
                self.listening = False
            if not self.closed:
                await asyncio.sleep(PG_RETRY_S)

    async def _refresh_samples(self) -> None:
        newest = await self._read(live.latest_id, self.archive)
        if newest <= self.newest:
            return
        while self.newest < newest:
            rows = await self._read(
                lambda after: live.read_since(self.archive, after, limit=BATCH), self.newest
            )
            if not rows:
                break
            for row in rows:
                if len(self.samples) == self.samples.maxlen:
                    self.floor = self.samples[0][0]
                self.samples.append(row)
            self.newest = rows[-1][0]
        self._wake()

    async def _refresh_results(self, *, initial: bool = False) -> None:
        probes = live_result_probes()
        since_s = time.time() - RESULTS_LOOKBACK_S
        found = await self._read(live.recent_result_ids, self.archive, probes, since_s)
        new = [i for i in found if i not in self.seen]
        self.seen = {i: t for i, t in {**self.seen, **found}.items() if t >= since_s}
        if not new or initial:
            return  # at start: the pages drew these already
        mark = max(int(time.time() * 1000), self._last_mark_ms + 1)
        self._last_mark_ms = mark
        for result in await self._read(live.results_by_id, self.archive, new):
            self.results.append((mark, await self._normalised(result)))
        self._wake()

    async def _normalised(self, result: LiveResult) -> LiveResult:
        """An estimator's result with its normalised figure (the path's fit to iperf3), read
        from fits at most FITS_TTL_S old; other results as they are."""
        probe, key = normalise.ESTIMATOR
        raw = result.figures.get(key)
        if result.probe != probe or raw is None:
            return result
        if time.monotonic() - self._fits_at > FITS_TTL_S:
            now = datetime.now(UTC)
            self._fits = await self._read(normalise.estimator_fits, self.archive, now)
            self._fits_at = time.monotonic()
        path_fit = self._fits.get(result.target)
        if path_fit is None:
            return result
        figures = {**result.figures, live_pages.NORMALISED_PREFIX + key: path_fit.normalised(raw)}
        return result._replace(figures=figures)

    async def _refresh_running(self) -> None:
        now = live_pages.running_rows(await self._read(live.running, self.archive))
        if now != self.running:
            self.running = now
            self.running_generation += 1
            self._wake()

    # -- what a stream takes ---------------------------------------------------------------

    async def samples_after(
        self, after: int, keep: Callable[[LiveSample], bool]
    ) -> tuple[list[tuple[int, LiveSample]], int]:
        """Up to BATCH samples with id > ``after`` that ``keep`` wants, and the new cursor."""
        if after >= self.floor:
            out: list[tuple[int, LiveSample]] = []
            cursor = after
            # The ring is in id order: from the cursor forwards.
            start = _first_after(self.samples, after)
            for i in range(start, len(self.samples)):
                row = self.samples[i]
                cursor = row[0]
                if keep(row[1]):
                    out.append(row)
                    if len(out) >= BATCH:
                        break
            return out, cursor
        # Further behind than the ring (a long reconnect): one batch from the archive.
        rows = await self._read(lambda a: live.read_since(self.archive, a, limit=BATCH), after)
        if not rows:
            return [], max(after, self.floor)
        return [r for r in rows if keep(r[1])], rows[-1][0]

    def results_after(self, mark: int, probes: set[str] | None) -> tuple[list[LiveResult], int]:
        out = []
        newest = mark
        for seen_ms, result in self.results:
            if seen_ms > mark and (probes is None or result.probe in probes):
                out.append(result)
            newest = max(newest, seen_ms)
        return out, newest


def _first_after(ring: deque[tuple[int, LiveSample]], after: int) -> int:
    """Index of the first row with id > ``after`` (binary search: ids only grow)."""
    lo, hi = 0, len(ring)
    while lo < hi:
        mid = (lo + hi) // 2
        if ring[mid][0] <= after:
            lo = mid + 1
        else:
            hi = mid
    return lo


def live_result_probes() -> list[str]:
    """The probes whose results the live pages follow: the light ones (background scheduling),
    as registered now (a plug-in registered later is followed too)."""
    return sorted(n for n, p in PROBES.items() if p.META.scheduling == "background")


async def hub_of(app: FastAPI, archive: Archive) -> Hub:
    hub: Hub | None = getattr(app.state, "live_hub", None)
    if hub is None or hub.closed:
        hub = app.state.live_hub = Hub(archive)
    await hub.start()
    return hub


async def end_streams(app: Any) -> None:
    """End the live streams of ``app`` (a FastAPI app, as given to uvicorn) and stop its hub.
    Called by the server before it waits for open responses, and by the app's shutdown."""
    hub: Hub | None = getattr(getattr(app, "state", None), "live_hub", None)
    if hub is not None:
        await hub.close()


def parse_last_event_id(value: str | None) -> tuple[int, int] | None:
    """``"SAMPLE_ID.RESULT_MARK"`` as sent in each event's id; None if absent or malformed
    (a browser only echoes what we sent, so anything else is ignored, not an error)."""
    if not value:
        return None
    head, _, tail = value.partition(".")
    if not head.isdigit() or not tail.isdigit():
        return None
    return int(head), int(tail)


def _event(kind: str, payload: Any, event_id: str | None = None) -> str:
    lines = [f"event: {kind}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + json.dumps(payload, separators=(",", ":"), allow_nan=False))
    return "\n".join(lines) + "\n\n"


async def stream(
    hub: Hub,
    *,
    after: int,
    mark: int,
    probes: set[str] | None,
    targets: set[str] | None,
    request: Request,
) -> AsyncIterator[str]:
    """The events of one connection: ``samples``, ``results``, ``running``, ``status``."""

    def keep(s: LiveSample) -> bool:
        return (probes is None or s.probe in probes) and (targets is None or s.target in targets)

    hub.open_streams += 1
    try:
        async for chunk in _events(hub, after, mark, keep, probes, targets, request):
            yield chunk
    finally:
        hub.open_streams -= 1


async def _events(
    hub: Hub,
    after: int,
    mark: int,
    keep: Callable[[LiveSample], bool],
    probes: set[str] | None,
    targets: set[str] | None,
    request: Request,
) -> AsyncIterator[str]:
    yield f"retry: {RETRY_MS}\n\n"
    running_sent = -1
    problem_sent: str | None = None
    last_write = time.monotonic()
    while not hub.closed:
        changed = hub.waiter()
        wrote = False
        rows, after = await hub.samples_after(after, keep)
        full = len(rows) >= BATCH
        if rows:
            data = [[i, s.target, s.probe, s.metric, s.t_s, s.value] for i, s in rows]
            yield _event("samples", {"samples": data}, f"{after}.{mark}")
            wrote = True
        results, new_mark = hub.results_after(mark, probes)
        if new_mark != mark:
            mark = new_mark
            payload = [r._asdict() for r in results if targets is None or r.target in targets]
            yield _event("results", {"results": payload}, f"{after}.{mark}")
            wrote = True
        if hub.running_generation != running_sent:
            running_sent = hub.running_generation
            yield _event("running", {"running": hub.running, "now_s": time.time()})
            wrote = True
        if hub.problem != problem_sent:
            problem_sent = hub.problem
            yield _event("status", {"problem": hub.problem})
            wrote = True
        if full:
            continue  # more to catch up on before waiting
        if not wrote and time.monotonic() - last_write >= KEEPALIVE_S:
            yield ": keep-alive\n\n"  # a write to a closed socket ends the stream
            wrote = True
        if wrote:
            last_write = time.monotonic()
        if await request.is_disconnected():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), KEEPALIVE_S)


Context = Annotated[WebContext, Depends(web)]


def _names(text: str | None) -> set[str] | None:
    if text is None or not text.strip():
        return None
    return {n.strip() for n in text.split(",") if n.strip()}


def router() -> APIRouter:
    routes = APIRouter(responses=INVALID)

    @routes.get(
        "/live/events",
        tags=["api"],
        summary="Live samples, new light-probe results and running tests (server-sent events)",
        response_class=StreamingResponse,
        # Not in the OpenAPI document: a stream never ends, which generated-input checkers
        # (schemathesis) would wait on forever; the README describes it.
        include_in_schema=False,
    )
    async def events(
        w: Context,
        request: Request,
        after: Annotated[
            int | None,
            Query(ge=0, description="send samples with a larger id (default: from now on)"),
        ] = None,
        probe: Annotated[
            str | None, Query(description="only these probes (comma-separated)")
        ] = None,
        targets: Annotated[
            str | None, Query(description="only these targets (comma-separated)")
        ] = None,
        results_after: Annotated[
            int | None,
            Query(ge=0, description="send results the server saw after this (epoch ms)"),
        ] = None,
        last_event_id: Annotated[str | None, Header(include_in_schema=False)] = None,
    ) -> StreamingResponse:
        """A text/event-stream. Events: ``samples`` (``[id, target, probe, metric, t_s,
        value]`` rows; value null = a lost reply), ``results`` (new results of the light
        probes with their numeric figures), ``running`` (the tests running now), ``status``
        (``problem``: the archive cannot be read, or null). Resumable with Last-Event-ID."""
        hub = await hub_of(request.app, w.queries.archive)
        resumed = parse_last_event_id(last_event_id)
        if resumed is not None:
            start, mark = resumed
        else:
            start = hub.newest if after is None else after
            mark = int(time.time() * 1000) if results_after is None else results_after
        body = stream(
            hub, after=start, mark=mark, probes=_names(probe), targets=_names(targets),
            request=request,
        )  # fmt: skip
        return StreamingResponse(
            body,
            media_type="text/event-stream",
            # No proxy buffering (nginx), no caching: each event must reach the page now.
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    @routes.get("/live/bandwidth", response_class=HTMLResponse, tags=["pages"])
    async def bandwidth(
        w: Context,
        request: Request,
        probe: Annotated[str, Query(description="the estimator's probe")] = normalise.ESTIMATOR[0],
        metric: Annotated[
            str | None, Query(description="its figure (default: its first metric)")
        ] = None,
        weight: Annotated[
            float, Query(gt=0.0, le=1.0, description="EWMA weight w of each new estimate")
        ] = live_pages.EWMA_WEIGHT,
        hours: Annotated[float, Query(gt=0.0, le=48.0, description="hours shown")] = 1.0,
    ) -> HTMLResponse:
        """Available bandwidth per target, raw and EWMA, live."""
        page = await w.computed(
            live_pages.bandwidth_page, w.queries.archive, probe, metric, weight, hours * 3600
        )
        return _render(w, request, "live_bandwidth.html", page)

    @routes.get("/live/ping", response_class=HTMLResponse, tags=["pages"])
    async def ping(
        w: Context,
        request: Request,
        minutes: Annotated[float, Query(gt=0.0, le=60.0, description="minutes shown")] = 5.0,
    ) -> HTMLResponse:
        """Per-second RTT of many targets, grouped, live (PingWorld)."""
        page = await w.computed(live_pages.ping_page, w.queries.archive, w.places, minutes * 60)
        return _render(w, request, "live_ping.html", page)

    @routes.get("/live/interface", response_class=HTMLResponse, tags=["pages"])
    async def interface(w: Context, request: Request) -> HTMLResponse:
        """The monitor's interface rates over the last 120 s and the tests running now."""
        page = await w.computed(live_pages.interface_page, w.queries.archive)
        return _render(w, request, "live_interface.html", page)

    return routes


def _render(w: WebContext, request: Request, name: str, page: live_pages.LivePage) -> HTMLResponse:
    context = {"request": request, "page": page}
    return HTMLResponse(w.templates.get_template(name).render(context))

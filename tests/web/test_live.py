"""Live pages move with the archive: a cached page is refreshed from new figures, never stored
again as it was (the overview once froze for six minutes while watched)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iepm.results import Outcome, format_time
from iepm.store import Archive
from iepm.web.app import create_app
from tests.web import data

TTL = 30.0


class FakeClock:
    """The cache's clock, advanced by the test instead of waited for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (background refreshes are threads)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[TestClient, Archive, FakeClock]]:
    url = f"sqlite:///{tmp_path / 'live.db'}"
    archive = Archive.open(url)
    now = datetime.now(UTC)
    archive.add_many(
        [data._ping(_rng(), "slac-mon", "cern-1", now - timedelta(minutes=m)) for m in (40, 25)]
    )
    app = create_app(url, cache_ttl_s=TTL)
    clock = FakeClock()
    app.state.queries.clock = clock
    with TestClient(app) as client:
        yield client, archive, clock
    archive.close()


def grid(html: str) -> str:
    """The overview's grid of paths alone."""
    return html.split('id="grid"')[1].split("</table>")[0]


def _rng():  # type: ignore[no-untyped-def]
    import random

    return random.Random(3)


def test_a_new_result_reaches_the_overview_and_target_page_within_ttl_plus_one_refresh(
    live: tuple[TestClient, Archive, FakeClock],
) -> None:
    client, archive, clock = live
    assert 'class="v">timeout' not in grid(client.get("/").text)
    first_target = client.get("/targets/cern-1").text
    down = data._failed(
        data._ping(_rng(), "slac-mon", "cern-1", datetime.now(UTC) - timedelta(seconds=5)),
        Outcome.TIMEOUT,
        "ping to cern-1 did not finish within 15 s",
    )
    archive.add(down)
    stamp = format_time(down.started_at)
    assert stamp not in first_target
    # Within its TTL a page may be the cached copy; one TTL later, the next requests start a
    # refresh and, once it is done, are answered the new page.
    clock.now += TTL + 1
    client.get("/"), client.get("/targets/cern-1")
    assert until(lambda: 'class="v">timeout' in grid(client.get("/").text))
    assert until(lambda: stamp in client.get("/targets/cern-1").text)
    # And never later: past STALE_SERVED_FOR TTLs without a request, computed for the request.
    back = data._ping(_rng(), "slac-mon", "cern-1", datetime.now(UTC) - timedelta(seconds=1))
    archive.add(back)
    clock.now += 10 * TTL
    assert format_time(back.started_at) in client.get("/targets/cern-1").text
    assert 'class="v">timeout' not in grid(client.get("/").text)


def test_a_page_asked_for_a_past_moment_shows_nothing_after_it(
    live: tuple[TestClient, Archive, FakeClock],
) -> None:
    client, _archive, _clock = live
    newest = client.get("/tables/paths", params={"format": "csv"}).text.splitlines()[1]
    started = datetime.fromisoformat(newest.split(",")[3])
    moment = started - timedelta(seconds=1)
    rows = client.get(
        "/tables/paths", params={"format": "csv", "until": format_time(moment)}
    ).text.splitlines()[1:]
    assert rows and all(datetime.fromisoformat(r.split(",")[3]) < moment for r in rows)


def test_a_failing_refresh_keeps_the_copy_within_its_bound_then_fails_honestly(
    tmp_path: Path,
) -> None:
    from iepm.errors import StoreError
    from iepm.web.queries import STALE_SERVED_FOR, Queries

    queries = Queries(f"sqlite:///{tmp_path / 'q.db'}", cache_ttl_s=TTL)
    clock = FakeClock()
    queries.clock = clock
    calls: list[float] = []

    def broken() -> int:
        calls.append(clock.now)
        raise StoreError("the archive is unreachable")

    try:
        assert queries.cached(("page",), lambda: 1) == 1
        clock.now += TTL  # expired: served while a refresh is tried in the background
        assert queries.cached(("page",), broken) == 1
        assert until(lambda: len(calls) == 1)
        assert until(lambda: ("page",) in queries._failed_at)
        assert queries.cached(("page",), broken) == 1 and len(calls) == 1  # no retry storm
        clock.now += TTL / 2
        assert queries.cached(("page",), broken) == 1
        assert until(lambda: len(calls) == 2)  # retried once half a TTL later
        clock.now = 1000.0 + TTL * STALE_SERVED_FOR + 1  # too old to serve: the error shows
        with pytest.raises(StoreError):
            queries.cached(("page",), broken)
    finally:
        queries.close()

"""The pages in Debian's chromium (Playwright): they load, their charts draw the right number of
series on a non-empty canvas, zoom works, downloads are the tables the server computes.
Screenshots go to tests/web/screenshots/ (a CI artifact, not committed)."""

from __future__ import annotations

import csv
import io
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from iepm.results import format_time
from iepm.web.server import ServerHandle, serve_in_background
from iepm.web.tables import human
from testkit.browser import PAINTED, series_count, shoot
from testkit.net import free_port
from tests.web import data

pytestmark = pytest.mark.browser

END = format_time(data.END)


@pytest.fixture(scope="module")
def server(archive_url: str) -> Iterator[str]:
    handle: ServerHandle = serve_in_background(archive_url, "127.0.0.1", free_port())
    try:
        yield handle.url.rstrip("/")
    finally:
        handle.stop()


def test_overview(page: Any, server: str) -> None:
    page.goto(f"{server}/?until={END}")
    grid = page.locator("#grid")
    assert grid.is_visible()
    # 4 paths, each with throughput, RTT and loss chips.
    assert page.locator("#grid a.chip").count() == 12
    assert (
        page.locator(
            "#grid a.chip.failed, #grid a.chip.good, #grid a.chip.fair, #grid a.chip.poor"
        ).count()
        == 12
    )
    assert page.locator("#table-outcomes td").count() > 0
    shoot(page, "overview")


def test_target_page_charts_and_zoom(page: Any, server: str) -> None:
    page.goto(f"{server}/targets/cern-1?until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.rtt")
    expected = {
        "rtt": 3,
        "loss": 1,
        "throughput": 3,
        "hops": 1,
        "histogram": 1,
        "cdf": 1,
        "longterm": 2,
    }
    for chart, n in expected.items():
        assert series_count(page, chart) == n, chart
        assert page.evaluate(PAINTED, chart) > 1000, f"{chart} canvas is empty"
    # The route change is drawn as an event line on the time series.
    assert (
        page.evaluate(
            "JSON.parse(document.querySelector('#fig-rtt script').textContent).events.length"
        )
        == 1
    )
    shoot(page, "target")
    before = page.evaluate(
        "[window.iepmCharts.rtt.scales.x.min, window.iepmCharts.rtt.scales.x.max]"
    )
    over = page.locator("#chart-rtt .u-over").bounding_box()
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + over["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.5, y, steps=8)
    page.mouse.up()
    after = page.evaluate(
        "[window.iepmCharts.rtt.scales.x.min, window.iepmCharts.rtt.scales.x.max]"
    )
    assert before[0] < after[0] < after[1] < before[1]
    assert (after[1] - after[0]) < 0.3 * (before[1] - before[0])
    shoot(page, "target-zoomed")


def test_csv_download(page: Any, server: str, tmp_path: Path) -> None:
    page.goto(f"{server}/targets/cern-1?until={END}")
    with page.expect_download() as info:
        page.locator('#table-stats a.dl[data-format="csv"]').click()
    download = info.value
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    assert download.suggested_filename == "cern-1-stats.csv"
    saved = path.read_bytes().decode("utf-8")
    served = httpx.get(f"{server}/targets/cern-1/tables/stats?format=csv&until={END}", timeout=10)
    assert saved == served.text  # RFC 4180: CRLF line ends, byte for byte
    rows = list(csv.DictReader(io.StringIO(saved)))
    assert [r["metric"] for r in rows][:2] == ["ping.rtt_min_ms", "ping.rtt_avg_ms"]
    # The page shows the same numbers as the file.
    # The page shows the same numbers as the file: written for people ("40.1 ms"), with the
    # file's text on the cell.
    cells = page.evaluate(
        "[...document.querySelector('#table-stats tbody tr').cells]"
        ".map(td => [td.innerText, td.dataset.value ?? null])"
    )
    metric = rows[0]["metric"]
    assert [raw if raw is not None else text for text, raw in cells] == list(rows[0].values())
    assert tuple(cells[1]) == (human(float(rows[0]["median"]), metric), rows[0]["median"])
    assert cells[1][0].endswith(" ms")


def test_compare_page(page: Any, server: str) -> None:
    page.goto(f"{server}/compare?x=ping.rtt_avg_ms&y=iperf3.throughput_bps&until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.scatter")
    assert series_count(page, "scatter") == 2  # the points and the fit
    assert page.evaluate(PAINTED, "scatter") > 500
    assert "R² =" in page.locator("#note-scatter").inner_text()
    shoot(page, "compare")


@pytest.mark.parametrize(("view", "series"), [("weekday", 7), ("monthly", 3), ("daily", 1)])
def test_aggregation_views(page: Any, server: str, view: str, series: int) -> None:
    page.goto(f"{server}/aggregate/bnl-2?view={view}&monitor=slac-mon&until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.agg")
    assert series_count(page, "agg") == series
    assert page.evaluate(PAINTED, "agg") > 500
    shoot(page, f"aggregate-{view}")


def test_an_outage_is_shaded_and_says_why_on_hover(page: Any, server: str) -> None:
    page.goto(f"{server}/targets/kek-3?until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.loss")
    spec = page.evaluate(
        "JSON.parse([...document.querySelectorAll('script.chart-spec')]"
        ".find(s => s.dataset.target === 'chart-loss').textContent)"
    )
    outage = spec["outages"][-1]
    assert outage["reason"].startswith("timeout: ping to kek-3")
    # Hover the middle of the outage: the chart's reason line names it.
    page.locator("#fig-loss").scroll_into_view_if_needed()
    x, y = page.evaluate(
        """t => { const u = window.iepmCharts.loss, r = u.over.getBoundingClientRect();
                  return [r.left + u.valToPos(t, 'x'), r.top + r.height / 2]; }""",
        (outage["from"] + outage["to"]) / 2,
    )
    page.mouse.move(x, y)
    reason = page.locator("#fig-loss .reason")
    reason.filter(has_text="ping to kek-3 did not finish").wait_for()
    assert " UTC: timeout" in reason.inner_text()
    page.mouse.move(5, 5)
    shoot(page, "outage")
    # The smoke chart: bands and medians painted.
    page.wait_for_function("window.iepmCharts.smoke")
    assert page.evaluate(PAINTED, "smoke") > 500


def test_the_overview_updates_by_itself_when_a_path_goes_down(page: Any, tmp_path: Path) -> None:
    import random
    from datetime import UTC, datetime, timedelta

    from iepm.results import Outcome
    from iepm.store import Archive

    url = f"sqlite:///{tmp_path / 'live.db'}"
    rng = random.Random(2)
    now = datetime.now(UTC)
    archive = Archive.open(url)
    archive.add(data._ping(rng, "slac-mon", "cern-1", now - timedelta(minutes=5)))
    handle = serve_in_background(url, "127.0.0.1", free_port(), cache_ttl_s=1.0)
    try:
        # Refresh every second (the picker's choice, kept in the browser).
        page.add_init_script("window.localStorage.setItem('iepm.refresh', '1')")
        page.goto(handle.url)
        assert page.locator("#refresh").input_value() == "1"
        assert page.locator("#grid a.chip.failed").count() == 0
        down = data._ping(rng, "slac-mon", "cern-1", datetime.now(UTC))
        archive.add(data._failed(down, Outcome.TIMEOUT, "ping to cern-1 did not finish"))
        # No reload by the test: the page reloads itself, the cache refreshes within its TTL.
        chip = page.locator("#grid a.chip.failed[data-metric='ping.loss_percent']")
        chip.wait_for(timeout=15_000)
        assert "ping to cern-1 did not finish" in (chip.get_attribute("title") or "")
    finally:
        handle.stop()
        archive.close()


def test_time_axes_are_24_hour_utc(page: Any, server: str) -> None:
    from datetime import UTC, datetime

    page.goto(f"{server}/targets/cern-1?until={END}&window=1d")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.rtt")
    ticks = (
        "([t, incr]) => { const u = window.iepmCharts.rtt;"
        " return u.axes[0].values(u, t, 0, 50, incr); }"
    )
    one = datetime(2026, 11, 20, 13, tzinfo=UTC).timestamp()
    midnight = datetime(2026, 11, 20, tzinfo=UTC).timestamp()
    # Hourly ticks: 24-hour UTC, the date where a day starts (and on the first tick).
    hourly = page.evaluate(ticks, [[one, midnight], 3600])
    assert hourly == ["2026-11-20\n13:00", "2026-11-20\n00:00"]
    daily = page.evaluate(ticks, [[midnight, midnight + 86400], 86400])
    assert daily == ["2026-11-20", "11-21"]


# The charts on the page's window axis (sync "window") and their x scales and plot areas.
GROUP = """() => Object.entries(window.iepmCharts)
  .filter(([id, u]) => JSON.parse(document.querySelector('#fig-' + id + ' script').textContent)
    .sync === 'window')
  .map(([id, u]) => ({id: id, min: u.scales.x.min, max: u.scales.x.max,
                      left: u.bbox.left, width: u.bbox.width}))"""


def test_target_time_charts_are_stacked_on_one_time_axis(page: Any, server: str) -> None:
    page.goto(f"{server}/targets/cern-1?until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts.hops")
    group = page.evaluate(GROUP)
    assert {"rtt", "loss", "throughput", "hops"} <= {c["id"] for c in group}
    # One axis: the same span, and plot areas that line up (the throughput chart's two
    # right-hand axes are matched by blank ones on the others).
    assert len({(c["min"], c["max"]) for c in group}) == 1, group
    assert len({(c["left"], c["width"]) for c in group}) == 1, group
    # One below the other, full width.
    boxes = [page.locator(f"#fig-{c['id']}").bounding_box() for c in group]
    assert len({(round(b["x"]), round(b["width"])) for b in boxes}) == 1
    assert all(a["y"] + a["height"] <= b["y"] for a, b in itertools.pairwise(boxes))
    # The year of weekly means keeps its own scale (untouched by the zoom below).
    year = "[window.iepmCharts.longterm.scales.x.min, window.iepmCharts.longterm.scales.x.max]"
    year_before = page.evaluate(year)
    full = (group[0]["min"], group[0]["max"])
    # A zoom on one chart zooms them all.
    page.locator("#chart-loss").scroll_into_view_if_needed()
    over = page.locator("#chart-loss .u-over").bounding_box()
    y = over["y"] + over["height"] / 2
    page.mouse.move(over["x"] + over["width"] * 0.4, y)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.7, y, steps=8)
    page.mouse.up()
    zoomed = page.evaluate(GROUP)
    assert len({(c["min"], c["max"]) for c in zoomed}) == 1, zoomed
    assert full[0] < zoomed[0]["min"] < zoomed[0]["max"] < full[1]
    assert page.evaluate("Object.values(window.iepmCharts).filter(u => u.iepmZoomed).length") >= 4
    assert page.evaluate(year) == year_before
    # The hover cursor is shared: over the loss chart, the RTT chart's cursor follows.
    page.mouse.move(over["x"] + over["width"] * 0.5, y)
    page.wait_for_function("window.iepmCharts.rtt.cursor.left > 0")
    left = page.evaluate("[window.iepmCharts.loss.cursor.left, window.iepmCharts.rtt.cursor.left]")
    assert abs(left[0] - left[1]) < 2
    shoot(page, "target-stacked-zoomed")
    # A double-click on another chart shows the whole span on all of them again.
    page.locator("#chart-hops .u-over").dblclick()
    back = page.evaluate(GROUP)
    assert {(c["min"], c["max"]) for c in back} == {full}
    assert page.evaluate("Object.values(window.iepmCharts).filter(u => u.iepmZoomed).length") == 0

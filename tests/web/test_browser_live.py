"""The live pages in Debian's chromium: while the test publishes samples, results and a running
test into the archive, the open pages change (table cells, chart data, canvas pixels) with no
reload (a marker set on ``window`` survives). Screenshots to tests/web/screenshots/."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.store import Archive, live
from iepm.store.live import LiveSample
from iepm.web.pages.live import ewma
from iepm.web.places import Place
from iepm.web.server import serve_in_background
from testkit.browser import shoot
from testkit.net import free_port

pytestmark = pytest.mark.browser

PLACES = {"slac": Place("slac", "us"), "cern": Place("cern", "europe"), "kek": Place("kek", "asia")}
# Counts the painted pixels of the first canvas in a live chart's figure.
PAINTED = """id => {
  const c = document.querySelector('#fig-' + id + ' canvas');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
  return n;
}"""
ROW_TEXT = "t => { const r = document.querySelector(`#latest tr[data-target='${t}']`); " \
    "return r ? [...r.children].map(c => [c.textContent, c.className]) : null; }"  # fmt: skip


@pytest.fixture
def archive_and_url() -> Iterator[tuple[Archive, str]]:
    with tempfile.TemporaryDirectory(prefix="iepm-live-browser-") as path:
        url = f"sqlite:///{Path(path) / 'iepm.db'}"
        with Archive.open(url) as archive:
            handle = serve_in_background(url, port=free_port(), places=PLACES, cache_ttl_s=0)
            try:
                yield archive, handle.url.rstrip("/")
            finally:
                handle.stop()


def mark_no_reload(page: Any) -> None:
    page.evaluate("window.__sameDocument = true")


def same_document(page: Any) -> bool:
    return bool(page.evaluate("window.__sameDocument === true"))


def test_ping_page_moves_as_replies_are_published(
    page: Any, archive_and_url: tuple[Archive, str]
) -> None:
    archive, server = archive_and_url
    now_s = time.time()
    first = [LiveSample("cern", "ping", "rtt_ms", now_s - 3, 160.0),
             LiveSample("slac", "ping", "rtt_ms", now_s - 3, 0.5)]  # fmt: skip
    live.publish(archive, "mon", first)
    page.goto(f"{server}/live/ping")
    page.wait_for_function("window.iepmLive && window.iepmLive.connected")
    mark_no_reload(page)
    assert page.evaluate(ROW_TEXT, "cern")[2] == ["160", "rtt-poor"]
    before = page.evaluate(PAINTED, "g1")  # the europe chart
    # Replies as a monitor publishes them: one each second for three targets, one lost.
    for i in range(3):
        t = time.time()
        live.publish(
            archive, "mon",
            [LiveSample("cern", "ping", "rtt_ms", t, 150.0 + i),
             LiveSample("slac", "ping", "rtt_ms", t, 20.0),
             LiveSample("kek", "ping", "rtt_ms", t, None if i == 2 else 90.0)],
        )  # fmt: skip
        page.wait_for_function(f"window.iepmLive.samples >= {3 * (i + 1)}")
    page.wait_for_function(
        "document.querySelector(\"#latest tr[data-target='kek'] td:nth-child(3)\")"
        ".textContent === 'lost'"
    )
    assert page.evaluate(ROW_TEXT, "cern")[2] == ["152", "rtt-poor"]
    assert page.evaluate(ROW_TEXT, "slac")[2] == ["20.0", "rtt-good"]
    kek_row = page.evaluate(ROW_TEXT, "kek")
    assert kek_row[2] == ["lost", "rtt-lost"] and kek_row[4] == ["1/3", ""]
    assert 0 <= int(kek_row[3][0]) < 60  # age in seconds
    # The chart holds the new points (a lost reply as null: a gap) and painted more.
    kek = page.evaluate(
        "(() => { const u = window.iepmLive.charts.g0.u; "
        "return [u.series.map(s => s.label), u.data[1].filter(v => v !== undefined)]; })()"
    )
    assert kek == [["time (UTC)", "kek"], [90.0, 90.0, None]]
    assert page.evaluate(PAINTED, "g1") > before
    assert same_document(page)
    shoot(page, "live-ping")


def test_bandwidth_page_extends_raw_and_ewma_as_results_arrive(
    page: Any, archive_and_url: tuple[Archive, str]
) -> None:
    if shutil.which("ping") is None:
        pytest.skip("iputils ping is not installed")
    archive, server = archive_and_url
    ctx = ProbeContext(target="loopback", address="127.0.0.1", monitor="mon")

    def measure() -> float:
        # Playwright's sync API holds an event loop in this thread: ping runs in another.
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(asyncio.run, ping.run(ping.Spec(count=3, interval_s=0.2), ctx))
            result = run.result(timeout=30)
        assert result.succeeded, result.error
        archive.add(result)
        return float(result.data["rtt_avg_ms"])

    # The page is generic over a probe's figure: real ping results stand in for estimates.
    raw = [measure(), measure()]
    page.goto(f"{server}/live/bandwidth?probe=ping&metric=rtt_avg_ms&weight=0.4")
    page.wait_for_function("window.iepmLive && window.iepmLive.connected")
    mark_no_reload(page)
    raw += [measure(), measure()]
    page.wait_for_function("window.iepmLive.results >= 2", timeout=30_000)
    latest = page.evaluate("window.iepmLive.latest.loopback")
    assert latest["raw"] == pytest.approx(raw[-1])
    assert latest["ewma"] == pytest.approx(ewma(raw, 0.4)[-1])
    points = page.evaluate("window.iepmLive.charts['t-loopback'].u.data[1].length")
    assert points == 4
    assert page.evaluate(PAINTED, "t-loopback") > 0
    assert same_document(page)
    shoot(page, "live-bandwidth")


def test_interface_page_shows_rates_and_the_test_running_now(
    page: Any, archive_and_url: tuple[Archive, str]
) -> None:
    archive, server = archive_and_url
    page.goto(f"{server}/live/interface")
    page.wait_for_function("window.iepmLive && window.iepmLive.connected")
    mark_no_reload(page)
    assert page.locator("#running tbody").inner_text() == "no test running"
    live.set_running(archive, "mon", "iperf3", "cern", {"streams": 4, "window_bytes": 1048576},
                     deadline_s=60)  # fmt: skip
    for i in range(3):
        t = time.time()
        rates = [LiveSample("eth0", "interface", "rx_mbps", t, 10.0 + i),
                 LiveSample("eth0", "interface", "tx_mbps", t, 800.0)]  # fmt: skip
        live.publish(archive, "mon", rates)
        page.wait_for_function(f"window.iepmLive.samples >= {2 * (i + 1)}")
    page.wait_for_function(
        "document.querySelector(\"#running tr[data-target='cern']\") !== null", timeout=30_000
    )
    live.publish(archive, "mon", [LiveSample("cern", "ping", "rtt_ms", time.time(), 151.0)])
    rtt_cell = "#running tr[data-target='cern'] td:nth-child(6)"
    page.wait_for_function(f"document.querySelector(\"{rtt_cell}\").textContent === '151'")
    cells = page.locator("#running tr[data-target='cern'] td").all_inner_texts()
    assert cells[0:2] == ["cern", "iperf3"]  # target, tool
    assert cells[3:6] == ["1048576", "4", "151"]  # window, streams, RTT ms
    labels = page.evaluate("window.iepmLive.charts.iface.u.series.map(s => s.label)")
    assert labels == ["time (UTC)", "eth0 rx_mbps", "eth0 tx_mbps"]
    rx = page.evaluate("window.iepmLive.charts.iface.u.data[1].filter(v => v !== undefined)")
    assert rx == [10.0, 11.0, 12.0]
    live.clear_running(archive, "mon", "iperf3", "cern")
    page.wait_for_function(
        "document.querySelector('#running tbody').innerText.trim() === 'no test running'",
        timeout=30_000,
    )
    assert same_document(page)
    shoot(page, "live-interface")

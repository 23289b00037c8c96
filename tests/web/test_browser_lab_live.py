"""A live dashboard over the WAN lab: a lab event takes a path down between two cycles of the
real scheduler, and the overview, open in chromium, turns that path's cells failed by itself
(auto-refresh, no reload by the test), with the reason; the target page shades the outage."""

from __future__ import annotations

import asyncio
import threading
import tomllib
from collections.abc import Callable
from typing import Any

import pytest

from iepm.demo import TOPOLOGY, Demo
from iepm.lab.testing import lab_unavailable, unique_lab_name
from iepm.web.places import places_of
from iepm.web.server import serve_in_background
from testkit.browser import shoot
from testkit.net import free_port

pytestmark = [pytest.mark.lab, pytest.mark.browser]

DOWN = {"action": "link", "link": "cstnet_ihep", "up": False}
REFRESH = "window.localStorage.setItem('iepm.refresh', location.pathname === '/' ? '1' : '0')"


def in_thread(fn: Callable[[], Any], timeout_s: float = 300.0) -> None:
    """Run ``fn`` in its own thread: the scheduler's asyncio loop must not run in the thread
    that holds Playwright's sync API."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="lab-cycle")
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the lab's cycle did not finish in time"
    if failure:
        raise failure[0]


def test_a_path_taken_down_turns_its_cells_failed_by_itself(
    page: Any, tmp_path: Any, _stale_labs_swept: Any
) -> None:
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    topology = tomllib.loads(TOPOLOGY.read_text(encoding="utf-8"))
    topology.pop("events")  # the scheduled route switch is not this test's
    with Demo.start(
        tmp_path, topology=topology, lab_name=unique_lab_name("live"), say=lambda _: None
    ) as demo:
        scheduler = demo.open()
        in_thread(lambda: asyncio.run(scheduler.run_cycle()))
        handle = serve_in_background(
            demo.config.monitor.archive,
            "127.0.0.1",
            free_port(),
            places=places_of(demo.config),
            cache_ttl_s=1.0,
        )
        try:
            # The overview reloads itself every second; the target page opened after it does
            # not (a reload racing the test's navigation would abort it).
            page.add_init_script(REFRESH)
            page.goto(handle.url)
            ihep = page.locator("#grid tr", has=page.locator('a[href="/targets/ihep"]'))
            loss = ihep.locator("a.chip[data-metric='ping.loss_percent']")
            assert "failed" not in (loss.get_attribute("class") or "")

            def down_then_cycle() -> None:
                demo.lab.apply(DOWN)
                asyncio.run(scheduler.run_cycle())

            in_thread(down_then_cycle)
            # No reload by the test: the page reloads itself within its refresh interval.
            failed = ihep.locator("a.chip.failed[data-metric='ping.loss_percent']")
            failed.wait_for(timeout=15_000)
            # The reason on hover, as the probe wrote it.
            assert "no reply from 198.18.0.15" in (failed.get_attribute("title") or "")
            assert failed.locator(".v").inner_text() == "failed"
            shoot(page, "lab-live-overview")
            page = page.context.new_page()  # closed with the fixture's context
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.add_init_script(REFRESH)
            page.goto(f"{handle.url}targets/ihep?window=1h")
            page.wait_for_function("window.iepmCharts && window.iepmCharts.loss")
            outages = page.evaluate(
                "JSON.parse([...document.querySelectorAll('script.chart-spec')]"
                ".find(s => s.dataset.target === 'chart-loss').textContent).outages"
            )
            assert len(outages) == 1
            assert outages[0]["reason"].startswith("failed: no reply from 198.18.0.15")
            loss_values = page.evaluate("window.iepmCharts.loss.data[1]")
            assert loss_values[-1] == 100  # the dead run, plotted at 100 % loss
            shoot(page, "lab-live-target")
            assert errors == []
        finally:
            handle.stop()

"""Playwright on Debian's chromium for the browser tests: fixtures ``browser`` and ``page``
(offline: any request off 127.0.0.1 is aborted; page errors fail the test), screenshots to
tests/web/screenshots/ (a CI artifact, gitignored)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "tests" / "web" / "screenshots"

# Counts the painted pixels of a chart's canvas (uPlot draws everything on one canvas).
PAINTED = """id => {
  const c = document.querySelector('#chart-' + id + ' canvas');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 3; i < px.length; i += 4) if (px[i] !== 0) n++;
  return n;
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is missing (Debian: apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests must run in CI: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    # A test-side wait for the server, not a product deadline: under pytest-xdist on a busy
    # 2-core host (load 15-20) a target page's load took over 15 s. Tests that assert a time
    # (the page updating by itself) pass their own timeout.
    page.set_default_timeout(60_000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    # Offline by design: any request to another host is a bug.
    page.route(
        "**/*",
        lambda route: (
            route.continue_() if route.request.url.startswith("http://127.0.0.1") else route.abort()
        ),
    )
    yield page
    context.close()
    assert not errors, errors


def shoot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def series_count(page: Any, chart: str) -> int:
    return int(page.evaluate(f"window.iepmCharts[{chart!r}].series.length - 1"))

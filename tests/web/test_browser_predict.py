"""The prediction panels in Debian's chromium (Playwright): the target page's forecast chart
draws the observed runs, the forecasts and the 80% interval on a non-empty canvas, and the
/forecasts page's downloads are the table the page shows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from iepm.results import format_time
from iepm.web.server import ServerHandle, serve_in_background
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


def test_target_page_draws_the_forecast_with_its_interval(page: Any, server: str) -> None:
    page.goto(f"{server}/targets/cern-1?until={END}")
    page.wait_for_function("window.iepmCharts && window.iepmCharts['forecast-throughput_bps']")
    for chart in ("forecast-throughput_bps", "forecast-rtt_avg_ms"):
        assert series_count(page, chart) == 4, chart  # observed, forecast, lower, upper
        assert page.evaluate(PAINTED, chart) > 1000, f"{chart} canvas is empty"
    rows = page.locator("#table-forecast tbody tr")
    assert rows.count() == 2
    assert page.locator("#table-diurnal tbody tr").count() == 4  # 2 metrics × weekdays/ends
    shoot(page, "target-forecast")


def test_forecasts_page_download_is_the_table_shown(page: Any, server: str, tmp_path: Path) -> None:
    page.goto(f"{server}/forecasts?window=7d&until={END}")
    shown = page.locator("#table-forecast_error_matrix tbody tr")
    assert shown.count() == 4
    with page.expect_download() as info:
        page.locator('#table-forecast_error_matrix a.dl[data-format="csv"]').click()
    download = info.value
    assert download.suggested_filename == "forecasts-forecast_error_matrix.csv"
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    served = httpx.get(
        f"{server}/forecasts/tables/forecast_error_matrix?format=csv&window=7d&until={END}",
        timeout=60,
    )
    assert path.read_bytes().decode("utf-8") == served.text
    first = served.text.splitlines()[1].split(",")
    # A cell shows its number for people ("14.6 %") and keeps the download's text in
    # data-value; the row read that way is the download's first row.
    raw = shown.first.evaluate("tr => [...tr.cells].map(td => td.dataset.value ?? td.innerText)")
    assert raw == first
    shoot(page, "forecasts")

"""The target page's time picker: the span it shows, ending at ``until`` or now."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.web.test_api import END, csv_rows


def test_the_target_pages_time_picker_sets_its_window(client: TestClient) -> None:
    from datetime import timedelta

    from tests.web import data
    from tests.web.test_api import chart_specs

    end = data.END.timestamp()
    for window, span in [("1d", timedelta(days=1)), ("7d", timedelta(days=7))]:
        html = client.get(f"/targets/cern-1?until={END}&window={window}").text
        loss = chart_specs(html)["loss"]["x"]
        expected = int(span / data.STEP)
        assert len(loss) in (expected, expected + 1)  # every run in the window, none before
        assert all(end - span.total_seconds() <= t < end for t in loss)
        assert 'class="on" href="?until=' in html and f"window={window}" in html
    rows = csv_rows(client, f"/targets/cern-1/tables/ping?until={END}&window=1d")
    assert len(rows) in (16, 17)
    assert client.get("/targets/cern-1?window=2y").status_code == 422

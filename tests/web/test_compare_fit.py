"""The compare page's default fit does not assume y grows with x (throughput falls with RTT)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from iepm.web.pages.compare import fit_points
from tests.web.test_api import END, csv_rows


def test_a_falling_relation_is_fitted_as_one() -> None:
    rng = np.random.default_rng(4)
    rtt = np.array([5.2, 20.0, 50.6, 148.0, 190.0, 300.0])
    throughput = 9e9 / rtt * rng.uniform(0.9, 1.1, len(rtt))  # Mathis: ∝ 1/RTT
    auto = fit_points(rtt, throughput, "auto")
    assert auto.model == "power"
    assert auto.exponent == pytest.approx(-1.0, abs=0.1)
    assert auto.r_squared is not None and auto.r_squared > 0.95
    assert auto.at(100.0) == pytest.approx(9e7, rel=0.15)
    origin = fit_points(rtt, throughput, "origin")
    assert origin.r_squared is not None and origin.r_squared < 0  # what the old default showed
    line = fit_points(rtt, throughput, "linear")
    assert line.slope is not None and line.slope < 0 and (line.r_squared or 0) >= 0


def test_auto_is_a_line_with_an_intercept_when_a_value_is_not_positive() -> None:
    x = np.array([0.0, 1.0, 2.0, 3.0])
    y = np.array([5.0, 3.0, 1.0, -1.0])
    fit = fit_points(x, y, "auto")
    assert fit.model == "linear"
    assert fit.slope == pytest.approx(-2.0) and fit.intercept == pytest.approx(5.0)
    assert fit.r_squared == pytest.approx(1.0)


def test_the_pages_default_fit_has_a_non_negative_r_squared(client: TestClient) -> None:
    url = f"/compare/tables/fit?x=ping.rtt_avg_ms&y=iperf3.throughput_bps&until={END}"
    fit = csv_rows(client, url)[0]
    assert fit["model"] == "power"
    assert float(fit["r_squared"]) >= 0
    page = client.get(url.replace("/compare/tables/fit", "/compare")).text
    assert "(log-log)" in page

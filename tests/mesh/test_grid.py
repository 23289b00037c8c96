"""The mesh grid: source × destination, both directions in each cell, asymmetry flagged."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from iepm.store import Archive
from iepm.web.app import create_app
from testkit import sample

# A real PostgreSQL server (the archive_url fixture's pg case).
pytestmark = pytest.mark.servers

NOW = datetime.now(UTC)
PATHS = {  # (monitor, target): throughput
    ("a", "b"): 900e6,
    ("b", "a"): 300e6,  # a third of the way back: asymmetric
    ("a", "c.qos"): 500e6,
    ("c", "a.qos"): 480e6,
    ("c", "a.internet"): 90e6,  # no way back measured on this route
}


@pytest.fixture
def client(archive_url: str) -> Iterator[TestClient]:
    with Archive.open(archive_url) as archive:
        for (monitor, target), bps in PATHS.items():
            for minutes in (30, 90):  # two runs: the cell is their mean
                data = {**sample.iperf3().data, "throughput_bps": bps * (1 + (minutes == 90) / 10)}
                archive.add(
                    sample.iperf3(
                        target, NOW - timedelta(minutes=minutes), monitor=monitor, data=data
                    )
                )
    with TestClient(create_app(archive_url, cache_ttl_s=0)) as test_client:
        yield test_client


def test_grid_api_pairs_both_directions_per_route(client: TestClient) -> None:
    answer = client.get("/api/v1/mesh/grid", params={"metric": "iperf3.throughput_bps"})
    assert answer.status_code == 200, answer.text
    grid = answer.json()
    assert grid["hosts"] == ["a", "b", "c"]
    cells = {(c["source"], c["destination"], c["route"]): c for c in grid["cells"]}
    ab = cells[("a", "b", "")]
    assert ab["forward"] == pytest.approx(900e6 * 1.05)
    assert ab["reverse"] == pytest.approx(300e6 * 1.05)
    assert (ab["n_forward"], ab["n_reverse"], ab["asymmetric"]) == (2, 2, True)
    qos = cells[("c", "a", "qos")]
    assert qos["reverse"] == pytest.approx(500e6 * 1.05) and qos["asymmetric"] is False
    internet = cells[("c", "a", "internet")]
    assert (internet["reverse"], internet["n_reverse"], internet["asymmetric"]) == (None, 0, False)


def test_grid_page_shows_each_cell_both_ways_and_marks_asymmetry(client: TestClient) -> None:
    page = client.get("/mesh", params={"metric": "iperf3.throughput_bps", "days": 2})
    assert page.status_code == 200
    assert '<div class="asymmetric" title="directions differ">→ 9.45e+08 ← 3.15e+08</div>' in (
        page.text
    )
    assert "<div>qos: → 5.04e+08 ← 5.25e+08</div>" in page.text


def test_an_unknown_metric_is_refused_with_the_known_ones(client: TestClient) -> None:
    answer = client.get("/api/v1/mesh/grid", params={"metric": "iperf3.speed"})
    assert answer.status_code == 422
    assert "unknown metric 'iperf3.speed'" in answer.json()["detail"]
    assert "iperf3.throughput_bps" in answer.json()["detail"]


def test_pair_api_holds_both_directions_per_route(client: TestClient) -> None:
    answer = client.get("/api/v1/mesh/pair", params={"a": "a", "b": "c", "days": 2})
    assert answer.status_code == 200, answer.text
    rows = {(r["metric"], r["route"]): r for r in answer.json()["rows"]}
    qos = rows[("iperf3.throughput_bps", "qos")]
    assert qos["forward"]["n"] == 2 and qos["reverse"]["n"] == 2
    assert qos["forward"]["mean"] == pytest.approx(500e6 * 1.05)
    assert qos["reverse"]["mean"] == pytest.approx(480e6 * 1.05)
    assert qos["forward"]["minimum"] == pytest.approx(500e6)
    assert qos["forward"]["maximum"] == pytest.approx(550e6)
    assert qos["forward"]["std"] == pytest.approx(math.sqrt(2) * 25e6)  # sample sd of two
    internet = rows[("iperf3.throughput_bps", "internet")]
    assert internet["forward"]["n"] == 0 and internet["reverse"]["mean"] == pytest.approx(94.5e6)
    # Both orders of the pair name the same figures, turned round.
    back = client.get("/api/v1/mesh/pair", params={"a": "c", "b": "a", "days": 2}).json()
    turned = {(r["metric"], r["route"]): r for r in back["rows"]}
    assert turned[("iperf3.throughput_bps", "qos")]["reverse"] == qos["forward"]


def test_pair_page_and_its_daily_csv(client: TestClient) -> None:
    page = client.get("/mesh/pair", params={"a": "a", "b": "b"})
    assert page.status_code == 200 and "a → b" in page.text and "b → a" in page.text
    table = client.get("/mesh/pair", params={"a": "a", "b": "b", "format": "csv"})
    assert table.headers["content-type"].startswith("text/csv")
    lines = table.text.splitlines()
    assert lines[0] == "day,metric,route,a_to_b,b_to_a"
    throughput = [line.split(",") for line in lines[1:] if ",iperf3.throughput_bps," in line]
    forward = sum(float(f[3]) for f in throughput if f[3])
    assert forward > 0 and all(f[4] for f in throughput)


def test_a_pair_with_nothing_between_is_404_and_a_self_pair_422(client: TestClient) -> None:
    assert client.get("/api/v1/mesh/pair", params={"a": "b", "b": "c"}).status_code == 404
    assert client.get("/api/v1/mesh/pair", params={"a": "b", "b": "b"}).status_code == 422

"""The flows page and a target page's passive series, over an archive of iperf3 results and the
flow records of their streams (encoded by the tests' own writer, decoded by the collector's
decoder), plus a transfer between hosts iepm does not test."""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from iepm.flows.compare import match, table
from iepm.flows.decode import Decoder
from iepm.flows.store import add_flows, read_flows
from iepm.results import Result, format_time, new_result_id
from iepm.store import Archive
from iepm.web.app import create_app
from testkit import flow_encoder as enc
from testkit.flow_encoder import F

END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
TARGET, ADDRESS = "tgt", "198.18.2.2"
MONITOR_ADDRESS = "198.18.1.2"
TESTS = 60


def _test(rng: random.Random, k: int) -> tuple[Result, list[F]]:
    """One iperf3 test of 1–4 streams and the flows of its streams (each a little off the
    active figure, as exporters see headers and iperf3 counts payload)."""
    started = END - timedelta(hours=TESTS - k)
    start_ms = int(started.timestamp() * 1000) + 150  # the streams open after the control one
    streams = 1 + k % 4
    total_bps = rng.uniform(20e6, 40e6)
    flows = []
    for s in range(streams):
        duration_ms = 10_000 + rng.randrange(-40, 40)
        octets = int(total_bps / streams * duration_ms / 1000 / 8 * rng.uniform(1.0, 1.03))
        flows.append(
            F(MONITOR_ADDRESS, ADDRESS, 40000 + 10 * k + s, 5201, 6, octets, octets // 1448,
              start_ms + s, start_ms + s + duration_ms)
        )  # fmt: skip
    result = Result(
        probe="iperf3", tool="iperf3", tool_version="iperf 3.12", monitor="mon", target=TARGET,
        target_address=ADDRESS, started_at=started, duration_s=10.0, diags="iperf3",
        raw_token=new_result_id(), params={"port": 5201, "streams": streams},
        data={"throughput_bps": total_bps},
    )  # fmt: skip
    return result, flows


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[tuple[str, list[Result]]]:
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    rng = random.Random(14)
    decoder = Decoder()
    results, seq = [], 0
    with Archive.open(url) as archive:
        for k in range(TESTS):
            result, flows = _test(rng, k)
            results.append(result)
            now_ms = max(f.end_ms for f in flows) + 1000
            packet = enc.v5(flows, seq=seq, now_ms=now_ms, uptime_ms=86_400_000)
            seq += len(flows)
            add_flows(archive, decoder.decode(packet, "198.18.1.1"), "udp")
        # A transfer between two hosts iepm does not test: passive only.
        when = int((END - timedelta(minutes=30)).timestamp() * 1000)
        other = [F("198.18.7.7", "198.18.8.8", 50000 + s, 1094, 6, 50_000_000, 35_000, when,
                   when + 20_000) for s in range(2)]  # fmt: skip
        packet = enc.v5(other, seq=seq, now_ms=when + 21_000, uptime_ms=86_400_000)
        add_flows(archive, decoder.decode(packet, "198.18.1.1"), "udp")
        archive.add_many(results)
        assert decoder.stats.lost == 0 and decoder.stats.truncated == 0
        yield url, results


def _csv(client: TestClient, url: str) -> list[dict[str, str]]:
    response = client.get(url)
    assert response.status_code == 200, response.text
    return list(csv.DictReader(io.StringIO(response.text)))


def test_flows_page_shows_the_comparison_and_untested_transfers(
    filled: tuple[str, list[Result]],
) -> None:
    url, results = filled
    with Archive.open(url) as archive:
        expected = table(match(results, list(read_flows(archive)))[0])
    until = format_time(END + timedelta(minutes=1))
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        rows = _csv(client, f"/flows/tables/compare?until={until}")
        assert [(r["target"], r["formula"], int(r["n"])) for r in rows] == [
            (TARGET, str(e.formula), e.n) for e in expected
        ]
        f1 = rows[0]
        assert int(f1["n"]) == TESTS and float(f1["r"]) > 0.9
        assert -0.05 < float(f1["err_p25"]) <= float(f1["err_p75"]) < 0.05
        assert float(f1["err_median"]) == pytest.approx(
            expected[0].err_median, rel=1e-5
        )  # 6 digits written

        passive = _csv(client, f"/flows/tables/passive?until={until}")
        assert len(passive) == TESTS + 1
        assert sum(1 for r in passive if r["tested"] == f"iperf3 {TARGET}") == TESTS
        (untested,) = [r for r in passive if not r["tested"]]
        assert (untested["src"], untested["dst"], untested["streams"]) == (
            "198.18.7.7", "198.18.8.8", "2"
        )  # fmt: skip
        assert float(untested["f1_bps"]) == pytest.approx(2 * 50e6 * 8 / 20, rel=1e-6)
        assert untested["source"] == "passive"

        html = client.get(f"/flows?until={until}").text
        assert f"{TESTS} tests matched, 0 without flows" in html
        assert 'id="chart-active-passive"' in html

        # The target page draws the passive series beside the active ones.
        page = client.get(f"/targets/{TARGET}?until={until}").text
        assert 'id="chart-passive"' in page and 'id="table-passive"' in page
        series = _csv(client, f"/targets/{TARGET}/tables/passive?until={until}")
        assert len(series) == TESTS and {r["dst"] for r in series} == {ADDRESS}

        assert client.get("/flows?probe=nosuch").status_code == 422
        assert client.get("/flows/tables/nosuch").status_code == 404

"""The live pages' first picture (the spec their script starts from) over a fresh SQLite
archive: groups and gaps of the ping page, raw and EWMA of the bandwidth page from real ping
results, interface rates and running tests; bad parameters are one line; the demo's bridge
from a ping run to live samples."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from iepm.demo import ping_replies
from iepm.probes import ping
from iepm.probes.base import ProbeContext
from iepm.results import Result
from iepm.store import Archive, live
from iepm.store.live import LiveSample
from iepm.web.app import create_app
from iepm.web.pages.live import ewma
from iepm.web.places import Place

PLACES = {"slac": Place("slac", "us"), "cern": Place("cern", "europe"), "ihep": Place("ihep")}


@pytest.fixture
def url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="iepm-live-pages-") as path:
        yield f"sqlite:///{Path(path) / 'iepm.db'}"


@pytest.fixture
def archive(url: str) -> Iterator[Archive]:
    with Archive.open(url) as opened:
        yield opened


@pytest.fixture
def client(url: str, archive: Archive) -> Iterator[TestClient]:
    with TestClient(create_app(url, cache_ttl_s=0, places=PLACES)) as test_client:
        yield test_client


def spec_of(html: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="live-spec">(.*?)</script>', html, re.S)
    assert found, html[:500]
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def real_pings(n: int) -> list[Result]:
    if shutil.which("ping") is None:
        pytest.skip("iputils ping is not installed")
    ctx = ProbeContext(target="loopback", address="127.0.0.1", monitor="mon")
    return [asyncio.run(ping.run(ping.Spec(count=3, interval_s=0.2), ctx)) for _ in range(n)]


def test_ewma_follows_its_formula() -> None:
    assert ewma([], 0.3) == []
    assert ewma([10.0, 20.0, 20.0], 0.5) == [10.0, 15.0, 17.5]
    assert ewma([4.0, 8.0], 1.0) == [4.0, 8.0]


def test_ping_page_groups_targets_and_keeps_lost_replies(
    archive: Archive, client: TestClient
) -> None:
    now_s = time.time()
    newest = live.publish(
        archive, "mon",
        [LiveSample("cern", "ping", "rtt_ms", now_s - 2, 150.0),
         LiveSample("cern", "ping", "rtt_ms", now_s - 1, None),
         LiveSample("kek", "ping", "rtt_ms", now_s - 1, 120.0),
         LiveSample("cern", "ping", "rtt_ms", now_s - 999, 1.0),  # older than the window
         LiveSample("eth0", "interface", "rx_mbps", now_s - 1, 5.0)],
    )  # fmt: skip
    response = client.get("/live/ping?minutes=5")
    assert response.status_code == 200
    assert 'href="/live/ping"' in response.text  # in the site's navigation
    spec = spec_of(response.text)
    # By group, then site: no group first ("kek" is not configured, "ihep" has only a site).
    assert spec["groups"] == [
        {"name": "(no group)", "targets": ["kek"]},
        {"name": "ihep", "targets": ["ihep"]},
        {"name": "europe", "targets": ["cern"]},
        {"name": "us", "targets": ["slac"]},
    ]
    assert spec["series"]["cern"] == [[now_s - 2, 150.0], [now_s - 1, None]]
    assert set(spec["series"]) == {"cern", "kek"}
    assert spec["after"] == newest  # the stream starts after the newest drawn
    assert spec["probe"] == "ping" and spec["window_s"] == 300


def test_bandwidth_page_draws_raw_and_ewma_of_real_results(
    archive: Archive, client: TestClient
) -> None:
    results = real_pings(3)
    for r in results:
        archive.add(r)
    response = client.get("/live/bandwidth?probe=ping&metric=rtt_avg_ms&weight=0.25")
    assert response.status_code == 200
    assert "w = 0.25" in response.text
    spec = spec_of(response.text)
    series = spec["targets"]["loopback"]
    raw = [r.data["rtt_avg_ms"] for r in results if r.succeeded]
    assert series["raw"] == pytest.approx(raw)
    assert series["ewma"] == pytest.approx(ewma(raw, 0.25))
    assert series["t"] == pytest.approx([r.started_at.timestamp() for r in results if r.succeeded])
    assert series["norm"] == [None] * len(raw)  # ping carries no normalised estimate
    assert spec["normalised"] == "normalised_rtt_avg_ms"
    assert spec["results_after"] > 0


def test_bandwidth_page_of_an_unregistered_estimator_says_so(client: TestClient) -> None:
    response = client.get("/live/bandwidth?probe=abwx")
    assert response.status_code == 200
    assert "not registered" in response.text
    assert spec_of(response.text)["targets"] == {}


def test_interface_page_shows_rates_and_running_tests(archive: Archive, client: TestClient) -> None:
    now_s = time.time()
    live.publish(
        archive, "mon",
        [LiveSample("eth0", "interface", "rx_mbps", now_s - 4, 10.0),
         LiveSample("eth0", "interface", "tx_mbps", now_s - 4, 900.0),
         LiveSample("eth0", "interface", "rx_mbps", now_s - 200, 1.0)],  # before the 120 s
    )  # fmt: skip
    live.set_running(
        archive, "mon", "iperf3", "cern", {"streams": 8, "window_bytes": 4194304}, deadline_s=60
    )
    spec = spec_of(client.get("/live/interface").text)
    assert spec["series"] == {
        "eth0": {"rx_mbps": [[now_s - 4, 10.0]], "tx_mbps": [[now_s - 4, 900.0]]}
    }
    [running] = spec["running"]
    assert (running["target"], running["probe"], running["tool"]) == ("cern", "iperf3", "iperf3")
    assert running["params"] == {"streams": 8, "window_bytes": 4194304}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("/live/bandwidth?weight=0", "query.weight: Input should be greater than 0"),
        ("/live/ping?minutes=999", "query.minutes: Input should be less than or equal to 60"),
        ("/live/events?after=-1", "query.after: Input should be greater than or equal to 0"),
    ],
)
def test_bad_parameters_are_one_line(client: TestClient, query: str, message: str) -> None:
    response = client.get(query)
    assert response.status_code == 422
    assert response.json()["detail"].startswith(message)


def test_a_ping_run_becomes_one_live_sample_per_packet() -> None:
    [result] = real_pings(1)
    samples = ping_replies(result)
    assert [s.value for s in samples] == result.data["rtts_ms"]
    start_s = result.started_at.timestamp()
    assert [s.t_s for s in samples] == pytest.approx(
        [start_s + (seq - 1) * 0.2 for seq in result.data["seqs"]]
    )
    assert {(s.target, s.probe, s.metric) for s in samples} == {("loopback", "ping", "rtt_ms")}

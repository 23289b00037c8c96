"""Dead paths stay visible: failed runs are drawn on the charts (a dead ping at 100 % loss,
shaded outages with their reason), and ``/metrics`` keeps a dead path's series."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from iepm.analysis.alerts import Alert, store_alert
from iepm.results import Outcome, Result
from iepm.store import Archive
from iepm.web.app import create_app
from tests.web import data
from tests.web.test_api import chart_specs

REASON = "ping to cern-1 did not finish within 15 s"


def _runs(now: datetime) -> list[Result]:
    rng = random.Random(5)
    out = []
    for minutes, target, dead in [
        (50, "cern-1", False),
        (40, "cern-1", True),
        (30, "cern-1", False),
        (20, "cern-1", True),
        (10, "cern-1", True),
        (10, "bnl-2", False),
    ]:
        run = data._ping(rng, "slac-mon", target, now - timedelta(minutes=minutes))
        out.append(data._failed(run, Outcome.TIMEOUT, REASON) if dead else run)
    return out


@pytest.fixture(scope="module")
def dead(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, list[Result]]]:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('dead')) / 'a.db'}"
    runs = _runs(datetime.now(UTC))
    with Archive.open(url) as archive:
        archive.add_many(runs)
        # As the watcher writes it: the probe, and the metric's bare key.
        step = runs[2].started_at
        store_alert(
            archive,
            Alert(
                "slac-mon",
                "cern-1",
                "ping",
                "rtt_avg_ms",
                step,
                step,
                "up",
                150.0,
                190.0,
                26.7,
                "route",
            ),
        )
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        yield client, runs


def test_metrics_keep_a_dead_paths_series_with_loss_1_and_probe_success_0(
    dead: tuple[TestClient, list[Result]],
) -> None:
    client, _runs = dead
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
    }
    cern = (("monitor", "slac-mon"), ("target", "cern-1"))
    bnl = (("monitor", "slac-mon"), ("target", "bnl-2"))
    assert samples[("iepm_ping_loss_ratio", cern)] == 1.0
    assert math.isnan(samples[("iepm_ping_rtt_avg_seconds", cern)])  # kept, with no figure
    assert samples[("iepm_ping_rtt_avg_seconds", bnl)] > 0
    probe = (("probe", "ping"),)
    assert samples[("iepm_probe_success", tuple(sorted(cern + probe)))] == 0.0
    assert samples[("iepm_probe_success", tuple(sorted(bnl + probe)))] == 1.0


def test_target_charts_draw_failed_runs_and_shade_outages_with_their_reason(
    dead: tuple[TestClient, list[Result]],
) -> None:
    client, runs = dead
    html = client.get("/targets/cern-1").text
    specs = chart_specs(html)
    loss = specs["loss"]
    times = [r.started_at.timestamp() for r in runs if r.target == "cern-1"]
    assert loss["x"] == pytest.approx(times)
    assert loss["series"][0]["values"][1] == 100.0  # the timed-out run, plotted at 100 % loss
    assert loss["series"][0]["values"][3:] == [100.0, 100.0]
    assert specs["rtt"]["series"][1]["values"][1] is None  # no RTT: a gap, not a zero
    outages = loss["outages"]
    assert [outages[0]["from"], outages[0]["to"]] == pytest.approx([times[1], times[2]])
    assert len(outages) == 2 and outages[1]["from"] == pytest.approx(times[3])
    assert outages[1]["to"] >= times[4]  # still down: to the page's end
    assert all(o["reason"] == f"timeout: {REASON}" for o in outages)
    assert specs["rtt"]["outages"] == outages  # on every chart of the probe
    assert REASON in html  # written under the chart too


def test_the_overview_cell_of_a_dead_path_says_why(dead: tuple[TestClient, list[Result]]) -> None:
    client, _runs = dead
    grid = client.get("/").text.split('id="grid"')[1].split("</table>")[0]
    assert REASON in grid


def test_an_alert_written_by_the_watcher_is_drawn_on_its_metrics_chart(
    dead: tuple[TestClient, list[Result]],
) -> None:
    client, runs = dead
    specs = chart_specs(client.get("/targets/cern-1").text)
    assert specs["rtt"]["alerts"] == [
        {"t": pytest.approx(runs[2].started_at.timestamp()), "label": "ping.rtt_avg_ms up: route"}
    ]
    assert specs["loss"]["alerts"] == []


def test_the_smoke_chart_spreads_every_packet_and_colours_by_loss(
    dead: tuple[TestClient, list[Result]],
) -> None:
    client, runs = dead
    specs = chart_specs(client.get("/targets/cern-1").text)
    smoke = specs["smoke"]
    mine = [r for r in runs if r.target == "cern-1"]
    assert smoke["x"] == pytest.approx([r.started_at.timestamp() for r in mine])
    levels = {s["label"]: s["values"] for s in smoke["series"]}
    assert list(levels) == ["p0", "p10", "p25", "p50", "p75", "p90", "p100"]
    first = np.array(mine[0].data["rtts_ms"])
    assert levels["p50"][0] == pytest.approx(float(np.median(first)))
    assert levels["p0"][0] == pytest.approx(first.min())
    assert levels["p100"][0] == pytest.approx(first.max())
    assert levels["p50"][1] is None  # the timed-out run: no packet came back
    assert smoke["loss"][1] == 100.0 and smoke["loss"][0] == mine[0].data["loss_percent"]
    assert smoke["outages"] == specs["loss"]["outages"]

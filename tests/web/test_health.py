"""The overview colours paths by absolute thresholds, the same for every path, with a site's
overrides per target and group; "unusual for this path" is a second mark, not the colour."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from iepm.errors import ConfigError
from iepm.probes import metric
from iepm.results import Result
from iepm.store import Archive
from iepm.web.app import create_app
from iepm.web.health import Thresholds, judge, load_thresholds
from iepm.web.places import Place
from tests.web import data


def ping(target: str, when: datetime, rtt: float, lost: int = 0) -> Result:
    rtts = [rtt] * (100 - lost)
    figures = {
        "packets_sent": 100,
        "packets_received": 100 - lost,
        "loss_percent": float(lost),
        "rtt_min_ms": rtt,
        "rtt_avg_ms": rtt,
        "rtt_max_ms": rtt,
        "rtt_mdev_ms": 0.1,
        "rtts_ms": rtts,
    }
    return data._result("ping", "slac-mon", target, when, figures, duration=9.0)


def chips(html: str) -> dict[tuple[str, str], tuple[str, bool]]:
    """(target, metric) → (colour class, marked unusual) of each overview cell."""
    import re

    out = {}
    grid = html.split('id="grid"')[1].split("</table>")[0]
    for row in grid.split("<tr>")[1:]:
        target = re.search(r'<a href="/targets/([^"?]+)"', row)
        if target is None:
            continue  # the header, a group's row
        for classes, name in re.findall(r'class="chip ([^"]+)" data-metric="([^"]+)"', row):
            words = classes.split()
            out[(target.group(1), name)] = (words[0], "unusual" in words)
    return out


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{Path(tmp_path_factory.mktemp('health')) / 'a.db'}"
    rng = random.Random(11)
    now = datetime.now(UTC)
    runs = []
    for i in range(30):
        when = now - timedelta(hours=30 - i)
        # slac: 5.2 ms with 0.3 ms of noise; its latest is its worst (unusual, yet healthy).
        runs.append(ping("slac", when, 5.2 + rng.uniform(0, 0.3) if i < 29 else 5.6))
        # cern: 148 ms, then a route change to 193 ms (+30 %); desy: 2 of 100 packets lost.
        runs.append(ping("cern", when, 148.0 + rng.uniform(0, 1) if i < 29 else 193.0))
        runs.append(ping("desy", when, 20.0, lost=2 if i == 29 else 0))
    with Archive.open(url) as archive:
        archive.add_many(runs)
    return url


def test_colours_follow_thresholds_not_each_paths_history(url: str) -> None:
    with TestClient(create_app(url, cache_ttl_s=0)) as client:
        cells = chips(client.get("/").text)
    assert cells[("slac", "ping.rtt_avg_ms")] == ("good", True)  # noise: healthy, but unusual
    assert cells[("cern", "ping.rtt_avg_ms")][0] == "fair"  # 30 % over its baseline
    assert cells[("desy", "ping.loss_percent")][0] == "poor"  # 2 % loss > 1 %
    assert cells[("slac", "ping.loss_percent")][0] == "good"


def test_a_sites_thresholds_override_per_target_and_group(url: str, tmp_path: Path) -> None:
    toml = tmp_path / "thresholds.toml"
    toml.write_text(
        '[defaults."ping.loss_percent"]\ncritical = 5\n'
        '[groups.europe."ping.rtt_avg_ms"]\nwarn = 40\ncritical = 80\n'
        '[targets.slac."ping.rtt_avg_ms"]\nreference = 3.5\nfloor = 0.5\n'
    )
    places = {"cern": Place("cern", "europe")}
    app = create_app(url, cache_ttl_s=0, places=places, thresholds=load_thresholds(str(toml)))
    with TestClient(app) as client:
        html = client.get("/").text
    cells = chips(html)
    assert cells[("cern", "ping.rtt_avg_ms")][0] == "good"  # its group's 40 %
    assert cells[("desy", "ping.loss_percent")][0] == "fair"  # 2 %: now under critical
    assert cells[("slac", "ping.rtt_avg_ms")][0] == "poor"  # 5.6 ms is 60 % over 3.5 ms
    assert "critical above 5 %" in html.split('id="legend"')[1].split("</p>")[0]


def test_throughput_is_judged_as_a_share_of_what_the_path_is_expected_to_carry() -> None:
    rate = metric("iperf3.throughput_bps")
    history = np.array([80e6] * 20)
    rule = Thresholds().rule(rate, "cern", None)
    assert judge(rate, rule, 12e6, history).status == "critical"  # 15 % of 80 Mbit/s
    assert judge(rate, rule, 35e6, history).status == "warn"
    assert judge(rate, rule, 70e6, history).status == "ok"
    assert judge(rate, rule, 70e6, np.array([])).status == "nodata"  # nothing to expect yet


def test_a_bad_thresholds_file_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    toml = tmp_path / "t.toml"
    toml.write_text('[targets.cern."ping.rtt_avg_ms"]\nwarn = -1\n')
    with pytest.raises(ConfigError) as err:
        load_thresholds(str(toml))
    assert str(err.value).startswith(f"{toml}: targets.cern.ping.rtt_avg_ms.warn: ")
    assert "\n" not in str(err.value)
    toml.write_text('[defaults."ping.rtt_median_ms"]\nwarn = 1\n')
    with pytest.raises(ConfigError, match=r"unknown metric 'ping\.rtt_median_ms'"):
        load_thresholds(str(toml))


def test_serve_refuses_a_bad_thresholds_file_with_the_usage_exit_code(
    url: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from iepm.cli import app
    from iepm.errors import ExitCode

    toml = tmp_path / "t.toml"
    toml.write_text("[defaults.nope]\nwarn = 1\n")
    result = CliRunner().invoke(
        app, ["serve", "--db", url, "--listen", "127.0.0.1:1", "--thresholds", str(toml)]
    )
    assert result.exit_code == ExitCode.USAGE
    assert "unknown metric 'nope'" in result.output and "Traceback" not in result.output

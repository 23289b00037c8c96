"""`iepm probe` against the lab's ground truth: what it reports is what the lab was told to be.

The CLI runs inside the lab's monitor namespace exactly as a user would run it there; the lab
knows every path's configured RTT, loss, bottleneck rate and routers. Delays and rates are
measured on a host fit to emulate them (testkit.fitness) and held to their tolerance then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from testkit.fitness import on_a_fit_host
from testkit.labtools import binomial_interval
from testkit.net import iperf3_server

pytestmark = pytest.mark.lab
# Tests that hold a figure of the delay line (delay, loss, rate) against the lab's truth.
timing = pytest.mark.timing

# mon - r1 - r2 - tfar (40 ms RTT, two routers); r1 - tloss (lossy); r1 - t300;
# mon - trate (40 Mbit/s bottleneck, 20 ms RTT).
TOPOLOGY = {
    "lab": {"name": "gt", "seed": 11},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "r2", "role": "router"},
        *({"name": n, "role": "target"} for n in ("tfar", "tloss", "t300", "trate")),
    ],
    "links": [
        {"a": "mon", "b": "r1", "delay_ms": 0.5},
        {"a": "r1", "b": "r2", "delay_ms": 9.5},
        {"a": "r2", "b": "tfar", "delay_ms": 10.0},
        {"a": "r1", "b": "tloss", "delay_ms": 2.0, "loss_percent": 2.0},
        {"a": "r1", "b": "t300", "delay_ms": 149.5},
        {"a": "mon", "b": "trate", "delay_ms": 10.0, "rate_mbit": 40},
    ],
}


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Iterator[Lab]:
    lab = module_lab_factory(TOPOLOGY, prefix="gt")
    lab.wait_reachable("mon")  # neighbours resolved before the first measurement
    yield lab


def iepm_probe(lab: Lab, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Run ``iepm probe ... --json`` in the monitor's namespace; return the envelope."""
    argv = ["ip", "netns", "exec", lab.netns("mon"), sys.executable, "-m", "iepm.cli", "probe"]
    done = subprocess.run(
        [*argv, *args, "--json"], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.stdout.strip(), done.stderr
    envelope: dict[str, Any] = json.loads(done.stdout)
    return envelope


@timing
@pytest.mark.parametrize("target", ["tfar", "t300"])
def test_ping_reports_the_configured_rtt(lab: Lab, target: str) -> None:
    truth = lab.ground_truth("mon", target)
    argv = ["ping", lab.address(target), "--count", "50", "--interval", "0.02"]
    fit = on_a_fit_host(lambda: iepm_probe(lab, *argv), f"{truth['rtt_ms']} ms of RTT")
    result = fit.value
    assert result["outcome"] == "ok", fit.explain(result["error"])
    tolerance = max(0.5, 0.03 * truth["rtt_ms"])
    assert abs(result["data"]["rtt_avg_ms"] - truth["rtt_ms"]) <= tolerance, fit.explain(
        (result, truth)
    )
    assert result["data"]["rtt_min_ms"] >= truth["rtt_ms"] - tolerance, fit.explain(result)


def test_replies_in_flight_at_the_end_are_not_counted_as_loss(lab: Lab) -> None:
    # 300 ms RTT, a request every 0.2 s: when the last request goes out, the replies to it and
    # its predecessor are still on their way. They must be waited for, not reported lost.
    result = iepm_probe(lab, "ping", lab.address("t300"), "--count", "5", "--interval", "0.2")
    assert result["outcome"] == "ok", result["error"]
    data = result["data"]
    assert (data["packets_sent"], data["packets_received"], data["loss_percent"]) == (5, 5, 0.0)


@timing
def test_ping_reports_the_configured_loss_within_its_binomial_interval(lab: Lab) -> None:
    truth = lab.ground_truth("mon", "tloss")
    assert truth["loss_percent"] == pytest.approx(100 * (1 - 0.98**2))
    sent = 2000
    result = iepm_probe(
        lab, "ping", lab.address("tloss"), "--count", str(sent), "--interval", "0.005"
    )
    assert result["outcome"] == "ok", result["error"]
    data = result["data"]
    n = data["packets_sent"]
    assert n == sent
    lost = n - data["packets_received"]
    lo, hi = binomial_interval(n, truth["loss_percent"] / 100, level=0.99)
    assert lo <= lost <= hi, (lost, (lo, hi), data["loss_percent"])
    assert data["loss_percent"] == pytest.approx(100 * lost / n)


@timing
def test_iperf3_with_tuned_streams_reaches_90_percent_of_the_bottleneck(lab: Lab) -> None:
    truth = lab.ground_truth("mon", "trate")
    address = lab.address("trate")

    def tuned() -> dict[str, Any]:
        with iperf3_server(address, port=5301, netns=lab.netns("trate")) as port:
            return iepm_probe(
                lab, "iperf3", address, "--port", str(port), "--streams", "4", "--duration", "6",
                "--omit", "1", "--window", "256K",
            )  # fmt: skip

    fit = on_a_fit_host(tuned, f"a {truth['rate_mbit']} Mbit/s bottleneck")
    result = fit.value
    assert result["outcome"] == "ok", fit.explain(result["error"])
    mbit = result["data"]["throughput_bps"] / 1e6
    assert result["data"]["stream_count"] == 4
    assert 0.90 * truth["rate_mbit"] <= mbit <= 1.02 * truth["rate_mbit"], fit.explain(mbit)


@timing
@pytest.mark.parametrize("method", ["icmp", "udp"])
def test_traceroute_lists_the_labs_routers_in_order(lab: Lab, method: str) -> None:
    truth = lab.ground_truth("mon", "tfar")
    assert len(truth["hops"]) == 2
    argv = ["traceroute", lab.address("tfar"), "--method", method]
    fit = on_a_fit_host(lambda: iepm_probe(lab, *argv), "10 ms of delay to a router within 2 ms")
    result = fit.value
    assert result["outcome"] == "ok", result["error"]
    data = result["data"]
    assert data["reached"]
    addresses = [hop["address"] for hop in data["hops"]]
    assert addresses == [*truth["hops"], lab.address("tfar")]
    # Each hop's RTT grows with the configured delay to that router (0.5 ms, then 10 ms one way).
    assert data["hops"][1]["rtts_ms"][0] == pytest.approx(20.0, abs=2.0), fit.explain(data)

"""Scheduled and manual events change routes and links at the right moment; cross traffic.

The delays, moments and rates are measured on a host fit to emulate them (testkit.fitness: a
lab built again while the host wakes the delay line late, the test skipped with the figures if
it stays late) and held to their bounds then."""

from __future__ import annotations

import math
import re
import statistics
import time

import pytest

from iepm.lab import Lab
from iepm.lab.events import client_argv, segments
from iepm.lab.testing import LabFactory
from iepm.lab.topology import TrafficSpec
from testkit.fitness import on_a_fit_host
from testkit.labtools import ping_rtts, ping_stamped

SWITCH_AT_S = 4.0

# mon reaches dst via ra (RTT 10 ms) until the event moves it via rb (RTT 60 ms).
ROUTED = {
    "lab": {"name": "ev", "seed": 3},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "ra", "role": "router"},
        {"name": "rb", "role": "router"},
        {"name": "dst", "role": "target"},
    ],
    "links": [
        {"name": "mon_ra", "a": "mon", "b": "ra", "delay_ms": 2},
        {"name": "ra_dst", "a": "ra", "b": "dst", "delay_ms": 3},
        {"name": "mon_rb", "a": "mon", "b": "rb", "delay_ms": 10},
        {"name": "rb_dst", "a": "rb", "b": "dst", "delay_ms": 20},
    ],
    "events": [
        {"name": "switch", "at_s": SWITCH_AT_S, "action": "route", "path": ["mon", "rb", "dst"]}
    ],
}


def traceroute_hops(lab: Lab, node: str, target: str) -> list[str]:
    run = lab.exec(node, ["traceroute", "-n", "-q", "1", "-w", "2", lab.address(target)], 30)
    return re.findall(r"^\s*\d+\s+(\S+)", run.stdout, re.M)


@pytest.mark.lab
@pytest.mark.timing
def test_route_switch_changes_hops_and_rtt_on_schedule(lab_factory: LabFactory) -> None:
    labs: list[Lab] = []

    def switched() -> tuple[list[str], list[str], list[tuple[float, float]]]:
        """A lab whose event switches the route 4 s after it is up: the lab's hops and
        traceroute's before, then 7 s of pings across the switch."""
        if labs:
            labs[-1].down()  # taken on a late host: a new lab for a new schedule
        labs.append(lab_factory(ROUTED, prefix="ev"))
        truth = labs[-1].ground_truth("mon", "dst")["hops"]
        before = traceroute_hops(labs[-1], "mon", "dst")
        argv = ["ping", "-n", "-D", "-i", "0.05", "-w", "7", labs[-1].address("dst")]
        return truth, before, ping_stamped(labs[-1].exec("mon", argv, 20).stdout)

    fit = on_a_fit_host(switched, "a route switch on schedule within 1 s, 10 and 60 ms of RTT")
    (truth_before, before, samples), lab = fit.value, labs[-1]
    dst = lab.address("dst")
    assert truth_before == [lab.address("ra")]
    assert before == [lab.address("ra"), dst]
    switch_real = lab.real_time(SWITCH_AT_S)
    assert samples[0][0] < switch_real - 1, fit.explain("ping started too late to see the switch")
    first_long = next(t for t, rtt in samples if rtt > 35)
    assert abs(first_long - switch_real) <= 1.0, fit.explain(first_long - switch_real)
    old = [rtt for t, rtt in samples if t < switch_real - 0.5]
    new = [rtt for t, rtt in samples if t > switch_real + 0.5]
    # netem never delivers early; timers and scheduling only add (0.2-1.0 ms per round trip
    # on a busy 2-core VM), so the bounds are one-sided around the delays the lab was told.
    assert 10 - 0.3 <= statistics.median(old) <= 10 + 1.0, fit.explain(statistics.median(old))
    assert 60 - 1.2 <= statistics.median(new) <= 60 + 2.0, fit.explain(statistics.median(new))
    after = traceroute_hops(lab, "mon", "dst")
    assert after == [lab.address("rb"), dst]
    truth = lab.ground_truth("mon", "dst")
    assert truth["hops"] == [lab.address("rb")] and truth["rtt_ms"] == 60
    log = lab.events_log()
    assert [e["name"] for e in log] == ["switch"] and log[0]["error"] is None
    assert abs(log[0]["applied_unix"] - switch_real) < 0.5


@pytest.mark.lab
@pytest.mark.timing
def test_manual_link_events_delay_step_and_down_up(lab_factory: LabFactory) -> None:
    topo = {**ROUTED, "events": []}
    lab = lab_factory(topo, prefix="lk")
    dst = lab.address("dst")
    lab.apply({"action": "link", "link": "ra_dst", "delay_ms": 13, "direction": "a_to_b"})
    truth = lab.ground_truth("mon", "dst")
    assert truth["delay_forward_ms"] == 15 and truth["delay_reverse_ms"] == 5
    argv = ["ping", "-n", "-c", "20", "-i", "0.02", dst]
    fit = on_a_fit_host(lambda: ping_rtts(lab.exec("mon", argv).stdout), "a 20 ms RTT step")
    median = statistics.median(fit.value)
    # One-sided, as above.
    assert 20 - 0.4 <= median <= 20 + 1.0, fit.explain(median)
    lab.apply({"action": "link", "link": "ra_dst", "up": False})
    assert lab.ground_truth("mon", "dst")["links_up"] is False
    run = lab.exec("mon", ["ping", "-n", "-c", "5", "-i", "0.05", "-W", "1", dst])
    assert "0 received" in run.stdout
    lab.apply({"action": "link", "link": "ra_dst", "up": True, "rate_mbit": 5})
    assert lab.ground_truth("mon", "dst")["rate_mbit"] == 5
    run = lab.exec("mon", ["ping", "-n", "-c", "5", "-i", "0.05", dst])
    assert "5 received" in run.stdout


@pytest.mark.lab
@pytest.mark.timing
def test_onoff_cross_traffic_fills_the_bottleneck_and_its_queue(lab_factory: LabFactory) -> None:
    """UDP at 30 Mbit/s into a 20 Mbit/s link: 20 Mbit/s delivered, the 40 ms queue full."""
    shared = {"name": "shared", "a": "r", "b": "dst", "delay_ms": 5}
    shared.update(rate_mbit=20, queue_ms=40)
    topo = {
        "lab": {"name": "xt", "time_compression": 10.0},
        "hosts": [
            {"name": "mon", "role": "monitor"},
            {"name": "r", "role": "router"},
            {"name": "src", "role": "target"},
            {"name": "dst", "role": "target"},
        ],
        "links": [
            {"a": "mon", "b": "r", "delay_ms": 1},
            {"a": "src", "b": "r", "delay_ms": 1},
            shared,
        ],
        # on from lab 10 s to 50 s (real 1 s to 5 s), then off
        "traffic": [
            {
                "name": "bulk",
                "src": "src",
                "dst": "dst",
                "protocol": "udp",
                "rate_mbit": 30,
                "profile": "onoff",
                "start_s": 10,
                "on_s": 40,
                "off_s": 1000,
                "stop_s": 100,
            }
        ],
    }
    labs: list[Lab] = []

    def delivered() -> int:
        return int(labs[-1].link_state("shared")["ab"]["stats"]["bytes_delivered"])

    def on_period() -> tuple[float, list[float]]:
        """A new lab's rate delivered and RTTs well into the on period (lab 25 s: real 2.5 s)."""
        if labs:
            labs[-1].down()  # taken on a late host: a new lab for a new schedule
        labs.append(lab_factory(topo, prefix="xt"))
        time.sleep(max(0.0, labs[-1].real_time(25) - time.time()))
        s1, t1 = delivered(), time.monotonic()
        argv = ["ping", "-n", "-c", "10", "-i", "0.1", labs[-1].address("dst")]
        ping = labs[-1].exec("mon", argv, 10)
        return (delivered() - s1) * 8 / 1e6 / (time.monotonic() - t1), ping_rtts(ping.stdout)

    fit = on_a_fit_host(on_period, "20 Mbit/s of bottleneck and its 40 ms queue")
    (rate_on, rtts), lab = fit.value, labs[-1]
    base_rtt = lab.ground_truth("mon", "dst")["rtt_ms"]
    assert base_rtt == 12
    assert 19 <= rate_on <= 20.5, fit.explain(rate_on)
    queued = statistics.median(rtts) - base_rtt
    print(f"cross traffic: {rate_on:.2f} Mbit/s delivered, queueing delay {queued:.1f} ms")
    assert 34 <= queued <= 41, fit.explain(queued)
    stats = lab.link_state("shared")["ab"]["stats"]
    assert stats["queue_drops"] > 0
    time.sleep(max(0.0, lab.real_time(58) - time.time()))  # off again (0.8 s after)
    s3 = delivered()
    time.sleep(1.0)
    assert (delivered() - s3) * 8 / 1e6 < 0.5


def test_diurnal_segments_follow_the_day() -> None:
    flow = TrafficSpec(
        src="a", dst="b", protocol="udp", rate_mbit=30, min_rate_mbit=2,
        profile="diurnal", step_s=3600, stop_s=86400,
    )  # fmt: skip
    segs = list(segments(flow, compression=60.0))
    assert len(segs) == 24
    rates = [r for _, _, r in segs]
    assert rates.index(max(rates)) in (13, 14)  # the step around 14:00
    assert min(rates) >= 2 and max(rates) <= 30
    assert math.isclose(rates[11], rates[16], rel_tol=1e-9)  # symmetric around 14:00
    argv = client_argv(flow, "198.18.0.2", 5301, 30.0)
    assert argv[argv.index("-b") + 1] == "30000000" and "-u" in argv


def test_onoff_segments_and_compression_floor() -> None:
    flow = TrafficSpec(src="a", dst="b", profile="onoff", on_s=10, off_s=20, stop_s=70)
    assert list(segments(flow, 1.0)) == [(0, 10, None), (30, 40, None), (60, 70, None)]
    fast = TrafficSpec(src="a", dst="b", rate_mbit=5, profile="diurnal", step_s=1)
    first = next(iter(segments(fast, compression=100.0)))
    assert first[1] - first[0] == 200.0  # never shorter than 2 real seconds

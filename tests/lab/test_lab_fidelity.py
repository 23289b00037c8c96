"""Fidelity of the emulated WAN, measured with plain ping and iperf3 inside the lab.

Each delay, jitter and rate is measured on a host fit to emulate it (testkit.fitness: taken
again while the host wakes the delay line late, the test skipped with the figures if it stays
late) and held to its tolerance then."""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Iterator

import pytest

from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from testkit.fitness import on_a_fit_host
from testkit.labtools import binomial_interval, ping_counts, ping_rtts

# Every test holds a figure of the delay line (delay, jitter, loss, rate) against the truth.
pytestmark = [pytest.mark.lab, pytest.mark.timing]

# mon -- r1 -- {t5, t40, t300, tj, tl}; mon-r1 is 0.5 ms one way. The rate-limited targets hang
# directly off mon: one delay line per packet keeps the CPU cost of 200 Mbit/s low on 2 cores.
TOPOLOGY = {
    "lab": {"name": "fid", "seed": 7},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        *({"name": n, "role": "target"} for n in ("t5", "t40", "t300", "tj", "tl", "t10", "t200")),
    ],
    "links": [
        {"a": "mon", "b": "r1", "delay_ms": 0.5},
        {"a": "r1", "b": "t5", "delay_ms": 2.0},
        {"a": "r1", "b": "t40", "delay_ms": 19.5},
        {"a": "r1", "b": "t300", "delay_ms": 149.5},
        {"a": "r1", "b": "tj", "delay_ms": 10.0, "jitter_ms": 2.0},
        {"a": "r1", "b": "tl", "delay_ms": 1.0, "loss_percent": 2.0},
        {"a": "mon", "b": "t10", "delay_ms": 5, "rate_mbit": 10},
        {"a": "mon", "b": "t200", "delay_ms": 5, "rate_mbit": 200},
    ],
}


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Iterator[Lab]:
    lab = module_lab_factory(TOPOLOGY, prefix="fid")
    lab.wait_reachable("mon")  # neighbours resolved before the first measurement
    yield lab


def test_median_rtt_within_tolerance_5_to_300_ms(lab: Lab) -> None:
    targets = {"t5": 5.0, "t40": 40.0, "t300": 300.0}

    async def pings() -> list[str]:
        runs = [
            lab.aexec("mon", ["ping", "-n", "-c", "60", "-i", "0.05", lab.address(t)], 30)
            for t in targets
        ]
        return [r.stdout for r in await asyncio.gather(*runs)]

    fit = on_a_fit_host(lambda: asyncio.run(pings()), "5-300 ms of delay within 0.3 ms")
    for (target, configured), out in zip(targets.items(), fit.value, strict=True):
        truth = lab.ground_truth("mon", target)
        assert truth["rtt_ms"] == pytest.approx(configured)
        assert truth["hops"] == [lab.address("r1")]
        rtts = ping_rtts(out)
        assert len(rtts) >= 58, out[-300:]
        median = statistics.median(rtts)
        tolerance = max(0.3, 0.02 * configured)
        print(f"{target}: configured {configured} ms, median {median:.3f} ms (n={len(rtts)})")
        assert abs(median - configured) <= tolerance, fit.explain(f"{target}: median {median} ms")


def test_jitter_stdev_within_20_percent(lab: Lab) -> None:
    truth = lab.ground_truth("mon", "tj")
    assert truth["rtt_stdev_ms"] == pytest.approx(2.0 * 2**0.5)
    argv = ["ping", "-n", "-c", "600", "-i", "0.01", lab.address("tj")]
    fit = on_a_fit_host(lambda: lab.exec("mon", argv, 30), "2 ms of jitter within 20 %")
    rtts = ping_rtts(fit.value.stdout)
    assert len(rtts) >= 590
    stdev, median = statistics.stdev(rtts), statistics.median(rtts)
    print(f"jitter: configured RTT stdev {truth['rtt_stdev_ms']:.3f} ms, measured {stdev:.3f} ms")
    assert abs(stdev - truth["rtt_stdev_ms"]) <= 0.2 * truth["rtt_stdev_ms"], fit.explain(stdev)
    assert abs(median - truth["rtt_ms"]) <= 0.2 * truth["rtt_stdev_ms"] + 0.3, fit.explain(
        f"median RTT {median} ms, configured {truth['rtt_ms']} ms"
    )


def test_loss_within_binomial_99_percent_interval(lab: Lab) -> None:
    truth = lab.ground_truth("mon", "tl")
    p = truth["loss_percent"] / 100  # round trip: 1 - 0.98**2
    assert p == pytest.approx(1 - 0.98**2)
    run = lab.exec("mon", ["ping", "-n", "-q", "-c", "3000", "-i", "0.002", lab.address("tl")], 60)
    sent, received = ping_counts(run.stdout)
    assert sent == 3000
    lo, hi = binomial_interval(sent, p)
    print(f"loss: {sent - received}/{sent} lost, 99% interval [{lo}, {hi}] for p={p:.4f}")
    assert lo <= sent - received <= hi, (sent - received, lo, hi)


@pytest.mark.parametrize(("target", "rate"), [("t10", 10), ("t200", 200)])
def test_iperf3_tcp_reaches_90_to_100_percent_of_rate(lab: Lab, target: str, rate: int) -> None:
    assert lab.ground_truth("mon", target)["rate_mbit"] == rate
    # The endpoints run at nice -10 so that other work on a small CI box does not starve them:
    # this measures the link, not the scheduler.

    def goodput_mbit() -> float:
        server = lab.popen(
            target,
            ["nice", "-n", "-10", "iperf3", "-s", "-1", "-p", "5201", "-B", lab.address(target)],
        )
        try:
            lab.wait_listening(target)
            argv = ["nice", "-n", "-10", "iperf3", "-c", lab.address(target), "-P", "4"]
            argv += ["-t", "6", "-O", "2", "-J"]
            run = lab.exec("mon", argv, timeout_s=40)
            result = json.loads(run.stdout)
            return float(result["end"]["sum_received"]["bits_per_second"]) / 1e6
        finally:
            lab.stop(server)

    fit = on_a_fit_host(goodput_mbit, f"{rate} Mbit/s within 90-100 %")
    goodput = fit.value
    print(f"iperf3 4 streams through {rate} Mbit/s: {goodput:.1f} Mbit/s")
    assert 0.90 * rate <= goodput <= 1.0 * rate, fit.explain(
        f"{goodput:.1f} Mbit/s through {rate} Mbit/s"
    )

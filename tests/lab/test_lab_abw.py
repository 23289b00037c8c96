"""The abw probe in the lab against ground truth: the bottleneck is a delay line's rate (its
serialisation is exact), the cross traffic the lab's UDP generator, whose rate at the
bottleneck is read from the delay line's own byte counters over the estimates' span."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.lab.testing import LabFactory, timer_lateness_us
from iepm.probes import abw
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.results import Result
from testkit.agent import running_agent

pytestmark = pytest.mark.lab

LINK = "mon-tg"
AGENT_PORT = 8710
ESTIMATES = 6
# (capacity Mbit/s, cross traffic share): a handful across 10-200 Mbit/s and 0-70 %; the full
# sweep over 10-500 Mbit/s, with the accuracy goal, is benchmarks/abw.py.
PATHS = [(10, 0.7), (100, 0.0), (100, 0.5), (200, 0.3)]
# The method resolves a 120 µs wait (abwtool.NOISE_FLOOR_NS). A host that wakes the delay line
# later than that for more than this share of its wake-ups (a busy hypervisor) emulates a busy
# link: with a third of each CPU's time taken in 1 ms slices by a SCHED_FIFO task above the
# delay line, estimates on an idle 100 Mbit/s path read 43-77 Mbit/s with quality 0.6-0.92.
# An estimate taken then is taken again.
HOST_LATE_SHARE = 0.02
RETAKES = 4
LATE_HOST: list[str] = []
# Per estimate (by result id): the timer meter's share of late wake-ups before/after each try,
# for the failure messages of the assertions that depend on the delay line's timing.
TIMER: dict[str, list[tuple[float, float]]] = {}


def topology(rate_mbit: float, cross_mbit: float) -> dict[str, Any]:
    topo: dict[str, Any] = {
        "lab": {"name": "abw", "seed": 13},
        "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tg", "role": "target"}],
        # One link, one delay line: the bottleneck where the truth is known.
        "links": [{"a": "mon", "b": "tg", "delay_ms": 2.0, "rate_mbit": rate_mbit}],
    }
    if cross_mbit > 0:
        topo["traffic"] = [{"src": "mon", "dst": "tg", "protocol": "udp", "rate_mbit": cross_mbit}]
    return topo


def delivered_bytes(lab: Lab) -> int:
    # The delay line's control socket may time out while it forwards a burst: ask again.
    for _ in range(50):
        with contextlib.suppress(Exception):
            return int(lab.link_state(LINK)["ab"]["stats"]["bytes_delivered"])
        time.sleep(0.05)
    raise AssertionError(f"the delay line of {LINK} does not answer")


@contextlib.contextmanager
def path_with_agent(factory: LabFactory, rate_mbit: float, share: float) -> Iterator[Lab]:
    lab = factory(topology(rate_mbit, rate_mbit * share), prefix="abw")
    lab.wait_reachable("mon")
    base = Path(tempfile.mkdtemp(prefix="iepm-abw-", dir="/var/tmp"))
    try:
        with running_agent(
            base, address=lab.address("tg"), port=AGENT_PORT, netns=lab.netns("tg"), kinds=("abw",)
        ) as agent:
            access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
            lab.ctx = ProbeContext(  # type: ignore[attr-defined]
                target="tg",
                address=lab.address("tg"),
                monitor="mon1",
                netns=lab.netns("mon"),
                servers=server_source(access),
            )
            yield lab
    finally:
        shutil.rmtree(base, ignore_errors=True)


def estimates(lab: Lab, count: int) -> tuple[list[Result], float]:
    """``count`` estimates and the cross traffic's rate over their span (bit/s at IP level:
    what the bottleneck carried less the probes' own bytes)."""
    ctx: ProbeContext = lab.ctx  # type: ignore[attr-defined]
    b0, t0 = delivered_bytes(lab), time.monotonic()
    results = [
        on_a_timely_host(lambda: asyncio.run(abw.run(abw.Spec(), ctx))) for _ in range(count)
    ]
    b1, t1 = delivered_bytes(lab), time.monotonic()
    ours = sum(r.data.get("probe_bytes", 0) for r in results)
    for r in results:
        assert r.succeeded, f"{r.error}\n{r.diags[-1500:]}"
    return results, max(0.0, (b1 - b0 - ours) * 8 / (t1 - t0))


def on_a_timely_host(estimate: Callable[[], Result]) -> Result:
    """An estimate taken while the host woke the delay line on time, before and after it (the
    timer meter: iepm.lab.testing.timer_lateness_us); else taken again, up to RETAKES times,
    and the last one kept with the meter's readings in LATE_HOST for the assertions to show."""
    meters = []
    for _ in range(RETAKES + 1):
        before = timer_lateness_us(0.3)
        result = estimate()
        after = timer_lateness_us(0.3)
        meters.append((round(before["late_share"], 3), round(after["late_share"], 3)))
        TIMER[result.id] = list(meters)
        if max(meters[-1]) <= HOST_LATE_SHARE:
            return result
    LATE_HOST.append(
        f"estimate taken on a host late for the 120 µs resolution: share of late wake-ups "
        f"before/after each try {meters} (allowed {HOST_LATE_SHARE})"
    )
    return result


def test_estimates_keep_their_budget_read_the_capacity_and_fall_with_cross_traffic(
    lab_factory: LabFactory,
) -> None:
    """What the estimator holds on every lab path within the lab's timing resolution (up to
    200 Mbit/s; see README "Available bandwidth"): each estimate within 100 kB and 1 s, the
    capacity within 10 %, the estimate between 0 and the capacity, and more cross traffic
    reading lower. The issue's accuracy goal (median error 10 %, P90 25 % over 10-500 Mbit/s
    and 0-70 % cross) is NOT met here: benchmarks/abw.py measures it and says so."""
    medians = {}
    for rate_mbit, share in PATHS:
        with path_with_agent(lab_factory, rate_mbit, share) as lab:
            if share:
                wait_for_cross_traffic(lab)
            results, cross_bps = estimates(lab, ESTIMATES)
            lab.down()
        configured = rate_mbit * share * 1e6
        # The generator delivers what it was asked for (UDP payload rate + 28 header bytes per
        # ~1448-byte datagram), else the truth below would be the generator's failure.
        assert cross_bps == pytest.approx(configured * 1476 / 1448, rel=0.1, abs=0.3e6)
        truth_bps = rate_mbit * 1e6 - cross_bps
        for r in results:
            d = r.data
            # The host's timer figures: the capacity and estimate read the delay line's timing.
            host = f"host timer late share before/after each try: {TIMER.get(r.id)}; {LATE_HOST}"
            assert d["probe_bytes"] <= 100_000 and d["estimate_s"] <= 1.0, (d, host)
            assert d["capacity_bps"] == pytest.approx(rate_mbit * 1e6, rel=0.1), (d, host)
            assert 0 <= d["available_bps"] <= d["capacity_bps"] * 1.05, (d, host)
        medians[(rate_mbit, share)] = statistics.median(r.data["available_bps"] for r in results)
        print(
            f"C {rate_mbit} Mbit/s, cross {cross_bps / 1e6:.1f} Mbit/s, A {truth_bps / 1e6:.1f}: "
            f"estimates {[round(r.data['available_bps'] / 1e6, 1) for r in results]}, "
            f"capacity {[round(r.data['capacity_bps'] / 1e6, 1) for r in results]}, "
            f"quality {[r.data['quality'] for r in results]}"
        )
    # Same capacity, half of it taken by cross traffic: the estimate reads at least a quarter
    # of the capacity lower (the truth: half).
    assert medians[(100, 0.5)] <= medians[(100, 0.0)] - 25e6, (medians, LATE_HOST)


def wait_for_cross_traffic(lab: Lab, timeout_s: float = 30.0) -> None:
    """Until the generator's traffic crosses the bottleneck (its client starts after the lab)."""
    deadline = time.monotonic() + timeout_s
    first = delivered_bytes(lab)
    while delivered_bytes(lab) - first < 100_000:
        assert time.monotonic() < deadline, "the cross-traffic generator sent nothing"
        time.sleep(0.1)


def test_a_rate_step_shows_within_two_estimates(lab_factory: LabFactory) -> None:
    with path_with_agent(lab_factory, 100, 0.0) as lab:
        before, _ = estimates(lab, 3)
        lab.set_link(LINK, rate_mbit=40)
        after, _ = estimates(lab, 2)
    level = statistics.median(r.data["available_bps"] for r in before)
    assert level == pytest.approx(100e6, rel=0.2), (
        [r.data["available_bps"] for r in before],
        LATE_HOST,
    )
    # Within two estimates the step is seen: both read well below the old level, and one
    # reads the new rate (a single estimate on a loaded host may still be off by a quarter).
    readings = [r.data["available_bps"] for r in after]
    assert all(v < 0.7 * level for v in readings), (readings, LATE_HOST)
    assert any(v == pytest.approx(40e6, rel=0.25) for v in readings), (readings, LATE_HOST)

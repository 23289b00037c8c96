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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import abw
from iepm.probes.base import ProbeContext
from iepm.results import Result
from testkit.agent import running_agent
from testkit.copylab import agent_context
from testkit.fitness import Fit, on_a_fit_host

# Every figure here reads the delay line's timing (its serialisation at 120 µs resolution).
pytestmark = [pytest.mark.lab, pytest.mark.timing]

LINK = "mon-tg"
AGENT_PORT = 8710
# Estimates per path: the fewest whose median holds each behaviour below. The sweep over
# 10-500 Mbit/s and 0-70 % cross traffic, with the share of estimates within budget, capacity
# and range per path and the accuracy goal, is benchmarks/abw.py.
ESTIMATES = 3
RATE = 100  # Mbit/s: the idle path, the one with half of it taken, and the one stepped down
CROSS_SHARE = 0.5
STEP_TO = 40


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
            lab.ctx = agent_context(  # type: ignore[attr-defined]
                agent, "tg", lab.address("tg"), lab.netns("mon")
            )
            yield lab
    finally:
        shutil.rmtree(base, ignore_errors=True)


def estimates(lab: Lab, count: int) -> tuple[list[Fit[Result]], float]:
    """``count`` estimates, each taken while the host woke the delay line on time
    (testkit.fitness: else taken again, or the test skipped), and the cross traffic's rate over
    their span (bit/s at IP level: what the bottleneck carried less the probes' own bytes)."""
    ctx: ProbeContext = lab.ctx  # type: ignore[attr-defined]
    taken: list[Result] = []  # the estimates retaken too: their probes crossed the bottleneck

    def estimate() -> Result:
        taken.append(asyncio.run(abw.run(abw.Spec(), ctx)))
        return taken[-1]

    what = f"an available-bandwidth estimate at 120 µs resolution ({lab.name})"
    b0, t0 = delivered_bytes(lab), time.monotonic()
    fits = [on_a_fit_host(estimate, what) for _ in range(count)]
    b1, t1 = delivered_bytes(lab), time.monotonic()
    ours = sum(r.data.get("probe_bytes", 0) for r in taken)
    for f in fits:
        assert f.value.succeeded, f.explain(f"{f.value.error}\n{f.value.diags[-1500:]}")
    return fits, max(0.0, (b1 - b0 - ours) * 8 / (t1 - t0))


def hosts(fits: list[Fit[Result]]) -> str:
    return " | ".join(f.host for f in fits)


def show(rate_mbit: float, cross_bps: float, fits: list[Fit[Result]]) -> None:
    data = [f.value.data for f in fits]
    print(
        f"C {rate_mbit} Mbit/s, cross {cross_bps / 1e6:.1f} Mbit/s: "
        f"estimates {[round(d['available_bps'] / 1e6, 1) for d in data]}, "
        f"capacity {[round(d['capacity_bps'] / 1e6, 1) for d in data]}, "
        f"quality {[d['quality'] for d in data]}"
    )


@pytest.fixture(scope="module")
def idle_path(module_lab_factory: LabFactory) -> Iterator[Lab]:
    with path_with_agent(module_lab_factory, RATE, 0.0) as lab:
        yield lab


@pytest.fixture(scope="module")
def idle_estimates(idle_path: Lab) -> list[Fit[Result]]:
    """The idle path's estimates, taken once: what the estimator reads without cross traffic
    and the level a rate step starts from."""
    fits, cross_bps = estimates(idle_path, ESTIMATES)
    show(RATE, cross_bps, fits)
    return fits


def test_estimates_keep_their_budget_read_the_capacity_and_fall_with_cross_traffic(
    lab_factory: LabFactory, idle_estimates: list[Fit[Result]]
) -> None:
    """What the estimator holds within the lab's timing resolution (see README "Available
    bandwidth"), on a 100 Mbit/s path idle and with half of it taken: each estimate within
    100 kB and 1 s, the capacity within 10 %, the estimate between 0 and the capacity, and more
    cross traffic reading lower. The same over 10-500 Mbit/s and 0-70 % cross traffic (per path:
    ``within_budget``, ``capacity_within_10pct``, ``in_range``) and the issue's accuracy goal
    (median error 10 %, P90 25 %), which is NOT met here, are benchmarks/abw.py's."""
    with path_with_agent(lab_factory, RATE, CROSS_SHARE) as lab:
        wait_for_cross_traffic(lab)
        loaded, cross_bps = estimates(lab, ESTIMATES)
    show(RATE, cross_bps, loaded)
    configured = RATE * CROSS_SHARE * 1e6
    # The generator delivers what it was asked for (UDP payload rate + 28 header bytes per
    # ~1448-byte datagram), else the truth below would be the generator's failure.
    assert cross_bps == pytest.approx(configured * 1476 / 1448, rel=0.1, abs=0.3e6)
    for f in [*idle_estimates, *loaded]:
        d = f.value.data
        assert d["probe_bytes"] <= 100_000 and d["estimate_s"] <= 1.0, f.explain(d)
        # The capacity and the estimate read the delay line's timing.
        assert d["capacity_bps"] == pytest.approx(RATE * 1e6, rel=0.1), f.explain(d)
        assert 0 <= d["available_bps"] <= d["capacity_bps"] * 1.05, f.explain(d)
    idle = statistics.median(f.value.data["available_bps"] for f in idle_estimates)
    busy = statistics.median(f.value.data["available_bps"] for f in loaded)
    # Same capacity, half of it taken by cross traffic: the estimate reads at least a quarter
    # of the capacity lower (the truth: half).
    assert busy <= idle - 25e6, (idle, busy, hosts([*idle_estimates, *loaded]))


def wait_for_cross_traffic(lab: Lab, timeout_s: float = 30.0) -> None:
    """Until the generator's traffic crosses the bottleneck (its client starts after the lab)."""
    deadline = time.monotonic() + timeout_s
    first = delivered_bytes(lab)
    while delivered_bytes(lab) - first < 100_000:
        assert time.monotonic() < deadline, "the cross-traffic generator sent nothing"
        time.sleep(0.1)


def test_a_rate_step_shows_within_two_estimates(
    idle_path: Lab, idle_estimates: list[Fit[Result]]
) -> None:
    before = [f.value.data["available_bps"] for f in idle_estimates]
    level = statistics.median(before)
    assert level == pytest.approx(RATE * 1e6, rel=0.2), (before, hosts(idle_estimates))
    idle_path.set_link(LINK, rate_mbit=STEP_TO)
    try:
        after, _ = estimates(idle_path, 2)
    finally:
        idle_path.set_link(LINK, rate_mbit=RATE)
    # Within two estimates the step is seen: both read well below the old level, and one
    # reads the new rate (a single estimate on a loaded host may still be off by a quarter).
    readings = [f.value.data["available_bps"] for f in after]
    assert all(v < 0.7 * level for v in readings), (readings, hosts(after))
    assert any(v == pytest.approx(STEP_TO * 1e6, rel=0.25) for v in readings), (
        readings,
        hosts(after),
    )

"""iperf3's routine early stop on a lab path, as the scheduler runs it: through the target's
agent (a one-shot server leased per run), into the raw log, stored as a successful
early-stopped result. Against an ordinary full run on the same path right after, the early
result's throughput is within 10% with at most half the bytes; the raw log re-extracts to the
same results.

One path and one pair: another (at most three in all) only if the first did not stop early
within 10% of its full run on at most half the bytes, as one pair in ten or so does not (a busy
moment of the cores, a late stop). The study over several paths and pairs (share of agreement
>= 0.9, mean bytes share <= 0.5, per path) is ``benchmarks/early_stop.py --mode routine
--path-set suite --runs-per-path 4`` (keys ``pooled.within_10pct_share``,
``pooled.early_stopped_share``, ``pooled.traffic_share_mean_over_paths``, ``per_path.*``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.extract import extract
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import iperf3
from iepm.rawlog import RawLog
from iepm.results import Result
from iepm.store import Archive
from testkit.agent import RunningAgent, running_agent
from testkit.copylab import agent_context

# Timing: the early estimate against a full run's throughput through the delay line.
pytestmark = [pytest.mark.lab, pytest.mark.timing]

# The middle path of benchmarks/early_stop.py's suite set (one-way delay ms, rate Mbit/s): its
# delay line is lighter on the cores than the 100 Mbit/s one's.
NAME, DELAY_MS, RATE_MBIT = "mid", 20, 50
TOPOLOGY = {
    "lab": {"name": "x", "seed": 23},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": NAME, "role": "target"}],
    "links": [
        {"a": "mon", "b": NAME, "delay_ms": DELAY_MS, "rate_mbit": RATE_MBIT, "queue_ms": 50}
    ],
}
MAX_PAIRS = 3


@pytest.fixture
def lab(lab_factory: LabFactory) -> Lab:
    return lab_factory(TOPOLOGY, prefix="early")


@pytest.fixture
def agent(lab: Lab, tmp_path: Path) -> Iterator[RunningAgent]:
    with running_agent(
        tmp_path / "agent", address=lab.address(NAME), port=8720, netns=lab.netns(NAME)
    ) as running:
        yield running


def within(a: float, b: float, tolerance: float = 0.1) -> bool:
    return abs(a - b) <= tolerance * b


def test_routine_early_stop_agrees_with_a_full_run_on_half_the_bytes(
    lab: Lab, agent: RunningAgent, tmp_path: Path
) -> None:
    log = RawLog(tmp_path / "raw")
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    ctx = agent_context(agent, NAME, lab.address(NAME), lab.netns("mon"), raw_log=log)
    pairs: list[tuple[Result, Result]] = []
    lines = []
    with Archive.open(url) as archive:
        for _ in range(MAX_PAIRS):
            early = asyncio.run(iperf3.run(iperf3.Spec(early_stop=True), ctx))
            full = asyncio.run(iperf3.run(iperf3.Spec(), ctx))
            assert early.succeeded, f"{early.error}\n{early.diags[-1500:]}"
            assert full.succeeded, f"{full.error}\n{full.diags[-1500:]}"
            archive.add(early)
            archive.add(full)
            pairs.append((early, full))
            e, f = early.data, full.data
            lines.append(
                f"{NAME} ({2 * DELAY_MS} ms RTT, {RATE_MBIT} Mbit/s): early "
                f"{e['throughput_bps'] / 1e6:.1f} Mbit/s (stopped after {e['stopped_after_s']} s), "
                f"full {f['throughput_bps'] / 1e6:.1f} Mbit/s, bytes "
                f"{e['bytes_sent'] / f['bytes_sent']:.2f} of the full run's"
            )
            agrees = within(e["throughput_bps"], f["throughput_bps"])
            if e["early_stopped"] and agrees and e["bytes_sent"] <= 0.5 * f["bytes_sent"]:
                break
    print("\n" + "\n".join(lines))
    for early, _ in pairs:
        d = early.data
        assert early.params["early_stop"] is True
        if d["early_stopped"]:
            assert d["bytes_saved"] > 0 and d["measured_throughput_bps"] > 0
            assert 0 < d["stopped_after_s"] < 10
    early, full = pairs[-1]
    assert early.data["early_stopped"], lines
    assert within(early.data["throughput_bps"], full.data["throughput_bps"]), lines
    assert early.data["bytes_sent"] / full.data["bytes_sent"] <= 0.5, lines

    # The raw log re-extracts to the stored results, the early-stopped ones included.
    counts = extract(log, url, monitor="mon1")
    assert counts["updated"] == 2 * len(pairs) and counts["failed"] == 0, counts
    with Archive.open(url) as archive:
        stored = {r.id: r for r in archive.results(probe="iperf3")}
    for result in (r for pair in pairs for r in pair):
        again = stored[result.id]
        assert again.data["throughput_bps"] == pytest.approx(result.data["throughput_bps"])
        assert again.data.get("early_stopped") == result.data.get("early_stopped")

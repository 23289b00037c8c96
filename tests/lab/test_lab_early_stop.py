"""iperf3's routine early stop on lab paths of different RTT and rate, as the scheduler runs it:
through each target's agent (a one-shot server leased per run), into the raw log, stored as a
successful early-stopped result. Against an ordinary full run on the same path right after,
the early result's throughput is within 10% in at least 90% of the cases, with at most half
the bytes (mean over the paths); the raw log re-extracts to the same results. Per-path figures
are printed (``pytest -s``)."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from iepm.config import AgentAccess
from iepm.extract import extract
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.rawlog import RawLog
from iepm.remote.lease import server_source
from iepm.results import Result
from iepm.store import Archive
from testkit.agent import RunningAgent, running_agent

pytestmark = pytest.mark.lab

# name: (one-way delay ms, rate Mbit/s). Rates stay modest: the delay lines share two busy cores.
PATHS = {"near": (5, 100), "mid": (20, 50), "far": (60, 30)}
PAIRS_PER_PATH = 4
TOPOLOGY = {
    "lab": {"name": "x", "seed": 23},
    "hosts": [{"name": "mon", "role": "monitor"}]
    + [{"name": name, "role": "target"} for name in PATHS],
    "links": [
        {"a": "mon", "b": name, "delay_ms": delay, "rate_mbit": rate, "queue_ms": 50}
        for name, (delay, rate) in PATHS.items()
    ],
}


@pytest.fixture
def lab(lab_factory: LabFactory) -> Lab:
    return lab_factory(TOPOLOGY, prefix="early")


@pytest.fixture
def agents(lab: Lab) -> Iterator[dict[str, RunningAgent]]:
    base = Path(tempfile.mkdtemp(prefix="iepm-early-"))
    try:
        with ExitStack() as stack:
            yield {
                name: stack.enter_context(
                    running_agent(
                        base / name, address=lab.address(name), port=8720, netns=lab.netns(name)
                    )
                )
                for name in PATHS
            }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def within(a: float, b: float, tolerance: float = 0.1) -> bool:
    return abs(a - b) <= tolerance * b


def test_routine_early_stop_agrees_with_full_runs_on_half_the_bytes(
    lab: Lab, agents: dict[str, RunningAgent], tmp_path: Path
) -> None:
    log = RawLog(tmp_path / "raw")
    url = f"sqlite:///{tmp_path / 'archive.db'}"
    pairs: dict[str, list[tuple[Result, Result]]] = {name: [] for name in PATHS}
    with Archive.open(url) as archive:
        for name, agent in agents.items():
            access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
            ctx = ProbeContext(
                target=name,
                address=lab.address(name),
                monitor="mon1",
                netns=lab.netns("mon"),
                raw_log=log,
                servers=server_source(access),
            )
            for _ in range(PAIRS_PER_PATH):
                early = asyncio.run(iperf3.run(iperf3.Spec(early_stop=True), ctx))
                full = asyncio.run(iperf3.run(iperf3.Spec(), ctx))
                assert early.succeeded, f"{early.error}\n{early.diags[-1500:]}"
                assert full.succeeded, f"{full.error}\n{full.diags[-1500:]}"
                archive.add(early)
                archive.add(full)
                pairs[name].append((early, full))

    lines, agree, total, shares = [], 0, 0, {}
    for name, runs in pairs.items():
        ok = sum(within(e.data["throughput_bps"], f.data["throughput_bps"]) for e, f in runs)
        share = statistics.fmean(e.data["bytes_sent"] / f.data["bytes_sent"] for e, f in runs)
        agree, total, shares[name] = agree + ok, total + len(runs), share
        delay, rate = PATHS[name]
        stops = [e.data["stopped_after_s"] or 10.0 for e, _ in runs]
        lines.append(
            f"{name} ({2 * delay} ms RTT, {rate} Mbit/s): within 10% {ok}/{len(runs)}, "
            f"bytes {share:.2f} of the full run's, stopped after {statistics.median(stops):.1f} s, "
            + ", ".join(
                f"{e.data['throughput_bps'] / 1e6:.1f}/{f.data['throughput_bps'] / 1e6:.1f}"
                for e, f in runs
            )
            + " Mbit/s early/full"
        )
    print("\n" + "\n".join(lines))
    for early, _ in (p for runs in pairs.values() for p in runs):
        d = early.data
        assert early.params["early_stop"] is True
        if d["early_stopped"]:
            assert d["bytes_saved"] > 0 and d["measured_throughput_bps"] > 0
            assert 0 < d["stopped_after_s"] < 10
    stopped = sum(e.data["early_stopped"] for runs in pairs.values() for e, _ in runs)
    assert stopped >= 0.9 * total, lines
    assert agree >= 0.9 * total, lines
    # The goal is over the paths (the study's figure): their mean share; each path's is printed.
    assert statistics.fmean(shares.values()) <= 0.5, lines

    # The raw log re-extracts to the stored results, early-stopped ones included.
    counts = extract(log, url, monitor="mon1")
    assert counts["updated"] == 2 * total and counts["failed"] == 0, counts
    with Archive.open(url) as archive:
        stored = {r.id: r for r in archive.results(probe="iperf3")}
    for early, _ in (p for runs in pairs.values() for p in runs):
        again = stored[early.id]
        assert again.data["throughput_bps"] == pytest.approx(early.data["throughput_bps"])
        assert again.data["early_stopped"] == early.data["early_stopped"]

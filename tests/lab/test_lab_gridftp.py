"""GridFTP in the lab against ground truth: a globus-url-copy memory-to-memory copy through the
target's agent against tuned iperf3 on the same path (goal: at least 90%), and a disk-to-disk
copy onto a target whose disk is slower than its network, which — the server having no commit
at the end — reports the page cache's rate, far above the disk's (a plain dd's) on the same
file system."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import gridftp_disk, gridftp_mem, iperf3
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.agent import RunningAgent, running_agent
from testkit.copylab import (
    FLOORS,
    agent_context,
    comparison_table,
    lab_agent,
    seed_comparison,
)
from testkit.net import wait_until
from testkit.slowdisk import slow_disk

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        shutil.which("globus-gridftp-server") is None or shutil.which("globus-url-copy") is None,
        reason="globus-gridftp-server-progs / globus-gass-copy-progs missing",
    ),
]

RATE_MBIT = 200
TOPOLOGY = {
    "lab": {"name": "gftp", "seed": 13},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tx", "role": "target"}],
    # The same path as tests/lab/test_lab_transfers.py: 200 Mbit/s, 10 ms RTT.
    "links": [{"a": "mon", "b": "tx", "delay_ms": 5.0, "rate_mbit": RATE_MBIT}],
}
AGENT_PORT = 8701


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    return module_lab_factory(TOPOLOGY, prefix="gf")


@pytest.fixture(scope="module")
def agent(lab: Lab) -> Iterator[RunningAgent]:
    with lab_agent(lab, "tx", AGENT_PORT, ("iperf3", "gridftp"), "gf") as running:
        yield running


def context(lab: Lab, agent: RunningAgent) -> ProbeContext:
    return agent_context(agent, "tx", lab.address("tx"), lab.netns("mon"))


@pytest.mark.timing
def test_gridftp_memory_copy_against_tuned_iperf3(lab: Lab, agent: RunningAgent) -> None:
    ctx = context(lab, agent)
    tuned = iperf3.Spec(duration_s=4, omit_s=1, streams=4, window="1M")
    # ~4 s of the path's rate, 4 streams and a 1M window as iperf3's.
    copy = gridftp_mem.Spec(size="96M", streams=4, window="1M", duration_s=25)
    ratios = []
    for _ in range(3):
        reference = asyncio.run(iperf3.run(tuned, ctx))
        assert reference.succeeded, reference.error
        result = asyncio.run(gridftp_mem.run(copy, ctx))
        # The diags without -dbg's two lines per data block: the control channel's dialogue.
        shown = [ln for ln in result.diags.splitlines() if "buffer 0x" not in ln]
        assert result.succeeded, f"{result.error}\n" + "\n".join(shown)[-6000:]
        ratio = result.data["throughput_bps"] / reference.data["throughput_bps"]
        ratios.append(ratio)
        print(
            f"path mon->tx {RATE_MBIT} Mbit/s 10 ms RTT: iperf3 "
            f"{reference.data['throughput_bps'] / 1e6:.1f} Mbit/s, gridftp memory copy "
            f"{result.data['throughput_bps'] / 1e6:.1f} Mbit/s over the transfer "
            f"(globus-url-copy says {result.data['tool_throughput_bps'] / 1e6:.1f}; "
            f"{result.data['end_to_end_throughput_bps'] / 1e6:.1f} end to end, setup "
            f"{result.data['setup_s']:.3f} s): ratio {ratio:.3f}"
        )
        # The tool's own figure (the server's markers) and ours measure the same transfer.
        assert result.data["tool_throughput_bps"] == pytest.approx(
            result.data["throughput_bps"], rel=0.15
        )
        if ratio >= 0.9:
            break  # else another pair: the first may have met a busy moment of the cores
    assert max(ratios) >= 0.9, ratios
    # The slot ends with the copy: no server, no file.
    memory = Path(agent.dir) / "state" / "work"
    assert wait_until(lambda: not list(memory.glob("*")), 10.0)


# bytes/s, the loop device's write throttle (as tests/lab/test_lab_transfers.py).
DISK_RATE = 4 * 1024**2
COPY_MB = 16  # the dd and the copy: ~4 s at DISK_RATE


# Not timing: on a busy host dd only reads lower under the throttle, and the cache's rate stays
# hundreds of times the disk's.
def test_gridftp_disk_copy_reports_the_page_cache_rate_not_the_disks(tmp_path: Path) -> None:
    """GridFTP cannot commit at the end (the server closes without a sync): the disk copy's
    rate is the cache's, many times the disk's proven by dd on the same file system."""
    with (
        slow_disk(DISK_RATE) as disk,
        running_agent(disk.mount / "agent", kinds=("gridftp",)) as ag,
    ):
        for path in (disk.mount / "agent", disk.mount / "agent" / "state"):
            path.chmod(0o755)
        disk_bps = disk.dd_rate(COPY_MB << 20, "conv=fsync") * 8
        access = AgentAccess(url=ag.url, credential_file=str(ag.token_file("mon1")))
        ctx = ProbeContext(target="slow", address="127.0.0.1", servers=server_source(access))
        spec = gridftp_disk.Spec(
            size=f"{COPY_MB}M", streams=2, duration_s=30, source_dir=str(tmp_path)
        )
        result = asyncio.run(gridftp_disk.run(spec, ctx))
        assert result.succeeded, f"{result.error}\n{result.diags[-2000:]}"
        cache = result.data["throughput_bps"]
        # A copy shorter than the server's first performance marker may get no -vb line.
        tool = result.data["tool_throughput_bps"]
        print(
            f"disk (dd conv=fsync) {disk_bps / 1e6:.1f} Mbit/s; gridftp_disk {COPY_MB}M (commit "
            f"none: the server cannot) {cache / 1e6:.1f} Mbit/s over the transfer (globus-url-copy "
            f"says {'-' if tool is None else f'{tool / 1e6:.1f}'}), close "
            f"{result.data['commit_s']:.3f} s"
        )
        assert disk_bps <= DISK_RATE * 8 * 1.1  # the throttle holds
        assert cache > 2 * disk_bps
        # Removing the copy waits for the write-back under way (16M at 4 MiB/s: up to 4 s).
        assert wait_until(lambda: not list((ag.dir / "state" / "work").glob("*")), 40.0)


# --- the seed's comparison: iperf3 against each copy tool, on one path --------------------------

# The near path of benchmarks/seed_compare.py (which adds a 40 ms one and prints the table) is
# this module's lab path: the comparison runs on it, with agents of its own.
SEED_PATHS = {"tx": (5.0, RATE_MBIT)}
# Each run about this long: long enough for TCP to leave slow start on a 10 ms RTT.
SEED_SECONDS = 2


@pytest.mark.timing
@pytest.mark.skipif(
    shutil.which("xrootd") is None or shutil.which("rsync") is None,
    reason="xrootd-server or rsync missing",
)
def test_seed_comparison_iperf3_against_each_copy_tool_per_path(lab: Lab, tmp_path: Path) -> None:
    """IEPM-BW's Fig. 8 as a table, on one lab path: tuned iperf3 and a memory-to-memory copy
    by each tool (xrdcp and GridFTP through the target's agent, rsync over SSH to a private
    sshd there) all succeed, and each copy reaches its floor of iperf3; the table (ratios, CPU
    per GB, load) is printed. The figures over several paths: benchmarks/seed_compare.py."""
    rows = seed_comparison(lab, SEED_PATHS, tmp_path, AGENT_PORT + 1, seconds=SEED_SECONDS)
    print("\n" + comparison_table(rows))
    assert {r.tool for r in rows} == {"iperf3", *FLOORS}
    for r in rows:
        if r.tool != "iperf3":
            assert r.ratio >= FLOORS[r.tool], (r.path, r.tool, r.how, r.ratio)


def context_for(lab: Lab, agent: RunningAgent, target: str) -> ProbeContext:
    return agent_context(agent, target, lab.address(target), lab.netns("mon"))

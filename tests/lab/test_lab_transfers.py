"""Application transfers in the lab against ground truth: an xrdcp memory-to-memory copy through
the target's agent reaches at least 90% of what tuned iperf3 reaches on the same path (an rsync
copy over parallel SSH connections to a private sshd there is measured against iperf3); on a
target whose disk is slower than its network, a disk copy committed at the end reports the
disk's rate (a plain dd's) and one not committed the page cache's."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from iepm.config import AgentAccess
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.probes import iperf3, rsync_disk, rsync_mem, xrdcp_disk, xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.agent import RunningAgent, running_agent
from testkit.copylab import agent_context, lab_agent
from testkit.net import free_port, wait_until
from testkit.slowdisk import SlowDisk, slow_disk
from testkit.sshd import private_sshd

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(shutil.which("xrootd") is None, reason="xrootd-server missing"),
]

RATE_MBIT = 200
TOPOLOGY = {
    "lab": {"name": "xfer", "seed": 12},
    "hosts": [{"name": "mon", "role": "monitor"}, {"name": "tx", "role": "target"}],
    # One delay line per direction: 200 Mbit/s stays cheap on two busy cores.
    "links": [{"a": "mon", "b": "tx", "delay_ms": 5.0, "rate_mbit": RATE_MBIT}],
}
AGENT_PORT = 8700


@pytest.fixture(scope="module")
def lab(module_lab_factory: LabFactory) -> Lab:
    return module_lab_factory(TOPOLOGY, prefix="xf")


@pytest.fixture(scope="module")
def agent(lab: Lab) -> Iterator[RunningAgent]:
    with lab_agent(lab, "tx", AGENT_PORT, ("iperf3", "xrootd"), "xf") as running:
        yield running


def context(lab: Lab, agent: RunningAgent) -> ProbeContext:
    return agent_context(agent, "tx", lab.address("tx"), lab.netns("mon"))


@pytest.mark.timing
def test_memory_copy_reaches_90_percent_of_tuned_iperf3(lab: Lab, agent: RunningAgent) -> None:
    ctx = context(lab, agent)
    tuned = iperf3.Spec(duration_s=4, omit_s=1, streams=4, window="1M")
    # ~4 s of the path's rate, so that set-up and slow start weigh as little as in iperf3's
    # (slow start is over in a few 10 ms RTTs); plain writes: the page checksums' CPU falls
    # behind on two busy cores (README).
    copy = xrdcp_mem.Spec(size="96M", streams=4, duration_s=25, page_checksums=False)
    ratios = []
    for _ in range(2):
        reference = asyncio.run(iperf3.run(tuned, ctx))
        assert reference.succeeded, reference.error
        result = asyncio.run(xrdcp_mem.run(copy, ctx))
        assert result.succeeded, f"{result.error}\n{result.diags[-2000:]}"
        ratio = result.data["throughput_bps"] / reference.data["throughput_bps"]
        ratios.append(ratio)
        print(
            f"path mon->tx {RATE_MBIT} Mbit/s 10 ms RTT: iperf3 "
            f"{reference.data['throughput_bps'] / 1e6:.1f} Mbit/s, xrdcp memory copy "
            f"{result.data['throughput_bps'] / 1e6:.1f} Mbit/s over the transfer "
            f"({result.data['end_to_end_throughput_bps'] / 1e6:.1f} end to end, setup "
            f"{result.data['setup_s']:.3f} s): ratio {ratio:.3f}"
        )
        if ratio >= 0.9:
            break  # else a second pair: the first may have met a busy moment of the cores
    assert max(ratios) >= 0.9, ratios
    # The slot ends with the copy: no server, no file.
    assert wait_until(lambda: not list((Path(agent.dir) / "state" / "work").glob("*")), 10.0)


# What an SSH copy must reach of tuned iperf3 here to count as working: a floor that catches a
# broken copy (a stalled stream, a mis-read timer, a part lost), not the load of two cores
# shared with other suites; the ratios measured, with the load, are in the README ("Copies
# over SSH").
SSH_COPY_FLOOR = 0.4


@pytest.mark.timing
@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync missing")
def test_ssh_memory_copy_over_parallel_connections_against_tuned_iperf3(
    lab: Lab, agent: RunningAgent, tmp_path: Path
) -> None:
    """rsync_mem with its default streams (one rsync -e ssh per part, each its own SSH
    connection) against iperf3's four tuned streams on the same path: every byte arrives, over
    as many connections as asked (counted in the target sshd's log), at a rate near iperf3's."""
    memory = Path(tempfile.mkdtemp(prefix="iepm-xf-ssh-", dir="/dev/shm"))
    address = lab.address("tx")
    try:
        with private_sshd(
            tmp_path / "sshd", address, free_port(), lab.netns("tx"), password_auth=False
        ) as sshd:
            access = sshd.access(memory_dir=str(memory), step_timeout_s=20.0)
            over_path = ProbeContext(
                "tx", address, "mon1", netns=lab.netns("mon"), servers=server_source(access)
            )
            tuned = iperf3.Spec(duration_s=4, omit_s=1, streams=4, window="1M")
            # ~4 s of the path, as iperf3's test.
            copy = rsync_mem.Spec(size="100M", duration_s=90)
            assert copy.streams == rsync_mem.DEFAULT_STREAMS
            ratios = []
            for _ in range(3):
                reference = asyncio.run(iperf3.run(tuned, context(lab, agent)))
                assert reference.succeeded, reference.error
                before = sshd.log().count("Accepted publickey for ")
                result = asyncio.run(rsync_mem.run(copy, over_path))
                assert result.succeeded, f"{result.error}\n{result.diags[-2000:]}"
                data = result.data
                assert data["bytes"] == copy.size_bytes
                assert data["cipher"] == "aes128-gcm@openssh.com"
                assert data["streams"] == data["connections"] == copy.streams
                # The copies' connections and at least one of the lease's own.
                accepted = sshd.log().count("Accepted publickey for ") - before
                assert accepted >= copy.streams + 1, sshd.log()[-2000:]
                iperf_bps = reference.data["throughput_bps"]
                ratios.append(data["throughput_bps"] / iperf_bps)
                print(
                    f"path mon->tx {RATE_MBIT} Mbit/s 10 ms RTT: iperf3 {iperf_bps / 1e6:.1f} "
                    f"Mbit/s, rsync_mem {copy.streams} streams {data['throughput_bps'] / 1e6:.1f} "
                    f"Mbit/s over the transfer (rsync says {data['tool_throughput_bps'] / 1e6:.1f}"
                    f"; {data['end_to_end_throughput_bps'] / 1e6:.1f} end to end, setup "
                    f"{data['setup_s']:.3f} s, starts spread {data['start_spread_s']:.3f} s): "
                    f"ratio {ratios[-1]:.3f}, load {os.getloadavg()[0]:.1f}"
                )
                if ratios[-1] >= SSH_COPY_FLOOR:
                    break  # else another round: the first may have met a busy moment
            assert max(ratios) >= SSH_COPY_FLOOR, ratios
            # Each copy's directory went with its lease.
            assert wait_until(lambda: not list(memory.iterdir()), 5.0)
    finally:
        shutil.rmtree(memory, ignore_errors=True)


# --- a target whose disk is slower than its network ---------------------------------------------

# bytes/s, the loop device's write throttle: slow enough that committing dominates a copy (the
# copy into the page cache takes ~0.3 s for 32M here, committing ~8 s: the same share at any
# size).
DISK_RATE = 4 * 1024**2
COPY_MB = 16  # each dd and copy: ~4 s at DISK_RATE, long beside the copy's setup
# rsync's transfer over SSH weighs more beside its commit (0.30 s beside 4.07 s for 16M, 0.48 s
# beside 8.07 s for 32M, against a 10% tolerance): its copies stay at 32M.
RSYNC_COPY_MB = 32


@pytest.fixture(scope="module")
def slow_target() -> Iterator[tuple[SlowDisk, RunningAgent]]:
    # The agent's state directory (disk copies land there) is on the slow disk.
    with slow_disk(DISK_RATE) as disk, running_agent(disk.mount / "agent", kinds=("xrootd",)) as ag:
        for path in (disk.mount / "agent", disk.mount / "agent" / "state"):
            path.chmod(0o755)  # xrootd runs as nobody
        assert ag.proc is not None
        yield disk, ag


@pytest.mark.timing
def test_disk_copy_reports_the_disk_rate_when_committed_and_the_cache_rate_when_not(
    slow_target: tuple[SlowDisk, RunningAgent], tmp_path: Path
) -> None:
    disk, agent = slow_target
    # Ground truth, on the same file system: a plain dd that writes through
    # the page cache and syncs at the end (as the copy), just before and after the committed
    # copy. The uncommitted copy comes last: its dirty pages would be flushed by the next
    # fsync on this file system (ext4's ordered journal) and slow that one down.
    before = disk.dd_rate(COPY_MB << 20, "conv=fsync")
    access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
    ctx = ProbeContext(target="slow", address="127.0.0.1", servers=server_source(access))
    spec = xrdcp_disk.Spec(size=f"{COPY_MB}M", duration_s=30, source_dir=str(tmp_path))
    committed = asyncio.run(xrdcp_disk.run(spec, ctx))
    assert committed.succeeded, f"{committed.error}\n{committed.diags[-2000:]}"
    after = disk.dd_rate(COPY_MB << 20, "conv=fsync")
    uncommitted = asyncio.run(xrdcp_disk.run(spec.model_copy(update={"commit": "none"}), ctx))
    assert uncommitted.succeeded, uncommitted.error
    disk_bps = (before + after) / 2 * 8
    assert disk_bps <= DISK_RATE * 8 * 1.1  # the throttle holds
    got = committed.data["committed_throughput_bps"]
    cache = uncommitted.data["throughput_bps"]
    print(
        f"disk (dd conv=fsync, before/after) {before * 8e-6:.1f}/{after * 8e-6:.1f} Mbit/s; "
        f"xrdcp_disk {COPY_MB}M commit=at_end {got / 1e6:.1f} Mbit/s (transfer "
        f"{committed.data['transfer_s']:.2f} s + commit {committed.data['commit_s']:.2f} s), "
        f"commit=none {cache / 1e6:.1f} Mbit/s"
    )
    assert got == pytest.approx(disk_bps, rel=0.1)
    assert cache > 2 * disk_bps
    # Removing the uncommitted copy waits for the write-back already under way (at the disk's
    # 4 MiB/s, up to 4 s for 16M).
    assert wait_until(lambda: not list((agent.dir / "state" / "work").glob("*")), 40.0)


@pytest.mark.timing
@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync missing")
def test_rsync_disk_copy_reports_the_disk_rate_when_committed_and_the_cache_rate_when_not(
    tmp_path: Path,
) -> None:
    """The same finding over SSH: rsync's --fsync (commit = at_end) against a plain dd on the
    same slow disk, and the page cache's rate without it."""
    with (
        slow_disk(DISK_RATE) as disk,
        private_sshd(tmp_path / "sshd", "127.0.0.1", free_port(), password_auth=False) as sshd,
    ):
        work = disk.mount / "ssh"
        work.mkdir()
        access = sshd.access(work_dir=str(work), step_timeout_s=20.0)
        ctx = ProbeContext(target="slow", address="127.0.0.1", servers=server_source(access))
        before = disk.dd_rate(RSYNC_COPY_MB << 20, "conv=fsync")
        spec = rsync_disk.Spec(size=f"{RSYNC_COPY_MB}M", duration_s=60, source_dir=str(tmp_path))
        committed = asyncio.run(rsync_disk.run(spec, ctx))
        assert committed.succeeded, f"{committed.error}\n{committed.diags[-2000:]}"
        after = disk.dd_rate(RSYNC_COPY_MB << 20, "conv=fsync")
        uncommitted = asyncio.run(rsync_disk.run(spec.model_copy(update={"commit": "none"}), ctx))
        assert uncommitted.succeeded, uncommitted.error
        disk_bps = (before + after) / 2 * 8
        got = committed.data["committed_throughput_bps"]
        cache = uncommitted.data["committed_throughput_bps"]
        print(
            f"disk (dd conv=fsync, before/after) {before * 8e-6:.1f}/{after * 8e-6:.1f} Mbit/s; "
            f"rsync_disk {RSYNC_COPY_MB}M commit=at_end {got / 1e6:.1f} Mbit/s (transfer "
            f"{committed.data['transfer_s']:.2f} s + commit {committed.data['commit_s']:.2f} s), "
            f"commit=none {cache / 1e6:.1f} Mbit/s"
        )
        assert got == pytest.approx(disk_bps, rel=0.1)
        assert cache > 2 * disk_bps
        # The lease removed each copy's directory (the uncommitted one after its write-back).
        assert wait_until(lambda: not list(work.iterdir()), 40.0)


def test_a_copy_onto_a_full_disk_is_a_failed_result_and_leaves_nothing(tmp_path: Path) -> None:
    # A 64 MiB file system and a 96M copy: the server runs out of room mid-copy.
    with (
        slow_disk(1 << 30, size_mb=64) as disk,
        running_agent(disk.mount / "agent", kinds=("xrootd",)) as agent,
    ):
        for path in (disk.mount / "agent", disk.mount / "agent" / "state"):
            path.chmod(0o755)
        access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("mon1")))
        ctx = ProbeContext(target="full", address="127.0.0.1", servers=server_source(access))
        spec = xrdcp_disk.Spec(size="96M", duration_s=25, source_dir=str(tmp_path))
        result = asyncio.run(xrdcp_disk.run(spec, ctx))
        print(result.error)
        assert not result.succeeded
        assert result.error is not None and "no room for the copy" in result.error
        assert wait_until(lambda: not list((agent.dir / "state" / "work").glob("*")), 10.0)

"""The agent leases an xrootd server for one copy: the xrdcp_mem probe through a real agent on
loopback, its limits, and that neither server process nor file outlives the slot."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from iepm.config import AgentAccess
from iepm.probes import xrdcp, xrdcp_disk, xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.results import Outcome
from testkit.agent import (
    RunningAgent,
    copy_agent,
    files_under,
    running_agent,
)
from testkit.net import wait_until

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(shutil.which("xrootd") is None, reason="xrootd-server missing"),
]


@pytest.fixture(scope="module")
def memory_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="iepm-test-agent-mem-", dir="/dev/shm"))
    # An agent run as root runs xrootd as nobody, who must reach the slot directories.
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def xrootd_agent(memory_dir: Path) -> Iterator[RunningAgent]:
    with copy_agent(memory_dir, ("iperf3", "xrootd"), "xa") as agent:
        yield agent


def xrootd_children(agent: RunningAgent) -> list[psutil.Process]:
    assert agent.proc is not None
    alive = []
    for child in psutil.Process(agent.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() == "xrootd" and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def slot_files(memory_dir: Path) -> list[Path]:
    return files_under(memory_dir / "slots")


def context(agent: RunningAgent, monitor: str = "mon1") -> ProbeContext:
    access = AgentAccess(url=agent.url, credential_file=str(agent.token_file(monitor)))
    return ProbeContext(
        target="loop", address="127.0.0.1", monitor=monitor, servers=server_source(access)
    )


def test_a_memory_copy_through_the_agent_succeeds_and_leaves_nothing(
    xrootd_agent: RunningAgent, memory_dir: Path
) -> None:
    spec = xrdcp_mem.Spec(size="64M", streams=2, duration_s=20)
    result = asyncio.run(xrdcp_mem.run(spec, context(xrootd_agent)))
    assert result.succeeded, f"{result.error}\n{result.diags}"
    assert result.data["bytes"] == 64 * 1024**2
    assert result.data["connected_streams"] == 2
    assert result.data["throughput_bps"] > 0 and result.data["setup_s"] > 0
    assert "agent http://127.0.0.1" in result.diags and "slot" in result.diags
    # The slot is released when the copy ends: server and files go with it.
    assert wait_until(lambda: not xrootd_children(xrootd_agent), 10.0)
    assert wait_until(lambda: slot_files(memory_dir) == [], 10.0)


def test_a_copy_larger_than_the_agent_allows_is_refused_naming_the_limit(
    xrootd_agent: RunningAgent, memory_dir: Path
) -> None:
    # The test agent leaves max_size at its default, 1G.
    spec = xrdcp_mem.Spec(size="2G", duration_s=20)
    result = asyncio.run(xrdcp_mem.run(spec, context(xrootd_agent)))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and "max_size = 1G" in result.error
    assert xrootd_children(xrootd_agent) == [] and slot_files(memory_dir) == []


def test_a_monitor_not_allowed_xrootd_gets_a_failed_result(xrootd_agent: RunningAgent) -> None:
    result = asyncio.run(xrdcp_mem.run(xrdcp_mem.Spec(size="8M"), context(xrootd_agent, "nobody")))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and "may not run xrootd tests here" in result.error


def test_an_agent_without_its_xrootd_program_refuses_the_slot_saying_so(
    tmp_path: Path, memory_dir: Path
) -> None:
    with running_agent(
        tmp_path,
        settings={"memory_dir": str(memory_dir / "slots"), "programs": {"xrootd": "xrootd-gone"}},
        kinds=("xrootd",),
    ) as agent:
        spec = xrdcp_mem.Spec(size="8M", duration_s=10)
        result = asyncio.run(xrdcp_mem.run(spec, context(agent)))
        assert result.outcome == Outcome.FAILED
        assert result.error is not None and "'xrootd-gone' is not installed" in result.error
        assert "(Debian: apt-get install xrootd-server)" in result.error
        assert slot_files(memory_dir) == []


def disk_slot_files(agent: RunningAgent) -> list[Path]:
    work = agent.dir / "state" / "work"
    return list(work.rglob("*")) if work.exists() else []


@pytest.mark.parametrize("commit", ["at_end", "none"])
def test_a_disk_copy_through_the_agent_commits_when_asked_and_leaves_nothing(
    xrootd_agent: RunningAgent, tmp_path: Path, commit: str
) -> None:
    (tmp_path / "src").mkdir()
    spec = xrdcp_disk.Spec(
        size="16M", duration_s=20, commit=commit, source_dir=str(tmp_path / "src")
    )
    result = asyncio.run(xrdcp_disk.run(spec, context(xrootd_agent)))
    assert result.succeeded, f"{result.error}\n{result.diags}"
    assert result.data["bytes"] == 16 * 1024**2
    if commit == "at_end":
        assert result.data["sync_s"] >= 0
        assert result.data["commit_s"] >= result.data["sync_s"]
        assert 0 < result.data["committed_throughput_bps"] <= result.data["throughput_bps"]
        assert "xrdsync.py" in result.diags
    else:
        assert "sync_s" not in result.data and "xrdsync.py" not in result.diags
    # The seeded source stays for the next run; the copy on the target does not.
    assert [p.name for p in (tmp_path / "src").iterdir()] == [f"iepm-xrdcp-{16 * 1024**2}.src"]
    assert wait_until(lambda: not xrootd_children(xrootd_agent), 10.0)
    assert wait_until(lambda: disk_slot_files(xrootd_agent) == [], 10.0)


MONITOR_SCRIPT = """
import asyncio, sys
from iepm.config import AgentAccess
from iepm.probes import xrdcp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
access = AgentAccess(url=sys.argv[1], credential_file=sys.argv[2])
ctx = ProbeContext(target="loop", address="127.0.0.1", servers=server_source(access))
asyncio.run(xrdcp_mem.run(xrdcp_mem.Spec(size="1G", duration_s=8), ctx))
"""


def test_a_monitor_killed_mid_copy_leaves_nothing_on_either_side(
    xrootd_agent: RunningAgent, memory_dir: Path
) -> None:
    sources_before = {p.name for p in Path("/dev/shm").glob("iepm-xrdcp-*")}
    monitor = subprocess.Popen(
        [sys.executable, "-c", MONITOR_SCRIPT, xrootd_agent.url,
         str(xrootd_agent.token_file("mon1"))],
        start_new_session=True,
    )  # fmt: skip
    try:
        # Killed once its copy is under way: xrdcp running and the file growing on the target.
        assert wait_until(lambda: any(p.stat().st_size > 0 for p in data_files(memory_dir)), 20.0)
        copier = [p for p in psutil.Process(monitor.pid).children(recursive=True)]
        assert any(p.name() == "xrdcp" for p in copier)
        monitor.kill()
        monitor.wait(timeout=10)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=10)
    # The monitor's side: xrdcp dies with it (the runner's guardian kills its group).
    assert wait_until(lambda: not any(alive(p) for p in copier), 10.0)
    # The target's side: the agent ends the slot at its deadline (8 s + 3 s grace).
    assert wait_until(lambda: not xrootd_children(xrootd_agent), 20.0)
    assert wait_until(lambda: slot_files(memory_dir) == [], 20.0)

    # The killed monitor's sparse source (no data, no memory) goes at the next copy's start.
    # Only this monitor's sources count: another copy on this host may hold its own meanwhile.
    def own_sources() -> set[str]:
        return {p.name for p in Path("/dev/shm").glob(f"iepm-xrdcp-{monitor.pid}-*")}

    assert own_sources() - sources_before
    xrdcp.sweep_sources()
    assert not own_sources() - sources_before


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def data_files(memory_dir: Path) -> list[Path]:
    return [p for p in slot_files(memory_dir) if p.is_file() and p.suffix == ".dat"]

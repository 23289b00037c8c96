"""The agent leases a GridFTP server for one copy: gridftp_mem and gridftp_disk through a real
agent on loopback, and each failure — server missing, permission denied, disk full, a hang,
the monitor killed mid-copy — a result with its reason and nothing left on either side (no
server process, no slot file, no source, no globus-url-copy)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from iepm.config import AgentAccess
from iepm.probes import copy, gridftp_disk, gridftp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.results import Outcome, Result
from testkit.agent import (
    RunningAgent,
    copy_agent,
    files_under,
    running_agent,
)
from testkit.net import wait_until
from tests.fixtures.gridftp.server import plain_gridftp

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(
        shutil.which("globus-gridftp-server") is None or shutil.which("globus-url-copy") is None,
        reason="globus-gridftp-server-progs / globus-gass-copy-progs missing",
    ),
]


@pytest.fixture(scope="module")
def memory_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="iepm-test-gagent-mem-", dir="/dev/shm"))
    # An agent run as root maps the anonymous login to nobody, who must reach the slots.
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gridftp_agent(memory_dir: Path) -> Iterator[RunningAgent]:
    with copy_agent(memory_dir, ("gridftp",), "ga") as agent:
        yield agent


def is_server(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        cmdline = process.cmdline()
        return bool(cmdline) and Path(cmdline[0]).name == "globus-gridftp-server"
    return False


def servers_of(agent: RunningAgent) -> list[psutil.Process]:
    assert agent.proc is not None
    alive = []
    for child in psutil.Process(agent.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if is_server(child) and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def slot_files(memory_dir: Path) -> list[Path]:
    return files_under(memory_dir / "slots")


def disk_slot_files(agent: RunningAgent) -> list[Path]:
    return files_under(agent.dir / "state" / "work")


def sources(pid: int | None = None) -> set[str]:
    """The memory sources of copies run by ``pid`` (default: this test process): other copies
    on this host make and remove their own meanwhile."""
    pid = os.getpid() if pid is None else pid
    return {p.name for p in Path(copy.MEMORY_DIR).glob(f"{copy.SOURCE_PREFIX}-{pid}-*")}


def context(agent: RunningAgent, monitor: str = "mon1") -> ProbeContext:
    access = AgentAccess(url=agent.url, credential_file=str(agent.token_file(monitor)))
    return ProbeContext(
        target="loop", address="127.0.0.1", monitor=monitor, servers=server_source(access)
    )


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    return False


def test_a_memory_copy_through_the_agent_succeeds_and_leaves_nothing(
    gridftp_agent: RunningAgent, memory_dir: Path
) -> None:
    before = sources()
    spec = gridftp_mem.Spec(size="64M", streams=2, window="1M", duration_s=20)
    result = asyncio.run(gridftp_mem.run(spec, context(gridftp_agent)))
    assert result.succeeded, f"{result.error}\n{result.diags}"
    assert result.data["bytes"] == 64 * 1024**2 and result.data["streams"] == 2
    assert result.data["throughput_bps"] > 0
    # globus-url-copy prints its -vb average about once a second: a quick loopback copy may end
    # before the first line, and then the tool reported nothing (None, not a made-up figure).
    tool_bps = result.data["tool_throughput_bps"]
    assert tool_bps > 0 if result.data["transfer_s"] >= 2.0 else tool_bps is None or tool_bps > 0
    assert 0 < result.data["connect_s"] <= result.data["setup_s"]
    assert "agent http://127.0.0.1" in result.diags and "slot" in result.diags
    assert result.tool_version is not None and "10.12" in result.tool_version
    # One session: the server exits when the copy ends, and the agent sweeps the slot.
    assert wait_until(lambda: not servers_of(gridftp_agent), 10.0)
    assert wait_until(lambda: slot_files(memory_dir) == [], 10.0)
    assert sources() == before


def test_a_disk_copy_through_the_agent_writes_on_disk_and_leaves_nothing(
    gridftp_agent: RunningAgent, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    spec = gridftp_disk.Spec(size="16M", streams=2, duration_s=20, source_dir=str(tmp_path / "src"))
    result = asyncio.run(gridftp_disk.run(spec, context(gridftp_agent)))
    assert result.succeeded, f"{result.error}\n{result.diags}"
    assert result.data["bytes"] == 16 * 1024**2 and result.data["commit_s"] is not None
    # The seeded source stays for the next run; the copy on the target does not.
    assert [p.name for p in (tmp_path / "src").iterdir()] == [f"iepm-xrdcp-{16 * 1024**2}.src"]
    assert wait_until(lambda: not servers_of(gridftp_agent), 10.0)
    assert wait_until(lambda: disk_slot_files(gridftp_agent) == [], 10.0)


def test_a_copy_larger_than_the_agent_allows_is_refused_naming_the_limit(
    gridftp_agent: RunningAgent, memory_dir: Path
) -> None:
    spec = gridftp_mem.Spec(size="2G", duration_s=20)
    result = asyncio.run(gridftp_mem.run(spec, context(gridftp_agent)))
    assert result.outcome == Outcome.FAILED
    assert result.error is not None and "max_size = 1G" in result.error
    assert servers_of(gridftp_agent) == [] and slot_files(memory_dir) == []


def test_an_agent_without_the_server_refuses_the_slot_naming_the_package(
    tmp_path: Path, memory_dir: Path
) -> None:
    settings = {
        "memory_dir": str(memory_dir / "slots"),
        "programs": {"gridftp": "globus-gridftp-server-gone"},
    }
    with running_agent(tmp_path, settings=settings, kinds=("gridftp",)) as agent:
        before = sources()
        result = asyncio.run(
            gridftp_mem.run(gridftp_mem.Spec(size="8M", duration_s=10), context(agent))
        )
        assert result.outcome == Outcome.FAILED
        assert result.error is not None
        assert "the gridftp server is not installed on this target" in result.error
        assert "(Debian: apt-get install globus-gridftp-server-progs)" in result.error
        assert slot_files(memory_dir) == [] and servers_of(agent) == []
        assert sources() == before


def test_a_monitor_without_globus_url_copy_is_told_the_package(
    gridftp_agent: RunningAgent, monkeypatch: pytest.MonkeyPatch, memory_dir: Path
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = asyncio.run(
        gridftp_mem.run(gridftp_mem.Spec(size="8M", duration_s=10), context(gridftp_agent))
    )
    assert result.outcome == Outcome.FAILED and result.error is not None
    assert "(Debian: apt-get install globus-gass-copy-progs)" in result.error
    # Refused before any lease: nothing started on the target.
    assert servers_of(gridftp_agent) == [] and slot_files(memory_dir) == []


def test_a_plain_endpoint_takes_the_copy_into_remote_dir_and_the_diags_say_it_stays() -> None:
    before = sources()
    with plain_gridftp() as server:
        spec = gridftp_mem.Spec(
            size="8M", streams=2, duration_s=20, port=server.port, remote_dir=str(server.data)
        )
        result = asyncio.run(
            gridftp_mem.run(spec, ProbeContext(target="plain", address="127.0.0.1"))
        )
        assert result.succeeded, f"{result.error}\n{result.diags}"
        copies = list(server.data.iterdir())
        assert [p.stat().st_size for p in copies] == [8 * 1024**2]
        assert f"the copy {copies[0]} is left on 127.0.0.1" in result.diags
    assert sources() == before


def test_permission_denied_on_the_target_is_the_reason_and_nothing_is_written() -> None:
    """A plain endpoint (no agent) whose directory its anonymous user may not write."""
    before = sources()
    with plain_gridftp() as server:
        shutil.chown(server.data, "root")
        server.data.chmod(0o755)
        spec = gridftp_mem.Spec(
            size="8M", duration_s=20, port=server.port, remote_dir=str(server.data)
        )
        result = asyncio.run(
            gridftp_mem.run(spec, ProbeContext(target="plain", address="127.0.0.1"))
        )
        assert result.outcome == Outcome.FAILED and result.error is not None
        assert "refused to write the file: permission denied" in result.error
        assert "Permission denied" in result.error
        assert list(server.data.iterdir()) == []
        pid = server.proc.pid
    assert not psutil.pid_exists(pid) or not alive(psutil.Process(pid))
    assert sources() == before


def test_a_full_disk_on_the_target_is_the_reason_and_the_slot_goes(
    tmp_path: Path, memory_dir: Path
) -> None:
    small = Path(tempfile.mkdtemp(prefix="iepm-test-gfull-", dir="/dev/shm"))
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0755", "iepm-test-gfull", str(small)],
        check=True,
        timeout=30,
    )
    try:
        settings = {"memory_dir": str(small / "slots")}
        with running_agent(tmp_path, settings=settings, kinds=("gridftp",)) as agent:
            before = sources()
            spec = gridftp_mem.Spec(size="16M", duration_s=20)
            result = asyncio.run(gridftp_mem.run(spec, context(agent)))
            assert result.outcome == Outcome.FAILED and result.error is not None
            assert "its file system is full" in result.error
            assert "No space left on device" in result.error
            assert wait_until(lambda: not servers_of(agent), 10.0)
            assert wait_until(lambda: files_under(small / "slots") == [], 10.0)
            assert sources() == before
    finally:
        subprocess.run(["umount", str(small)], check=True, timeout=30)
        small.rmdir()


def stop_servers_when_the_copy_starts(agent: RunningAgent, memory_dir: Path) -> list[int]:
    """SIGSTOP the agent's server (and its session child) once the copy's file exists."""
    assert wait_until(lambda: any(p.suffix == ".dat" for p in slot_files(memory_dir)), 20.0)
    stopped = []
    for server in servers_of(agent):
        with contextlib.suppress(psutil.NoSuchProcess):
            server.send_signal(signal.SIGSTOP)
            stopped.append(server.pid)
    return stopped


def test_a_hung_server_ends_at_the_deadline_and_the_slot_goes(
    gridftp_agent: RunningAgent, memory_dir: Path
) -> None:
    before = sources()
    # The stall timeout is longer than the deadline: the deadline is what ends the copy.
    spec = gridftp_mem.Spec(size="1G", duration_s=4, connect_timeout_s=60)

    async def copy_and_stop() -> tuple[Result, list[int]]:
        run = asyncio.create_task(gridftp_mem.run(spec, context(gridftp_agent)))
        stopped = await asyncio.to_thread(
            stop_servers_when_the_copy_starts, gridftp_agent, memory_dir
        )
        return await run, stopped

    result, stopped = asyncio.run(copy_and_stop())
    assert stopped, "the copy never started"
    assert result.outcome == Outcome.TIMEOUT, f"{result.outcome}: {result.error}"
    assert "did not finish" in (result.error or "")
    # The lease ends when the probe returns: the agent kills the stopped server, removes files.
    assert wait_until(lambda: not servers_of(gridftp_agent), 15.0)
    assert wait_until(lambda: slot_files(memory_dir) == [], 15.0)
    assert sources() == before


MONITOR_SCRIPT = """
import asyncio, sys
from iepm.config import AgentAccess
from iepm.probes import gridftp_mem
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
access = AgentAccess(url=sys.argv[1], credential_file=sys.argv[2])
ctx = ProbeContext(target="loop", address="127.0.0.1", servers=server_source(access))
spec = gridftp_mem.Spec(size="1G", duration_s=8, window="64K")
asyncio.run(gridftp_mem.run(spec, ctx))
"""


def test_a_monitor_killed_mid_copy_leaves_nothing_on_either_side(
    gridftp_agent: RunningAgent, memory_dir: Path
) -> None:
    before = sources()
    monitor = subprocess.Popen(
        [sys.executable, "-c", MONITOR_SCRIPT, gridftp_agent.url,
         str(gridftp_agent.token_file("mon1"))],
        start_new_session=True,
    )  # fmt: skip
    try:
        # Killed once its copy is under way: globus-url-copy running, the file growing.
        assert wait_until(
            lambda: any(
                p.suffix == ".dat" and p.stat().st_size > 0 for p in slot_files(memory_dir)
            ),
            20.0,
        )
        copier = list(psutil.Process(monitor.pid).children(recursive=True))
        assert any(p.name() == "globus-url-copy" for p in copier)
        monitor.kill()
        monitor.wait(timeout=10)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=10)
    # The monitor's side: globus-url-copy (and the stamping wrapper) die with it.
    assert wait_until(lambda: not any(alive(p) for p in copier), 10.0)
    # The target's side: the session's connection drops, the one-session server exits (or the
    # agent kills it at the slot's deadline), and the agent removes the slot's directory.
    assert wait_until(lambda: not servers_of(gridftp_agent), 20.0)
    assert wait_until(lambda: slot_files(memory_dir) == [], 20.0)
    # The killed monitor's sparse source goes at the next copy's start. Only its own names
    # count: another copy on this host may hold (or have left) its own meanwhile.
    assert sources(monitor.pid) and sources() == before
    copy.sweep_sources()
    assert not sources(monitor.pid)

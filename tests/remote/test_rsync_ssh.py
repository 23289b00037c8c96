"""Copies over SSH (rsync_mem, rsync_disk) against a real OpenSSH server and rsync on loopback:
a copy that measures, and each failure as a result with its reason — the tool missing on either
side, a refused key, a full disk, a hang past the limit, the monitor killed mid-copy — with
nothing left on either side (the target's directory, its rsync, the monitor's tools)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from iepm.config import SshAccess
from iepm.probes import rsync, rsync_disk, rsync_mem, xrdcp
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.rawlog import RawLog
from iepm.remote.lease import server_source
from iepm.remote.ssh import check_target
from iepm.results import Outcome, Result
from iepm.runner import RawRun
from testkit.net import free_port, wait_until
from testkit.sshd import Sshd, private_sshd

pytestmark = [
    pytest.mark.servers,
    pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync missing"),
]
# What a target without rsync still has: the shell tools the lease and the copy's wrapper use.
BASICS = ("sh", "mktemp", "timeout", "cat", "rm", "sleep")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    tmp = tmp_path_factory.mktemp("sshd")
    with private_sshd(tmp, "127.0.0.1", free_port(), password_auth=False) as server:
        yield server


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    """The target's memory file system for the test (a private directory on /dev/shm)."""
    with tempfile.TemporaryDirectory(dir="/dev/shm", prefix="iepm-xfer-") as name:
        yield Path(name)


@pytest.fixture
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="iepm-xfer-") as name:
        yield Path(name)


def context(access: SshAccess) -> ProbeContext:
    # Log-in and each remote step: the product's default deadline, which holds on a busy host.
    return ProbeContext(target="loop", address="127.0.0.1", servers=server_source(access))


def copiers(sshd: Sshd) -> list[psutil.Process]:
    """The target's rsync processes (and their timeout) under this test's sshd."""
    alive = []
    for child in psutil.Process(sshd.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() in ("rsync", "timeout") and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def nothing_left(sshd: Sshd, *dirs: Path) -> bool:
    return not copiers(sshd) and all(not list(d.iterdir()) for d in dirs)


def run_mem(access: SshAccess, **spec: object) -> Result:
    return asyncio.run(rsync_mem.run(rsync_mem.Spec.model_validate(spec), context(access)))


def accepted(sshd: Sshd) -> int:
    """SSH connections the target's sshd has accepted so far (its log: one line each)."""
    return sshd.log().count("Accepted publickey for ")


@pytest.mark.parametrize("streams", [1, 4])
def test_a_memory_copy_measures_its_phases_and_leaves_nothing(
    sshd: Sshd, memory_dir: Path, streams: int
) -> None:
    before = accepted(sshd)
    access = sshd.access(memory_dir=str(memory_dir))
    result = run_mem(access, size="32M", duration_s=30, streams=streams)
    assert result.succeeded, (result.error, result.diags[-2000:])
    data = result.data
    # Every byte arrived, in as many files over as many SSH connections as asked.
    assert data["bytes"] == 32 * 1024**2
    assert data["streams"] == data["connections"] == streams
    assert accepted(sshd) - before >= streams + 1  # the copies' and the lease's own
    assert result.diags.count(" --outbuf=N ") == streams
    assert data["cipher"] == "aes128-gcm@openssh.com"
    assert 0 < data["connect_s"] < data["setup_s"] < data["elapsed_s"]
    # The phases end within rsync's run: set-up (until the last stream is sending), transfer
    # (the first stream's name line to the last 100%) and commit; with several streams the
    # first two overlap by the spread of their starts.
    phases = data["setup_s"] + data["transfer_s"] + data["commit_s"] - data["start_spread_s"]
    assert phases <= data["elapsed_s"] + 1e-6
    assert data["end_to_end_throughput_bps"] < data["throughput_bps"]
    # rsync's own rate covers the same transfer: within a few percent of ours (its rate is
    # printed with 3-4 significant digits, our stamps are read a pipe away). Several streams:
    # the sum of their own rates, each over its own part of the time, at least ours.
    if streams == 1:
        assert data["tool_throughput_bps"] == pytest.approx(data["throughput_bps"], rel=0.1)
    else:
        assert data["tool_throughput_bps"] >= 0.9 * data["throughput_bps"]
    assert f"{memory_dir}/iepm-" in result.diags and result.tool_version.startswith("rsync")
    assert wait_until(lambda: nothing_left(sshd, memory_dir), 20.0)


@pytest.mark.parametrize("commit", ["at_end", "none"])
def test_a_disk_copy_commits_when_asked(sshd: Sshd, work_dir: Path, commit: str) -> None:
    source_dir = work_dir / "src"
    target_dir = work_dir / "target"
    source_dir.mkdir()
    target_dir.mkdir()
    spec = rsync_disk.Spec(size="8M", duration_s=30, commit=commit, source_dir=str(source_dir))
    ctx = context(sshd.access(work_dir=str(target_dir)))
    result = asyncio.run(rsync_disk.run(spec, ctx))
    assert result.succeeded, (result.error, result.diags[-2000:])
    assert ("--fsync" in result.diags) == (commit == "at_end")
    data = result.data
    assert data["committed_throughput_bps"] <= data["throughput_bps"]
    # The seeded source stays for the next run; the copy on the target does not.
    assert [p.name for p in source_dir.iterdir()] == [f"iepm-xrdcp-{8 * 1024**2}.src"]
    assert wait_until(lambda: nothing_left(sshd, target_dir), 20.0)


def test_streams_are_read_apart_when_the_command_runs_in_a_namespace() -> None:
    """The recorded 4-stream copy, as run in a lab namespace (ip netns exec before stamp.py):
    the same reading, each stream's lines apart."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "rsync"
    case = "rsync-3.5.0_openssh-9.2p1--mem-4streams"
    oracle = json.loads((fixtures / f"{case}.json").read_text())
    argv = ("ip", "netns", "exec", "lab-mon", *shlex.split(oracle["command"]))
    out, err = ((fixtures / f"{case}.{end}").read_text() for end in ("out", "err"))
    raw = RawRun(argv, out, err)
    data = rsync.parse(raw, rsync_mem.Spec(size=oracle["size"], streams=4))
    assert data == oracle["data"]
    assert data["streams"] == data["connections"] == 4


def test_a_copy_over_streams_is_read_again_from_its_raw_log(
    sshd: Sshd, memory_dir: Path, tmp_path: Path
) -> None:
    """What ``iepm extract`` does: the one raw record of the set, parsed again with the spec it
    kept, gives the result's figures."""
    access = sshd.access(memory_dir=str(memory_dir))
    raw_log = RawLog(tmp_path / "raw")
    ctx = ProbeContext(
        target="loop", address="127.0.0.1", servers=server_source(access), raw_log=raw_log
    )
    result = asyncio.run(rsync_mem.run(rsync_mem.Spec(size="16M", streams=3), ctx))
    assert result.succeeded, (result.error, result.diags[-2000:])
    (logged,) = list(raw_log.runs())
    again = result_from_raw(
        rsync_mem, rsync_mem.Spec.model_validate(logged.params), ctx, logged.raw, None
    )
    assert again.data == result.data and again.data["streams"] == 3
    assert wait_until(lambda: nothing_left(sshd, memory_dir), 20.0)


# --- failures are data, nothing left behind -----------------------------------------------------


def test_a_target_without_rsync_is_told_which_package_to_install(
    memory_dir: Path, tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in BASICS:
        (bin_dir / name).symlink_to(shutil.which(name) or name)
    config = (f"SetEnv PATH={bin_dir}",)
    with private_sshd(
        tmp_path / "sshd", "127.0.0.1", free_port(), password_auth=False, extra_config=config
    ) as bare:
        result = run_mem(bare.access(memory_dir=str(memory_dir)), size="4M", duration_s=20)
        assert result.outcome == Outcome.FAILED
        assert "rsync is not installed on root@127.0.0.1 (Debian: apt-get install rsync)" in (
            result.error or ""
        ), result.error
        assert wait_until(lambda: nothing_left(bare, memory_dir), 20.0)


def test_a_monitor_without_rsync_is_told_which_package_to_install(
    sshd: Sshd, memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    result = run_mem(sshd.access(memory_dir=str(memory_dir)), size="4M")
    assert result.outcome == Outcome.FAILED
    assert "(Debian: apt-get install rsync)" in (result.error or ""), result.error
    assert nothing_left(sshd, memory_dir)


@pytest.mark.parametrize("streams", [1, 4])
def test_a_refused_key_is_permission_denied_at_once(
    sshd: Sshd, memory_dir: Path, tmp_path: Path, streams: int
) -> None:
    stranger = tmp_path / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        timeout=30,
    )
    access = sshd.access(memory_dir=str(memory_dir), key_file=str(stranger))
    result = run_mem(access, size="4M", streams=streams)
    assert result.outcome == Outcome.FAILED
    assert "refused this monitor's key" in (result.error or ""), result.error
    assert nothing_left(sshd, memory_dir)


@contextlib.contextmanager
def small_tmpfs(parent: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``parent/small``: a target file system too small for the copy."""
    target = parent / "small"
    target.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(target)], check=True, timeout=10
    )
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True, timeout=10)


def test_a_full_disk_on_the_target_fails_the_copy_and_removes_it(
    sshd: Sshd, work_dir: Path
) -> None:
    with small_tmpfs(work_dir) as target:
        spec = rsync_disk.Spec(size="8M", duration_s=20, source_dir=str(work_dir))
        result = asyncio.run(rsync_disk.run(spec, context(sshd.access(work_dir=str(target)))))
        assert result.outcome == Outcome.FAILED
        assert "no room for the copy on root@127.0.0.1: its file system is full" in (
            result.error or ""
        ), result.error
        assert "No space left on device" in (result.error or "")
        assert wait_until(lambda: nothing_left(sshd, target), 20.0)


def test_a_full_memory_file_system_fails_every_stream_and_removes_them(
    sshd: Sshd, work_dir: Path
) -> None:
    """Four rsyncs at once into a target's memory file system too small for their parts."""
    with small_tmpfs(work_dir) as target:
        result = run_mem(sshd.access(memory_dir=str(target)), size="8M", duration_s=20, streams=4)
        assert result.outcome == Outcome.FAILED
        assert "no room for the copy on root@127.0.0.1: its file system is full" in (
            result.error or ""
        ), result.error
        assert wait_until(lambda: nothing_left(sshd, target), 20.0)


@pytest.mark.parametrize("streams", [1, 4])
def test_a_hung_copy_is_killed_at_its_limit_and_cleaned_on_the_target(
    sshd: Sshd, memory_dir: Path, streams: int
) -> None:
    """The target's rsyncs stop (SIGSTOP, as processes stuck on a dead disk): the monitor's
    rsyncs are killed at the duration limit, the lease kills the stopped ones on the target."""
    stopped: set[int] = set()

    async def copy_and_stop() -> Result:
        task = asyncio.create_task(
            rsync_mem.run(
                rsync_mem.Spec(size="1G", duration_s=10, streams=streams),
                context(sshd.access(memory_dir=str(memory_dir))),
            )
        )
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 20
        # Each stream's target rsync (its receiver forks a second one) is stopped as it comes.
        while len(stopped) < streams and loop.time() < give_up and not task.done():
            for proc in copiers(sshd):
                if proc.name() == "rsync" and proc.pid not in stopped:
                    proc.send_signal(signal.SIGSTOP)
                    stopped.add(proc.pid)
            await asyncio.sleep(0.05)
        return await task

    result = asyncio.run(copy_and_stop())
    assert len(stopped) >= streams, f"the target's rsyncs never started: {result.error}"
    assert result.outcome == Outcome.TIMEOUT, (result.error, result.diags[-1500:])
    assert "did not finish within its 10 s deadline" in (result.error or "")
    assert wait_until(lambda: nothing_left(sshd, memory_dir), 20.0)


MONITOR_SCRIPT = """
import asyncio, sys
from iepm.config import SshAccess
from iepm.probes import rsync_mem
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.rawlog import RawLog
from iepm.remote.lease import server_source
from iepm.remote.ssh import check_target
access = SshAccess.model_validate_json(sys.argv[1])
ctx = ProbeContext(target="loop", address="127.0.0.1", servers=server_source(access))
spec = rsync_mem.Spec(size="4G", duration_s=60, streams=int(sys.argv[2]))
result = asyncio.run(rsync_mem.run(spec, ctx))
print(result.outcome, result.error, flush=True)
"""


@pytest.mark.parametrize("streams", [1, 4])
def test_a_monitor_killed_mid_copy_leaves_nothing_on_either_side(
    sshd: Sshd, memory_dir: Path, streams: int
) -> None:
    access = sshd.access(memory_dir=str(memory_dir))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    monitor = subprocess.Popen(
        [sys.executable, "-c", MONITOR_SCRIPT, access.model_dump_json(), str(streams)],
        start_new_session=True,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # Killed once its copy is under way: the file growing on the target.
        def growing() -> bool:
            return any(
                f.stat().st_size > 0 for d in memory_dir.iterdir() for f in d.glob(".*.dat.*")
            )

        if not wait_until(growing, 30.0):
            monitor.kill()
            said = monitor.communicate(timeout=10)[0].decode(errors="replace")
            pytest.fail(f"the copy never got under way: {said[-2000:]}")
        tools = psutil.Process(monitor.pid).children(recursive=True)
        assert sum(p.name() == "ssh" for p in tools) >= streams
        assert {"rsync", "ssh"} <= {p.name() for p in tools}
        monitor.kill()
        monitor.wait(timeout=10)
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait(timeout=10)
    # The monitor's side: its tools die with it (the runner's guardian kills their group).
    assert wait_until(lambda: not any(alive(p) for p in tools), 10.0)
    # The target's side: its rsync and the copy's directory go when the connection closes.
    assert wait_until(lambda: nothing_left(sshd, memory_dir), 10.0)

    # The killed monitor's sparse source goes at the next copy's start. Only its own names
    # count: another copy on this host may hold (or have left) its own meanwhile.
    def own_sources() -> set[str]:
        return {p.name for p in Path("/dev/shm").glob(f"iepm-xrdcp-{monitor.pid}-*")}

    assert own_sources()
    xrdcp.sweep_sources()
    assert not own_sources()


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_plain_or_agent_target_cannot_copy_over_ssh(memory_dir: Path) -> None:
    ctx = ProbeContext(target="plain", address="127.0.0.1")
    result = asyncio.run(rsync_mem.run(rsync_mem.Spec(size="4M"), ctx))
    assert result.outcome == Outcome.FAILED
    assert "give plain an [targets.ssh] table" in (result.error or "")


def test_checking_an_ssh_target_reports_rsync_and_room_for_copies(
    sshd: Sshd, memory_dir: Path, work_dir: Path
) -> None:
    access = sshd.access(memory_dir=str(memory_dir), work_dir=str(work_dir))
    found = asyncio.run(check_target(access, "127.0.0.1"))
    assert str(found["rsync"]).startswith("rsync  version ")
    assert int(found["memory_dir_free_bytes"] or 0) > 0
    assert int(found["work_dir_free_bytes"] or 0) > 0

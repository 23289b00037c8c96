"""Agentless SSH mode against a real OpenSSH server (private config, host key and port, on
loopback): quoting, a full disk, unknown host keys, a refused key; nothing left behind."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from iepm.config import SshAccess
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from iepm.remote.ssh import connect
from iepm.results import Result
from testkit.net import free_port
from testkit.sshd import Sshd, private_sshd

pytestmark = pytest.mark.servers


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with private_sshd(tmp_path_factory.mktemp("sshd"), "127.0.0.1", free_port()) as server:
        yield server


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="s") as name:
        yield Path(name)


def run_iperf3(access: SshAccess, duration_s: int = 1) -> Result:
    ctx = ProbeContext(target="loop", address="127.0.0.1", servers=server_source(access))
    return asyncio.run(iperf3.run(iperf3.Spec(duration_s=duration_s), ctx))


def login_s(sshd: Sshd) -> float:
    """Seconds one good log-in takes on this host now (a loaded host takes several)."""

    async def once() -> float:
        t0 = time.monotonic()
        conn = await connect(sshd.access(), "127.0.0.1", None)
        conn.close()
        await conn.wait_closed()
        return time.monotonic() - t0

    return asyncio.run(once())


def at_once_s(sshd: Sshd) -> float:
    """What "at once" means for a failure that needs one log-in: 5 s on a quiet host, more
    when a log-in itself takes longer here (timing fidelity: a busy host)."""
    return max(5.0, 3 * login_s(sshd))


def servers_of(sshd: Sshd) -> list[psutil.Process]:
    alive = []
    for child in psutil.Process(sshd.proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if child.name() in ("iperf3", "timeout") and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
    return alive


def test_a_test_over_ssh_measures_and_leaves_nothing_behind(sshd: Sshd, short_tmp: Path) -> None:
    result = run_iperf3(sshd.access(server_port=free_port(), work_dir=str(short_tmp)))
    assert result.succeeded, (result.error, result.diags)
    assert result.data["throughput_bps"] > 1e8
    assert f"in {short_tmp}/iepm-" in result.diags
    assert list(short_tmp.iterdir()) == []  # the test's directory was removed
    assert servers_of(sshd) == []


def test_shell_metacharacters_reach_the_target_as_one_word(sshd: Sshd, short_tmp: Path) -> None:
    """The work directory is sent to the target's shell: it must arrive as one literal word."""
    marker = f"iepm-pwned-{uuid.uuid4().hex[:8]}"  # relative: made in the remote shell's cwd
    odd = short_tmp / f"a b$(touch {marker});`touch {marker}`|&'\"*"
    odd.mkdir()
    result = run_iperf3(sshd.access(server_port=free_port(), work_dir=str(odd)))
    assert result.succeeded, (result.error, result.diags)
    # The per-test directory was made inside the odd directory (literally) and removed again.
    assert f"in {odd}/iepm-" in result.diags
    assert list(odd.iterdir()) == []
    assert not (Path.home() / marker).exists() and not Path(marker).exists()
    assert sorted(p.name for p in short_tmp.iterdir()) == [odd.name]


def test_a_full_disk_on_the_target_is_a_clear_failure(sshd: Sshd, short_tmp: Path) -> None:
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k,nr_inodes=4", "tmpfs", str(short_tmp)],
        check=True,
        timeout=10,
    )
    try:
        with contextlib.suppress(OSError):
            (short_tmp / "fill").write_bytes(b"\0" * 65536)
        for i in range(4):
            with contextlib.suppress(OSError):
                (short_tmp / f"f{i}").touch()
        limit_s = at_once_s(sshd)
        t0 = time.monotonic()
        result = run_iperf3(sshd.access(server_port=free_port(), work_dir=str(short_tmp)))
        elapsed = time.monotonic() - t0
    finally:
        subprocess.run(["umount", str(short_tmp)], check=True, timeout=10)
    assert not result.succeeded
    assert "is full (No space left on device)" in (result.error or ""), result.error
    assert elapsed < limit_s, f"{elapsed:.1f} s; at once on this host: {limit_s:.1f} s"
    assert servers_of(sshd) == []


def test_an_unknown_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "known_hosts"
    other.write_text(
        f"[127.0.0.1]:{sshd.port} " + (sshd.client_key.with_suffix(".pub")).read_text()
    )
    result = run_iperf3(sshd.access(known_hosts=str(other)))
    assert not result.succeeded
    assert "host key is not in known_hosts or does not match" in (result.error or "")


def test_a_refused_key_fails_at_once_although_the_server_offers_passwords(
    sshd: Sshd, tmp_path: Path
) -> None:
    """The IEPM-BW hang: a lost key and a password prompt. Here: a failed result, quickly."""
    stranger = tmp_path / "stranger"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)],
        check=True,
        timeout=30,
    )
    # The step deadline is longer than "at once": a refusal that waited for it would show.
    limit_s = at_once_s(sshd)
    access = sshd.access(key_file=str(stranger), step_timeout_s=max(10.0, 2 * limit_s))
    t0 = time.monotonic()
    result = run_iperf3(access)
    elapsed = time.monotonic() - t0
    assert elapsed < limit_s, f"{elapsed:.1f} s; at once on this host: {limit_s:.1f} s"
    assert not result.succeeded
    assert "refused this monitor's key" in (result.error or "")
    # Results never carry key material.
    assert stranger.read_text().splitlines()[1] not in (result.diags + (result.error or ""))


def test_an_unreachable_ssh_port_fails_within_the_step_deadline(sshd: Sshd) -> None:
    t0 = time.monotonic()
    result = run_iperf3(sshd.access(port=free_port(), step_timeout_s=2))
    assert time.monotonic() - t0 < 4
    assert not result.succeeded
    assert "connection refused" in (result.error or "")

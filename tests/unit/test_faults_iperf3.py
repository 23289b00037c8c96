"""iperf3 probe under faults: each run ends within its deadline as a failed Result with an
actionable error and the command line in ``diags``, and leaves no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import iepm.probes.base as probe_base
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.results import Outcome, Result
from iepm.runner import RawRun, run_command
from testkit.net import free_port

# Starts real tools and servers on loopback (the servers tier).
pytestmark = pytest.mark.servers

HOST = "127.0.0.1"
# Each fault must end by its deadline plus the runner's TERM→KILL grace and some slack.
SLACK_S = 2.0 + 1.5


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[RawRun]:
    """Every RawRun the probe produced, so tests can check the tool's PID afterwards."""
    captured: list[RawRun] = []

    async def recording(*args: Any, **kwargs: Any) -> RawRun:
        raw = await run_command(*args, **kwargs)
        captured.append(raw)
        return raw

    monkeypatch.setattr(probe_base, "run_command", recording)
    return captured


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}


def probe(spec: iperf3.Spec, address: str = HOST) -> tuple[Result, float, set[int]]:
    """Run the probe; also return the child processes it left (compared with before)."""
    before = children()
    ctx = ProbeContext(target="faulty", address=address)
    t0 = time.monotonic()
    result = asyncio.run(iperf3.run(spec, ctx))
    elapsed = time.monotonic() - t0
    return result, elapsed, children() - before


def assert_clean(
    result: Result, runs: list[RawRun], spec: iperf3.Spec, elapsed: float, left: set[int]
) -> None:
    assert not result.succeeded
    assert result.error
    assert elapsed < spec.deadline_s() + SLACK_S
    assert result.diags.startswith("iperf3 -c ")
    for raw in runs:
        assert raw.pid is not None and not alive(raw.pid), f"iperf3 {raw.pid} survived"
    assert not left, f"child processes survived: {left}"


@pytest.mark.timeout(30)
def test_nothing_listening(runs: list[RawRun]) -> None:
    port = free_port()
    spec = iperf3.Spec(port=port, duration_s=1)
    result, elapsed, left = probe(spec)
    assert result.outcome is Outcome.FAILED
    assert result.error == (
        f"nothing listening on 127.0.0.1:{port} — is the iperf3 server (or iepm agent) running? "
        "(iperf3: unable to connect to server: Connection refused)"
    )
    assert elapsed < 2
    assert_clean(result, runs, spec, elapsed, left)


@contextlib.contextmanager
def stalling_server() -> Iterator[int]:
    """Accepts TCP connections and never says a word (not the iperf3 protocol)."""
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(8)
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = listener.accept()
                held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        listener.close()


@pytest.mark.timeout(30)
def test_server_that_accepts_and_stalls_times_out(runs: list[RawRun]) -> None:
    with stalling_server() as port:
        spec = iperf3.Spec(port=port, duration_s=1, connect_timeout_ms=500)
        result, elapsed, left = probe(spec)
    assert result.outcome is Outcome.TIMEOUT
    assert result.error == (
        f"iperf3 to faulty (127.0.0.1) did not finish within its {spec.deadline_s():g} s "
        f"deadline and was killed; iperf3 to 127.0.0.1:{port} was interrupted before any data "
        "was measured: the test never started — a stalled iperf3 server, something other than "
        "iperf3 listening on that port, or a name lookup that hung?"
    )
    assert elapsed >= spec.deadline_s()
    assert "killed at deadline" in result.diags
    assert_clean(result, runs, spec, elapsed, left)


@pytest.mark.timeout(60)
def test_unresolvable_name(runs: list[RawRun]) -> None:
    spec = iperf3.Spec(duration_s=1)
    result, elapsed, left = probe(spec, address="nonexistent.invalid")
    assert result.outcome is Outcome.FAILED
    assert result.error is not None
    assert result.error.startswith("cannot resolve 'nonexistent.invalid' — check the target's")
    assert result.diags.startswith("iperf3 -c nonexistent.invalid ")
    assert_clean(result, runs, spec, elapsed, left)


@pytest.mark.timeout(30)
def test_iperf3_missing_from_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runs: list[RawRun]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    spec = iperf3.Spec(duration_s=1)
    result, elapsed, left = probe(spec)
    assert result.outcome is Outcome.FAILED
    assert result.error == (
        f"'iperf3' is not installed or not on PATH (PATH={tmp_path}); "
        "install it (Debian: apt-get install iperf3)"
    )
    assert runs == []  # nothing was started
    assert_clean(result, runs, spec, elapsed, left)


FAKE_IPERF3 = """\
#!/bin/sh
# A fake iperf3 that never exits: it ignores SIGTERM and leaves a sleeping child behind.
case "$1" in --version|-v) echo "iperf 3.12 (fake)"; exit 0;; esac
trap '' TERM
sleep 1000 &
echo "$$ $!" > {pidfile}
exec sleep 1000
"""


@pytest.mark.timeout(30)
def test_tool_that_never_exits_is_killed_with_its_child(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runs: list[RawRun]
) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pidfile = tmp_path / "pids"
    fake = bindir / "iperf3"
    fake.write_text(FAKE_IPERF3.format(pidfile=pidfile))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    spec = iperf3.Spec(duration_s=1, connect_timeout_ms=500)
    result, elapsed, left = probe(spec)
    assert result.outcome is Outcome.TIMEOUT
    assert result.error == (
        f"iperf3 to faulty (127.0.0.1) did not finish within its {spec.deadline_s():g} s "
        "deadline and was killed; iperf3 to 127.0.0.1:5201 printed no report (exit -9); it was "
        "killed or crashed before writing it"
    )
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        assert not alive(pid), f"fake iperf3 process {pid} survived"
    assert_clean(result, runs, spec, elapsed, left)

"""The runner: deadlines, group kills, partial output, missing tools."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from iepm.errors import ToolNotFound
from iepm.runner import run_command


def run(argv: list[str], timeout_s: float, **kwargs: object):  # type: ignore[no-untyped-def]
    return asyncio.run(run_command(argv, timeout_s, **kwargs))  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_captures_output_and_exit_code() -> None:
    raw = run(
        [
            sys.executable,
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        ],
        10,
    )
    assert raw.stdout == "out\n"
    assert raw.stderr == "err\n"
    assert raw.returncode == 3
    assert not raw.timed_out
    assert "exit 3" in raw.diags()
    assert raw.argv[0] == sys.executable


def test_timeout_kills_the_whole_group_and_keeps_partial_output(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    # The tool forks a grandchild that would outlive it, then hangs; both must die.
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pidfile)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        print("started", flush=True)
        time.sleep(300)
        """
    )
    t0 = time.monotonic()
    raw = run([sys.executable, "-c", script], 2.0, kill_grace_s=0.5)
    elapsed = time.monotonic() - t0
    assert raw.timed_out
    assert raw.stdout == "started\n"
    assert elapsed < 2.0 + 0.5 + 2.0
    assert "killed at deadline" in raw.diags()
    pids = [int(p) for p in pidfile.read_text().split()]
    for pid in pids:
        assert not alive(pid), f"process {pid} survived the kill"


def test_a_tool_that_ignores_sigterm_is_killed() -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('x', flush=True); time.sleep(300)"
    )
    t0 = time.monotonic()
    raw = run([sys.executable, "-c", script], 1.0, kill_grace_s=0.5)
    assert raw.timed_out
    assert raw.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 4.0


def test_stragglers_of_a_finished_tool_are_swept(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        open({str(pidfile)!r}, "w").write(str(child.pid))
        """
    )
    raw = run([sys.executable, "-c", script], 10)
    assert raw.returncode == 0 and not raw.timed_out
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 2
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_missing_tool_raises_tool_not_found_with_advice() -> None:
    with pytest.raises(ToolNotFound, match="not installed or not on PATH"):
        run(["iepm-no-such-tool-xyz"], 5)


def test_missing_tool_names_the_debian_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolNotFound, match="apt-get install iputils-ping"):
        run(["ping", "-c", "1", "127.0.0.1"], 5)


def test_cancellation_kills_the_tool() -> None:
    async def scenario() -> int:
        task = asyncio.create_task(run_command(["sleep", "300"], 60))
        await asyncio.sleep(0.3)
        pids = [p.pid for p in psutil.Process(os.getpid()).children() if p.name() == "sleep"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pids[0]

    pid = asyncio.run(scenario())
    assert not alive(pid)


def test_stdin_is_closed_so_a_prompt_cannot_hang() -> None:
    # A tool that asks for a password reads EOF instead of waiting forever.
    raw = run([sys.executable, "-c", "import sys; print(repr(sys.stdin.read()))"], 5)
    assert raw.stdout.strip() == "''"

"""The runner: deadlines, group kills, partial output, missing tools."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from iepm.errors import ToolNotFound
from iepm.runner import run_command, start_process, start_process_sync


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


@pytest.mark.servers
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


# A tool that ignores SIGTERM and forks a helper that does too: only SIGKILL to the group ends it.
STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
    print(child.pid, flush=True)
    time.sleep(300)
    """
)


def test_supervised_stop_ends_a_stubborn_group_within_its_deadline() -> None:
    async def scenario() -> tuple[list[int], float, int | None]:
        tool = await start_process([sys.executable, "-c", STUBBORN])
        assert tool.process.stdout is not None
        helper = int(await asyncio.wait_for(tool.process.stdout.readline(), 30))
        t0 = time.monotonic()
        status = await tool.stop(grace_s=0.5)
        return [tool.pid, helper], time.monotonic() - t0, status

    pids, elapsed, status = asyncio.run(scenario())
    assert status == -signal.SIGKILL
    assert 0.5 <= elapsed < 0.5 + 3.0
    assert [pid for pid in pids if alive(pid)] == []


def test_sync_supervised_stop_ends_a_stubborn_group_within_its_deadline() -> None:
    tool = start_process_sync([sys.executable, "-c", STUBBORN], text=True)
    assert tool.popen.stdout is not None
    helper = int(tool.popen.stdout.readline())
    t0 = time.monotonic()
    status = tool.stop(grace_s=0.5)
    elapsed = time.monotonic() - t0
    tool.popen.stdout.close()
    assert status == -signal.SIGKILL
    assert 0.5 <= elapsed < 0.5 + 3.0
    assert [pid for pid in (tool.pid, helper) if alive(pid)] == []


# The monitor starts a tool that cancels its own parent-death signal (as an exec with file
# capabilities does for an unprivileged monitor), prints its PID and waits to be killed.
ESCAPING_MONITOR = textwrap.dedent(
    """
    import sys, time
    from iepm.runner import start_process_sync
    tool = start_process_sync([sys.executable, "-c",
        "import ctypes, time; ctypes.CDLL(None).prctl(1, 0, 0, 0, 0); print('ready', flush=True);"
        " time.sleep(300)"], text=True)
    assert tool.popen.stdout.readline() == "ready\\n"
    print(tool.pid, flush=True)
    time.sleep(300)
    """
)


def test_a_tool_without_parent_death_signal_dies_with_its_monitor() -> None:
    monitor = subprocess.Popen(
        [sys.executable, "-c", ESCAPING_MONITOR],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    tool = None
    try:
        assert monitor.stdout is not None
        tool = int(monitor.stdout.readline())
        assert alive(tool)
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait(timeout=10)
        deadline = time.monotonic() + 10
        while alive(tool) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(tool), "the tool outlived its monitor"
    finally:
        if tool is not None and alive(tool):
            os.kill(tool, signal.SIGKILL)
        if monitor.poll() is None:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait(timeout=10)
        if monitor.stdout is not None:
            monitor.stdout.close()


# --- dying with an unprivileged monitor (issue 17, hole 9) ---------------------------------------

# -q: a ping that prints nothing (as to a silent target) does not die of SIGPIPE when its
# monitor's end of the output pipe goes; only the supervisor can end it.
MONITOR_SCRIPT = """
import asyncio
from iepm.runner import run_command, start_process, start_process_sync
asyncio.run(run_command(["ping", "-n", "-q", "-i", "0.2", "-c", "3000", "127.0.0.1"], 600))
"""


def _unprivileged(argv: list[str]) -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]


def _python_for_nobody() -> tuple[str, dict[str, str]] | None:
    """An interpreter ``nobody`` may run that imports iepm: ours, or the system's with our
    packages on its path (a venv under /root is not readable by nobody)."""
    paths = [str(Path(__file__).resolve().parents[2])]
    paths += [p for p in sys.path if p.endswith("site-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    for python in (sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"):
        check = subprocess.run(
            _unprivileged([python, "-c", "import iepm.runner"]),
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        if check.returncode == 0:
            return python, env
    return None


def _ping_has_file_capabilities() -> bool:
    ping = shutil.which("ping")
    if ping is None or shutil.which("getcap") is None:
        return False
    out = subprocess.run(["getcap", ping], capture_output=True, text=True, timeout=10).stdout
    return "cap_net_raw" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a monitor as nobody")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
@pytest.mark.skipif(not _ping_has_file_capabilities(), reason="needs ping with file capabilities")
@pytest.mark.servers
def test_tools_die_with_an_unprivileged_monitor_killed_9() -> None:
    """PR_SET_PDEATHSIG is cleared when a non-root process execs a binary with file capabilities
    (Debian's ping): the runner must not depend on it."""
    found = _python_for_nobody()
    if found is None:
        pytest.skip("no Python interpreter that nobody may run with iepm importable")
    python, env = found
    monitor = subprocess.Popen(
        _unprivileged([python, "-c", MONITOR_SCRIPT]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    pings: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60  # a busy box starts Python slowly
        while not pings and time.monotonic() < deadline and monitor.poll() is None:
            kids = psutil.Process(monitor.pid).children(recursive=True)
            pings = [p for p in kids if p.name() == "ping"]
            time.sleep(0.05)
        assert pings, f"ping did not start: {monitor.stderr.read() if monitor.stderr else ''!r}"
        assert pings[0].uids().real != 0, "the monitor should run unprivileged"
        os.kill(monitor.pid, signal.SIGKILL)
        monitor.wait(timeout=10)
        # Gone, or a zombie waiting for init to reap it: either way no longer running.
        deadline = time.monotonic() + 10
        while any(alive(p.pid) for p in pings) and time.monotonic() < deadline:
            time.sleep(0.05)
        survivors = [p.pid for p in pings if alive(p.pid)]
        assert not survivors, f"ping outlived its monitor: {survivors}"
    finally:
        for p in pings:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        if monitor.poll() is None:
            os.killpg(monitor.pid, signal.SIGKILL)
            monitor.wait(timeout=10)


def test_a_tool_that_has_said_enough_is_stopped_early_not_timed_out() -> None:
    # Prints a line every 50 ms for 10 s; three lines are enough.
    script = "for i in $(seq 200); do echo line$i; sleep 0.05; done"
    raw = asyncio.run(
        run_command(["sh", "-c", script], 60.0, stop_when=lambda out: out.count(b"\n") >= 3)
    )
    assert not raw.timed_out and raw.returncode != 0
    lines = raw.stdout.splitlines()
    assert lines[:3] == ["line1", "line2", "line3"] and len(lines) < 200
    # A predicate that never holds changes nothing.
    done = asyncio.run(run_command(["sh", "-c", "echo a; echo b"], 30.0, stop_when=lambda _: False))
    assert (done.returncode, done.stdout, done.timed_out) == (0, "a\nb\n", False)

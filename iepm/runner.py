"""Run external programs safely: argv lists only, a deadline, and group kills.

Every command runs in a new session (so in its own process group). When its deadline passes it
is sent SIGTERM, then SIGKILL after a grace period, as a whole group; the kill itself has a
deadline. When a command finishes normally its group is still swept with SIGKILL so that no
forked helper outlives the run. Output read before a kill is kept, for diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from iepm.errors import ToolNotFound
from iepm.results import utcnow

DEFAULT_KILL_GRACE_S = 2.0
# After SIGKILL the kernel reaps quickly; if it has not within this, we stop waiting.
KILL_WAIT_S = 5.0
# How long a run waits, after its final SIGKILL, for the group's members to be gone.
GROUP_GONE_WAIT_S = 0.5
READ_CHUNK = 65536


def new_token() -> str:
    return uuid.uuid4().hex[:16]


@dataclass(frozen=True)
class RawRun:
    """What one execution of a tool produced. ``parse()`` functions take only this."""

    argv: tuple[str, ...]
    stdout: str
    stderr: str = ""
    returncode: int | None = 0
    timed_out: bool = False
    started_at: datetime = field(default_factory=utcnow)
    duration_s: float = 0.0
    token: str = field(default_factory=new_token)
    pid: int | None = None

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def diags(self, limit: int = 4000) -> str:
        """The exact command line, how it ended and the tail of stderr: what a person needs."""
        ending = "killed at deadline" if self.timed_out else f"exit {self.returncode}"
        text = f"{self.command_line}\n[{ending} after {self.duration_s:.2f} s]"
        if self.stderr.strip():
            text += "\nstderr:\n" + self.stderr.strip()[-limit:]
        return text


_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: if the monitor is killed (even -9), the kernel kills the tool.

    Without this a ``kill -9`` of the scheduler would orphan an iperf3 or ping in flight.
    """
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed credentials (setuid helper): nothing more we can do to it.
        return False
    return True


async def _group_gone(pgid: int, wait_s: float) -> None:
    """Give a SIGKILLed group a moment to disappear, so that a caller checking PIDs right after
    the run sees none. (A zombie whose new parent never reaps it keeps the group alive: hence
    the bound.)"""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)  # signal 0: only asks whether any member exists
        except (ProcessLookupError, PermissionError):
            return
        await asyncio.sleep(0.01)


async def _drain(stream: asyncio.StreamReader | None, sink: bytearray) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(READ_CHUNK)
        if not chunk:
            return
        sink.extend(chunk)


def resolve_executable(name: str) -> str:
    """Absolute path of a tool, or ToolNotFound naming it and the PATH searched."""
    if os.sep in name:
        if os.access(name, os.X_OK):
            return name
        raise ToolNotFound(f"{name}: not found or not executable")
    found = shutil.which(name)
    if found is None:
        raise ToolNotFound(
            f"'{name}' is not installed or not on PATH (PATH={os.environ.get('PATH', '')}); "
            f"install it (Debian: apt-get install {_debian_package(name)})"
        )
    return found


def _debian_package(tool: str) -> str:
    return {"ping": "iputils-ping", "ip": "iproute2"}.get(tool, tool)


async def run_command(
    argv: Sequence[str],
    timeout_s: float,
    *,
    kill_grace_s: float = DEFAULT_KILL_GRACE_S,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin_data: bytes | None = None,
) -> RawRun:
    """Run ``argv`` with a deadline; never raises for the tool's own failures.

    Raises ToolNotFound when ``argv[0]`` cannot be executed. A tool that outlives ``timeout_s``
    yields ``timed_out=True`` with whatever output it produced before the kill.
    """
    if not argv:
        raise ValueError("empty argv")
    argv = tuple(str(a) for a in argv)
    executable = resolve_executable(argv[0])
    started_at = utcnow()
    t0 = time.monotonic()
    try:
        # argv[0] stays as given (tools name themselves by it in messages); the resolved path
        # is what runs. The C locale keeps outputs parsable whatever the host's language.
        proc = await asyncio.create_subprocess_exec(
            *argv,
            executable=executable,
            stdin=asyncio.subprocess.PIPE if stdin_data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            env={**(dict(env) if env is not None else os.environ), "LC_ALL": "C"},
            cwd=cwd,
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise ToolNotFound(f"{argv[0]}: cannot execute: {exc.strerror}") from exc
    pgid = proc.pid  # start_new_session makes the child its group leader
    out, err = bytearray(), bytearray()
    if stdin_data is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
        proc.stdin.close()
    readers = asyncio.gather(_drain(proc.stdout, out), _drain(proc.stderr, err))
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.gather(readers, proc.wait())), timeout_s)
    except TimeoutError:
        timed_out = True
        await _terminate_group(proc, pgid, kill_grace_s)
    except asyncio.CancelledError:
        await _terminate_group(proc, pgid, kill_grace_s)
        raise
    finally:
        # Sweep stragglers (forked helpers still in the group), then stop reading.
        if _signal_group(pgid, signal.SIGKILL):
            await _group_gone(pgid, GROUP_GONE_WAIT_S)
        if not readers.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(readers), 1.0)
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await readers
    return RawRun(
        argv=argv,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        returncode=proc.returncode,
        timed_out=timed_out,
        started_at=started_at,
        duration_s=time.monotonic() - t0,
        pid=proc.pid,
    )


async def _terminate_group(proc: asyncio.subprocess.Process, pgid: int, grace_s: float) -> None:
    """TERM the group, wait ``grace_s``, then KILL it; never waits more than grace + KILL_WAIT_S."""
    if _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)
    _signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), KILL_WAIT_S)


_version_cache: dict[tuple[str, ...], str | None] = {}  # by (PATH, *argv)


async def tool_version(argv: Sequence[str], timeout_s: float = 5.0) -> str | None:
    """First non-empty line a tool prints for its version flag, cached per argv."""
    key = (os.environ.get("PATH", ""), *argv)
    if key not in _version_cache:
        try:
            raw = await run_command(argv, timeout_s)
        except ToolNotFound:
            return None
        text = (raw.stdout + "\n" + raw.stderr).strip()
        _version_cache[key] = text.splitlines()[0].strip() if text else None
    return _version_cache[key]

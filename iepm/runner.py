"""Run external programs safely: argv lists only, a deadline, and group kills.

This is the project's one process supervisor: everything that starts a tool (probes, early stop,
the lab, the demo, the agent's servers) goes through :func:`start_process` (asyncio) or
:func:`start_process_sync` (threads and synchronous callers), and stops it with ``stop()``.

Every tool runs in a new session (so in its own process group) and dies with the monitor:
``PR_SET_PDEATHSIG`` kills it at once when the monitor is root, and a guardian process (one per
monitor, :class:`_Guardian`) covers what PDEATHSIG cannot — the kernel clears PDEATHSIG when an
unprivileged monitor execs a binary with file capabilities (Debian's ``ping``). The guardian
holds one end of a socket whose other end only the monitor holds; when the monitor is gone, even
by ``kill -9``, the guardian reads EOF and SIGKILLs every process group still registered.

Stopping is always the same: SIGTERM to the group, :data:`GRACE_S` to end, SIGKILL to the group,
a bounded wait for the leader, and a sweep of stragglers (forked helpers still in the group) with
a bounded wait for the group to be gone. Output read before a kill is kept, for diagnostics.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from iepm.errors import ToolNotFound
from iepm.results import utcnow

# The one grace period between SIGTERM and SIGKILL, for every tool the project starts.
GRACE_S = 2.0
DEFAULT_KILL_GRACE_S = GRACE_S  # the name run_command's callers know
# After SIGKILL the kernel reaps quickly; if it has not within this, we stop waiting.
KILL_WAIT_S = 5.0
# How long a stop waits, after its final SIGKILL, for the group's members to be gone.
GROUP_GONE_WAIT_S = 0.5
READ_CHUNK = 65536

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


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


# --- dying with the monitor ---------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_MSG_DONTWAIT = 0x40
_MSG_NOSIGNAL = 0x4000

# Runs as ``python -I -S -c`` (no imports of ours: it starts in tens of ms). It detaches from the
# monitor (so it is nobody's child process to count or reap), reads "+PGID"/"-PGID" lines from
# fd 0 and, at EOF — every copy of the monitor's end closed: the monitor is gone — SIGKILLs the
# groups still registered. A group whose leader PID now belongs to another process (other start
# time) is left alone.
_GUARDIAN_CODE = r"""
import os, signal, socket
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(s, signal.SIG_IGN)
if os.fork():
    os._exit(0)
def start(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
        return text[text.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None
sock = socket.socket(fileno=0)
groups, buf = {}, b""
while True:
    try:
        data = sock.recv(65536)
    except InterruptedError:
        continue
    except OSError:
        break
    if not data:
        break
    buf += data
    *lines, buf = buf.split(b"\n")
    for line in lines:
        try:
            pid = int(line[1:])
        except ValueError:
            continue
        if line[:1] == b"+":
            groups.setdefault(pid, start(pid))
        else:
            groups.pop(pid, None)
for pid, ticks in groups.items():
    now = start(pid)
    if now is not None and ticks is not None and now != ticks:
        continue
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
"""
GUARDIAN_START_S = 10.0  # the launcher forks and exits at once; on a loaded box it may be slow


class _Guardian:
    """The monitor's end of the guardian's socket, and the groups registered with it.

    Tools register themselves in the child, before exec (so a monitor killed right after the
    fork cannot leave one unregistered); the parent registers them again (in case the child's
    non-blocking send found the socket full) and unregisters them once they are stopped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._owner_pid = 0
        self._groups: set[int] = set()

    def fd(self) -> int | None:
        """The socket a child registers through, starting the guardian when it is not running;
        None when it cannot be started (PDEATHSIG is then the only line of defence)."""
        with self._lock:
            if self._owner_pid != os.getpid() and self._sock is not None:
                # A forked copy of the monitor starts its own guardian; its copy of the
                # parent's socket would keep the parent's guardian from seeing EOF.
                self._sock.close()
                self._sock, self._groups = None, set()
            if self._sock is not None and self._gone(self._sock):
                self._sock.close()
                self._sock = None
            if self._sock is None:
                self._sock = self._start()
                self._owner_pid = os.getpid()
                for pgid in self._groups:  # a restarted guardian learns what is running
                    self._send(f"+{pgid}")
            return self._sock.fileno() if self._sock is not None else None

    def started(self) -> bool:
        """Whether this process has its guardian (fd() would not have to start one)."""
        return self._sock is not None and self._owner_pid == os.getpid()

    @staticmethod
    def _gone(sock: socket.socket) -> bool:
        # The guardian never writes: readable means EOF (it died, e.g. someone killed it).
        return bool(select.select([sock], [], [], 0)[0])

    @staticmethod
    def _start() -> socket.socket | None:
        # sys.executable may be a path this user cannot run (a venv linked into a private home
        # directory); /proc/self/exe is the very binary running us.
        for python in dict.fromkeys([sys.executable, "/proc/self/exe", shutil.which("python3")]):
            if python:
                sock = _Guardian._launch(python)
                if sock is not None:
                    return sock
        return None

    @staticmethod
    def _launch(python: str) -> socket.socket | None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            launcher = subprocess.Popen(
                [python, "-I", "-S", "-c", _GUARDIAN_CODE, "iepm-guardian"],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C or a kill of the monitor's group spares it
            )
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        try:
            launcher.wait(GUARDIAN_START_S)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(KILL_WAIT_S)
        if launcher.returncode != 0:
            ours.close()
            return None
        ours.settimeout(1.0)  # a frozen guardian must not hang the monitor
        return ours

    def _send(self, message: str) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(message.encode() + b"\n")

    def register(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        with self._lock:
            if pgid in self._groups:
                self._groups.discard(pgid)
                self._send(f"-{pgid}")


_guardian = _Guardian()


def _child_setup(guardian_fd: int | None) -> Callable[[], None]:
    """What a tool's child process does before exec (it is already its own session leader)."""

    def setup() -> None:
        # If the monitor is killed (even -9), the kernel kills the tool — unless the exec that
        # follows clears this (file capabilities, unprivileged): the guardian covers that.
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if guardian_fd is not None:
            message = b"+%d\n" % os.getpid()
            _libc.send(guardian_fd, message, len(message), _MSG_DONTWAIT | _MSG_NOSIGNAL)

    return setup


# --- signalling groups --------------------------------------------------------------------------


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to a process group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed credentials (setuid helper): nothing more we can do to it.
        return False
    return True


def _group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)  # signal 0: only asks whether any member exists
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _group_gone(pgid: int, wait_s: float) -> None:
    """Give a SIGKILLed group a moment to disappear, so that a caller checking PIDs right after
    the run sees none. (A zombie whose new parent never reaps it keeps the group alive: hence
    the bound.)"""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_exists(pgid):
        await asyncio.sleep(0.01)


def _group_gone_sync(pgid: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _group_exists(pgid):
        time.sleep(0.01)


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
    packages = {"ping": "iputils-ping", "ip": "iproute2"}
    packages |= {"xrdcp": "xrootd-client", "xrootd": "xrootd-server", "xrdfs": "xrootd-client"}
    return packages.get(tool, tool)


def _prepare(
    argv: Sequence[str],
    env: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    die_with_monitor: bool,
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """argv as strings and what both the asyncio and the subprocess start take."""
    if not argv:
        raise ValueError("empty argv")
    args = tuple(str(a) for a in argv)
    options: dict[str, Any] = {
        # argv[0] stays as given (tools name themselves by it in messages); the resolved path
        # is what runs. The C locale keeps outputs parsable whatever the host's language.
        "executable": resolve_executable(args[0]),
        "env": {**(dict(env) if env is not None else os.environ), "LC_ALL": "C"},
        "cwd": cwd,
        "start_new_session": True,
        "preexec_fn": _child_setup(_guardian.fd()) if die_with_monitor else None,
    }
    return args, options


def _cannot_execute(args: tuple[str, ...], exc: OSError) -> ToolNotFound:
    return ToolNotFound(f"{args[0]}: cannot execute: {exc.strerror}")


# --- the supervisor -----------------------------------------------------------------------------


@dataclass
class Supervised:
    """A tool started by :func:`start_process`: the leader of its own process group.

    ``stop()`` ends the whole group within ``grace_s + KILL_WAIT_S + GROUP_GONE_WAIT_S``;
    call it (or ``sweep()`` after the tool exited by itself) when done with the tool.
    """

    process: asyncio.subprocess.Process
    argv: tuple[str, ...]
    started_at: datetime = field(default_factory=utcnow)
    t0: float = field(default_factory=time.monotonic)
    registered: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def pgid(self) -> int:
        return self.process.pid  # a new session makes the child its group leader

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def signal(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the whole group (e.g. SIGINT for iperf3's final report)."""
        return signal_group(self.pgid, sig)

    async def wait(self, timeout_s: float | None = None) -> int | None:
        """The exit status, or None if the leader is still running after ``timeout_s``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.wait()), timeout_s)
        return self.process.returncode

    async def terminate(self, grace_s: float = GRACE_S) -> None:
        """SIGTERM the group, wait ``grace_s``, SIGKILL it, wait at most KILL_WAIT_S."""
        if self.process.returncode is None and self.signal(signal.SIGTERM):
            await self.wait(grace_s)
        self.signal(signal.SIGKILL)
        await self.wait(KILL_WAIT_S)

    async def sweep(self) -> None:
        """SIGKILL what is left of the group (forked helpers), wait a moment for it to go."""
        if self.signal(signal.SIGKILL):
            await _group_gone(self.pgid, GROUP_GONE_WAIT_S)
        if self.registered:
            _guardian.unregister(self.pgid)
            self.registered = False

    async def stop(self, grace_s: float = GRACE_S) -> int | None:
        """TERM, grace, KILL, sweep: the group is gone (or as gone as the deadlines allow)."""
        await self.terminate(grace_s)
        await self.sweep()
        return self.process.returncode


async def start_process(
    argv: Sequence[str],
    *,
    stdin: int | None = DEVNULL,
    stdout: int | IO[Any] | None = PIPE,
    stderr: int | IO[Any] | None = PIPE,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    die_with_monitor: bool = True,
) -> Supervised:
    """Start ``argv`` (never a shell) in a new session, dying with the monitor; the stream
    arguments take PIPE, DEVNULL, STDOUT, a file or a descriptor, as subprocess does.

    Raises ToolNotFound when ``argv[0]`` cannot be executed.
    """
    if die_with_monitor and not _guardian.started():
        await asyncio.to_thread(_guardian.fd)  # starting it takes a moment: not in the loop
    args, options = _prepare(argv, env, cwd, die_with_monitor)
    started_at, t0 = utcnow(), time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *args, stdin=stdin, stdout=stdout, stderr=stderr, **options
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise _cannot_execute(args, exc) from exc
    if die_with_monitor:
        _guardian.register(proc.pid)
    return Supervised(proc, args, started_at, t0, registered=die_with_monitor)


@dataclass
class SyncSupervised:
    """A tool started by :func:`start_process_sync`; the same stop as :class:`Supervised`."""

    popen: subprocess.Popen[Any]
    argv: tuple[str, ...]
    registered: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def signal(self, sig: signal.Signals) -> bool:
        return signal_group(self.popen.pid, sig)

    def wait(self, timeout_s: float | None = None) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout_s)
        return self.popen.returncode

    def terminate(self, grace_s: float = GRACE_S) -> None:
        if self.popen.poll() is None and self.signal(signal.SIGTERM):
            self.wait(grace_s)
        self.signal(signal.SIGKILL)
        self.wait(KILL_WAIT_S)

    def sweep(self) -> None:
        if self.signal(signal.SIGKILL):
            _group_gone_sync(self.popen.pid, GROUP_GONE_WAIT_S)
        if self.registered:
            _guardian.unregister(self.popen.pid)
            self.registered = False

    def stop(self, grace_s: float = GRACE_S) -> int | None:
        self.terminate(grace_s)
        self.sweep()
        return self.popen.returncode


def start_process_sync(
    argv: Sequence[str],
    *,
    stdin: int | IO[Any] | None = DEVNULL,
    stdout: int | IO[Any] | None = PIPE,
    stderr: int | IO[Any] | None = PIPE,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    text: bool = False,
    die_with_monitor: bool = True,
) -> SyncSupervised:
    """:func:`start_process` for synchronous callers (the lab builder, pytest fixtures).

    ``die_with_monitor=False`` is for helpers that must outlive the command that started them
    (the lab's delay lines outlive ``iepm lab up``; its state file is what stops them).
    """
    args, options = _prepare(argv, env, cwd, die_with_monitor)
    try:
        popen = subprocess.Popen(
            args, stdin=stdin, stdout=stdout, stderr=stderr, text=text, **options
        )
    except (FileNotFoundError, PermissionError) as exc:
        raise _cannot_execute(args, exc) from exc
    if die_with_monitor:
        _guardian.register(popen.pid)
    return SyncSupervised(popen, args, registered=die_with_monitor)


def stop_groups(
    leaders: Iterable[int], alive: Callable[[int], bool], grace_s: float = GRACE_S
) -> list[int]:
    """Stop process groups we may not have started ourselves (the lab's recorded helpers):
    TERM each group and its leader, wait ``grace_s`` for the leaders, KILL what remains, wait
    at most KILL_WAIT_S. ``alive(pid)`` says whether a leader is still the process meant (PID
    reuse). Returns the leaders still alive."""
    leaders = list(leaders)
    live = [pid for pid in leaders if alive(pid)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        for pid in live:
            signal_group(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)  # not a group leader if someone setsid'ed it
        deadline = time.monotonic() + wait_s
        while live and time.monotonic() < deadline:
            for pid in live:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)  # reap our own children
            live = [pid for pid in live if alive(pid)]
            if live:
                time.sleep(0.02)
        if not live:
            break
    for pid in leaders:
        _guardian.unregister(pid)  # stopped: the guardian must not kill a reused PID later
    return live


async def _drain(
    stream: asyncio.StreamReader | None,
    sink: bytearray,
    enough: Callable[[bytes], bool] | None = None,
    done: asyncio.Event | None = None,
) -> None:
    if stream is None:
        return
    while True:
        chunk = await stream.read(READ_CHUNK)
        if not chunk:
            return
        sink.extend(chunk)
        if enough is not None and done is not None and not done.is_set() and enough(bytes(sink)):
            done.set()


async def run_command(
    argv: Sequence[str],
    timeout_s: float,
    *,
    kill_grace_s: float = GRACE_S,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stdin_data: bytes | None = None,
    stop_when: Callable[[bytes], bool] | None = None,
) -> RawRun:
    """Run ``argv`` with a deadline; never raises for the tool's own failures.

    Raises ToolNotFound when ``argv[0]`` cannot be executed. A tool that outlives ``timeout_s``
    yields ``timed_out=True`` with whatever output it produced before the kill.
    ``stop_when(stdout so far)`` True: the tool has said enough and is stopped (SIGINT, then
    as at the deadline), not counted as timed out — e.g. traceroute past its gap limit.
    """
    tool = await start_process(
        argv, stdin=PIPE if stdin_data is not None else DEVNULL, env=env, cwd=cwd
    )
    proc = tool.process
    out, err = bytearray(), bytearray()
    if stdin_data is not None and proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(stdin_data)
            await proc.stdin.drain()
        proc.stdin.close()
    enough = asyncio.Event()
    readers = asyncio.gather(_drain(proc.stdout, out, stop_when, enough), _drain(proc.stderr, err))
    timed_out = False
    finished = asyncio.gather(readers, proc.wait())
    said_enough = asyncio.ensure_future(enough.wait())
    try:
        await asyncio.wait_for(
            asyncio.wait([finished, said_enough], return_when=asyncio.FIRST_COMPLETED),
            timeout_s,
        )
        if not finished.done():
            tool.signal(signal.SIGINT)
            await tool.terminate(kill_grace_s)
    except TimeoutError:
        timed_out = True
        await tool.terminate(kill_grace_s)
    except asyncio.CancelledError:
        await tool.terminate(kill_grace_s)
        raise
    finally:
        said_enough.cancel()
        # Sweep stragglers (forked helpers still in the group), then stop reading.
        await tool.sweep()
        if not finished.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(finished), 1.0)
            finished.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await finished
    return RawRun(
        argv=tool.argv,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        returncode=proc.returncode,
        timed_out=timed_out,
        started_at=tool.started_at,
        duration_s=time.monotonic() - tool.t0,
        pid=proc.pid,
    )


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

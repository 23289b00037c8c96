"""Namespaces, `ip` commands and process bookkeeping for the lab (synchronous).

Processes start and stop through :mod:`iepm.runner`'s supervisor (its synchronous half: the lab
builder is called from the CLI, from pytest fixtures and from threads): argv lists only, every
command in its own process group with a deadline, the group swept with SIGKILL afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iepm.errors import LabError, ToolNotFound
from iepm.runner import GRACE_S, SyncSupervised, start_process_sync, stop_groups

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
IP_TIMEOUT_S = 20.0


def effective_caps() -> int:
    """The effective capability mask of this process."""
    with contextlib.suppress(OSError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def require_privileges() -> None:
    """Raise LabError unless we may create namespaces and TUN devices."""
    needed = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)
    if os.geteuid() != 0 and effective_caps() & needed != needed:
        raise LabError(
            "iepm lab needs root: building network namespaces and TUN devices requires "
            "CAP_NET_ADMIN and CAP_SYS_ADMIN. Run it as root (e.g. `sudo iepm lab up FILE`), or in "
            "a container started with `--cap-add NET_ADMIN --cap-add SYS_ADMIN --device "
            "/dev/net/tun`."
        )
    if not os.path.exists("/dev/net/tun"):
        raise LabError("/dev/net/tun is missing: load the tun module (`modprobe tun`)")
    if shutil.which("ip") is None:
        raise LabError("the `ip` command is missing: apt-get install iproute2")


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = IP_TIMEOUT_S,
    stdin: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a short command with a deadline; LabError when it fails or overruns (if ``check``)."""
    tool = _start(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL)
    try:
        out, err = tool.popen.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tool.stop(grace_s=0.0)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            tool.popen.communicate(timeout=5.0)
        raise LabError(f"`{shlex.join(tool.argv)}` did not finish within {timeout_s:g} s") from None
    finally:
        tool.sweep()  # no forked helper outlives the command
    if check and tool.returncode != 0:
        detail = (err or out).strip()
        raise LabError(f"`{shlex.join(tool.argv)}` failed (exit {tool.returncode}): {detail}")
    return subprocess.CompletedProcess(list(tool.argv), tool.popen.returncode, out, err)


def _start(argv: Sequence[str], **kwargs: Any) -> SyncSupervised:
    """The runner's supervisor, with the lab's error type."""
    try:
        return start_process_sync(argv, text=True, **kwargs)
    except ToolNotFound as exc:
        raise LabError(str(exc)) from exc


def ip_batch(netns: str | None, commands: Iterable[str]) -> None:
    """Run many `ip` commands in one process (``ip [-n NS] -batch -``)."""
    lines = [c for c in commands if c]
    if not lines:
        return
    argv = ["ip", *(["-n", netns] if netns else []), "-batch", "-"]
    run(argv, stdin="\n".join(lines) + "\n")


def list_netns() -> list[str]:
    out = run(["ip", "-j", "netns", "list"]).stdout.strip()
    if not out:
        return []
    return [entry["name"] for entry in json.loads(out)]


def netns_pids(netns: str) -> list[int]:
    res = run(["ip", "netns", "pids", netns], check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()]


def route_dev(netns: str, address: str) -> str | None:
    """Device the kernel of ``netns`` would use to reach ``address``."""
    res = run(["ip", "-n", netns, "-j", "route", "get", address], check=False)
    if res.returncode != 0 or not res.stdout.strip():
        return None
    entries: list[dict[str, Any]] = json.loads(res.stdout)
    return entries[0].get("dev") if entries else None


# --- processes ----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after "pid (comm)" (field 3 of stat is index 0 here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), to tell a reused PID apart."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None  # field 22 of stat


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks."""
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12]) if fields else None


@dataclass
class ProcRecord:
    """A process the lab started: enough to find it again and be sure it is the same one."""

    role: str
    pid: int
    start: int | None
    argv: list[str]
    node: str | None = None
    link: str | None = None

    def alive(self) -> bool:
        fields = _stat_fields(self.pid)
        # The same process (start time), and running (not a zombie waiting to be reaped).
        return (
            self.start is not None
            and fields is not None
            and int(fields[19]) == self.start
            and fields[0] != "Z"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "pid": self.pid,
            "start": self.start,
            "argv": self.argv,
            "node": self.node,
            "link": self.link,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ProcRecord:
        return cls(**raw)


def spawn(
    argv: Sequence[str],
    *,
    role: str,
    log: Path | None = None,
    die_with_monitor: bool = False,
    **where: str | None,
) -> tuple[subprocess.Popen[bytes], ProcRecord]:
    """Start a long-lived helper in its own process group, output to ``log``.

    By default it outlives this process (the delay lines outlive ``iepm lab up``): the state
    file's record is what stops it. ``die_with_monitor`` also ends it with this process.
    """
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        tool = start_process_sync(
            argv, stdout=sink, stderr=subprocess.STDOUT, die_with_monitor=die_with_monitor
        )
    except ToolNotFound as exc:
        raise LabError(str(exc)) from exc
    finally:
        if log is not None and not isinstance(sink, int):
            sink.close()
    proc: subprocess.Popen[bytes] = tool.popen
    return proc, ProcRecord(role, proc.pid, start_time(proc.pid), list(tool.argv), **where)


def terminate(records: Iterable[ProcRecord], grace_s: float = GRACE_S) -> list[ProcRecord]:
    """TERM each live recorded process group, KILL what remains; returns the survivors."""
    by_pid = {rec.pid: rec for rec in records}
    left = stop_groups(by_pid, lambda pid: by_pid[pid].alive(), grace_s)
    return [by_pid[pid] for pid in left]


def kill_pids(pids: Iterable[int], timeout_s: float = 5.0) -> list[int]:
    """SIGKILL processes found inside a lab namespace; returns those still present."""
    targets = [(pid, start_time(pid)) for pid in pids]
    for pid, _ in targets:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    remaining = targets
    while remaining and time.monotonic() < deadline:
        for pid, _ in remaining:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        remaining = [(p, st) for p, st in remaining if st is not None and start_time(p) == st]
        remaining = [(p, st) for p, st in remaining if not _zombie(p)]
        if remaining:
            time.sleep(0.02)
    return [p for p, _ in remaining]


def _zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is None or fields[0] == "Z"

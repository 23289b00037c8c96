"""Namespaces, `ip` commands and process bookkeeping for the lab (synchronous).

Same discipline as :mod:`iepm.runner`: argv lists only, every command in its own process group
with a deadline, the group swept with SIGKILL afterwards. The lab builder is synchronous (it is
called from the CLI, from pytest fixtures and from threads), so it cannot use the async runner.
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

from iepm.errors import LabError

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


def _kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def run(
    argv: Sequence[str],
    *,
    timeout_s: float = IP_TIMEOUT_S,
    stdin: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a short command with a deadline; LabError when it fails or overruns (if ``check``)."""
    argv = [str(a) for a in argv]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise LabError(f"{argv[0]}: cannot execute: {exc.strerror}") from exc
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=5.0)
        raise LabError(f"`{shlex.join(argv)}` did not finish within {timeout_s:g} s") from None
    finally:
        _kill_group(proc.pid)  # no forked helper outlives the command
    if check and proc.returncode != 0:
        detail = (err or out).strip()
        raise LabError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): {detail}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


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


def start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), to tell a reused PID apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of stat, counted after "pid (comm)"


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` in clock ticks."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


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
        if self.start is None:
            return False
        st = start_time(self.pid)
        if st != self.start:
            return False
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        return False

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
    argv: Sequence[str], *, role: str, log: Path | None = None, **where: str | None
) -> tuple[subprocess.Popen[bytes], ProcRecord]:
    """Start a long-lived helper in its own process group, output to ``log``."""
    argv = [str(a) for a in argv]
    sink = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise LabError(f"{argv[0]}: cannot execute: {exc.strerror}") from exc
    finally:
        if log is not None and not isinstance(sink, int):
            sink.close()
    return proc, ProcRecord(role, proc.pid, start_time(proc.pid), argv, **where)


def terminate(records: Iterable[ProcRecord], grace_s: float = 2.0) -> list[ProcRecord]:
    """TERM each live recorded process group, KILL what remains; returns the survivors."""
    live = [r for r in records if r.alive()]
    for rec in live:
        _kill_group(rec.pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)  # not a group leader if someone setsid'ed it
    _wait_gone(live, grace_s)
    for rec in live:
        if rec.alive():
            _kill_group(rec.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
    _wait_gone(live, 5.0)
    return [r for r in live if r.alive()]


def _wait_gone(records: list[ProcRecord], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for rec in records:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(rec.pid, os.WNOHANG)  # reap our own children
        if not any(r.alive() for r in records):
            return
        time.sleep(0.02)


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
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True

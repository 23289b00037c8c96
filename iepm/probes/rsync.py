"""Copies over SSH with ``rsync -e ssh``: what the memory-to-memory and disk-to-disk probes share.

Why rsync rather than scp/sftp: it is what sites move data with over SSH, it reports its own
rate (the progress line of each file: bytes, rate, elapsed time) and its own totals when its
output is not a terminal (scp and sftp draw their meters only on a terminal), and it commits a
copy itself (``--fsync``, rsync ≥ 3.2.4). SSH is one TCP connection per copy: parallel
streams are several rsyncs at once, one part of the copy and one SSH connection each (as
fpsync or ``xargs -P rsync``), under one stamp.py (``--all``) so that the set is one raw record.
One connection falls behind under load: its four processes (rsync, ssh, sshd, rsync) do not get
the CPUs when they need them and TCP idles (README, "Copies over SSH").

Neither rsync nor ssh stamps its lines with a time, so the command runs under
:mod:`.stamp` (Debian's python3), which prefixes every line of rsync's stdout and ssh's ``-v``
log with the time it was read: ``parse()`` stays pure and ``iepm extract`` rebuilds the timers
from the raw log. Learnt from rsync 3.5.0 with OpenSSH 9.2p1:

* **set-up** runs from the start to the file's name line, which rsync prints as it starts
  sending the file (ssh connects, exchanges keys and authenticates — **connect** ends at ssh's
  "Authenticated to" — then the remote rsync starts and the two agree on the protocol and the
  file list). The first progress line comes only at rsync's first one-second tick; rsync's
  stdout is unbuffered (``--outbuf=N``) or every line would be stamped at exit;
* **transfer** from the name line to the sender's ``100%`` line (the last byte left the
  sender); **commit** from there to the target's rsync exiting (ssh -v's "exit-status"; else
  rsync's summary): the receiver writes what is still in flight, ``--fsync``s it (commit =
  at_end) and renames it. ``committed_throughput_bps`` is bytes over transfer + commit;
* rsync's own figures: the ``100%`` line's rate over its transfer (binary units: kB/s is KiB/s,
  ``tool_throughput_bps``) and the summary's bytes/sec over its whole run counted in whole
  seconds (``summary_throughput_bps``: the set-up bias the seeds found in bbftp, and more).
* On the target rsync runs under ``timeout -s KILL`` with its process group recorded in the
  lease's directory, so that the lease (or the target itself, when the monitor is gone) kills
  it when the directory is removed.
"""

from __future__ import annotations

import contextlib
import math
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from pydantic import Field

from iepm.errors import RemoteError, ToolFailed
from iepm.probes import copy
from iepm.probes.base import (
    SSH_LOGIN,
    Column,
    ProbeContext,
    ServerLease,
    ServerNeed,
    SshLogin,
    failed_result,
    figure,
)
from iepm.results import Result
from iepm.runner import RawRun, resolve_executable, run_command, tool_version

TOOL = "rsync"
VERSION_ARGV = ("rsync", "--version")
SSH_VERSION_ARGV = ("ssh", "-V")
STAMP_PYTHON = copy.STAMP_PYTHON
STAMP_SCRIPT = copy.STAMP_SCRIPT
# stamp.py's flag for several tools at once; each line then carries its tool's place: "<I> ".
ALL = "--all"
TAGGED = re.compile(r"^<(?P<i>\d+)> (?P<text>.*)$")
MAX_STREAMS = 16
# The lease's directory lists the process groups of the tools a copy runs on the target.
PIDS_FILE = ".iepm-pids"
# Seconds the remote rsync may outlive the probe's deadline before the target kills it.
REMOTE_GRACE_S = 5
Cipher = Literal[
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
]

PROGRESS = re.compile(
    r"^\s*(?P<bytes>[\d,]+)\s+(?P<pct>\d+)%\s+(?P<rate>[\d.]+)(?P<unit>[kMG])B/s\s+"
    r"(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d)"
)
SUMMARY = re.compile(
    r"^sent (?P<sent>[\d,]+) bytes\s+received (?P<received>[\d,]+) bytes\s+"
    r"(?P<rate>[\d,.]+) bytes/sec"
)
CIPHER = re.compile(r"kex: client->server cipher: (\S+)")
SSH_TOTAL = re.compile(r"^Transferred: sent (\d+), received (\d+) bytes, in ([\d.]+) seconds")
UNIT = {"k": 1024, "M": 1024**2, "G": 1024**3}

COLUMNS = [
    Column("bytes", "bytes copied"),
    Column("cipher", "the SSH cipher the copy ran with"),
    Column("setup_s", "connect, authenticate, start rsync on the target, file list, s"),
    Column("connect_s", "SSH connect and authentication (part of setup_s), s"),
    Column("transfer_s", "from rsync's first progress line to its 100% line, s"),
    Column("commit_s", "from the 100% line to rsync's summary (write-out, fsync, rename), s"),
    Column("elapsed_s", "rsync's whole run, s"),
    Column("throughput_bps", "bytes over transfer_s, bit/s"),
    Column("committed_throughput_bps", "bytes over transfer_s + commit_s, bit/s"),
    Column("end_to_end_throughput_bps", "bytes over elapsed_s (set-up included), bit/s"),
    Column("tool_throughput_bps", "rsync's own rate on its 100% line (streams: their sum), bit/s"),
    Column("summary_throughput_bps", "rsync's summary bytes/sec (whole seconds of its run), bit/s"),
    Column("streams", "rsync copies run at once, one file and one SSH connection each"),
    Column("connections", "SSH connections that authenticated"),
    Column("start_spread_s", "first to last name line: setup_s and transfer_s overlap by it, s"),
]


class CopySpec(copy.CopySpec):
    """One rsync copy over SSH to a private directory on an SSH target (removed afterwards)."""

    cipher: Cipher = Field(
        default="aes128-gcm@openssh.com",
        description="SSH cipher (AES-GCM uses the CPU's AES instructions; chacha20 does not)",
    )


PLACEHOLDER = SshLogin("root", 22, "~/.ssh/id_ed25519", "~/.ssh/known_hosts", 5.0)


def part_sizes(nbytes: int, streams: int) -> list[int]:
    """``nbytes`` split into ``streams`` parts, the first ones a byte larger for the remainder."""
    base, rest = divmod(nbytes, streams)
    return [base + (i < rest) for i in range(streams)]


def part_names(name: str, streams: int) -> list[str]:
    """The names of a copy's files: ``name`` itself for one stream, ``stem.I.ext`` for more."""
    if streams == 1:
        return [name]
    stem, dot, ext = name.rpartition(".")
    return [f"{stem}.{i}{dot}{ext}" if dot else f"{name}.{i}" for i in range(streams)]


def build_argv(
    spec: CopySpec,
    address: str,
    *,
    source: str | Sequence[str] = f"{copy.MEMORY_DIR}/iepm-xrdcp.src",
    directory: str = "/tmp/iepm-copy",
    name: str = "iepm-copy.dat",
    login: SshLogin = PLACEHOLDER,
    fsync: bool = False,
) -> list[str]:
    """The stamped command copying ``source`` to ``directory/name`` on the target; several
    sources: one rsync (one SSH connection) each, all at once under one stamp.py, to
    ``part_names(name)``."""
    sources = [source] if isinstance(source, str) else list(source)
    host = f"[{address}]" if ":" in address else address
    ssh = login.ssh_argv("-v", "-c", spec.cipher, connect_timeout_s=spec.connect_timeout_s)
    # Run through the target's login shell: record the process group (timeout leads it), and
    # the target kills rsync at the deadline whatever becomes of this monitor.
    remote = (
        f"echo $$ >> {shlex.quote(f'{directory}/{PIDS_FILE}')} 2>/dev/null; exec "
        f"timeout -s KILL {math.ceil(spec.duration_s) + REMOTE_GRACE_S} "
        f"{shlex.quote(login.rsync_path)}"
    )
    commands = [
        [
            "rsync", "--verbose", "--progress", "--stats", "--whole-file", "--no-compress",
            # Unbuffered: each progress line is stamped when rsync writes it, not at exit.
            "--outbuf=N",
            *(["--fsync"] if fsync else []),
            "-e", shlex.join(ssh), "--rsync-path", remote,
            source, f"{login.user}@{host}:{directory}/{part}",
        ]
        for source, part in zip(sources, part_names(name, len(sources)), strict=True)
    ]  # fmt: skip
    if len(commands) == 1:
        return [STAMP_PYTHON, "-I", STAMP_SCRIPT, *commands[0]]
    joined = [
        arg for i, command in enumerate(commands) for arg in (*(["--and"] if i else []), *command)
    ]
    return [STAMP_PYTHON, "-I", STAMP_SCRIPT, ALL, *joined]


# ---------------------------------------------------------------------------------------------
# parse


stamped = copy.stamped


def _number(text: str) -> int:
    return int(text.replace(",", ""))


_span = copy.span
_bps = copy.bps


def where(argv: tuple[str, ...]) -> str:
    dest = argv[-1] if argv else ""
    return dest.split(":", 1)[0] if ":" in dest else "the target"


def explain(lines: list[str], argv: tuple[str, ...]) -> str | None:
    """Why the copy failed, in words a person can act on (rsync's or ssh's line kept), or None
    when the output names no failure."""
    host = where(argv)
    text = "\n".join(lines)
    low = text.lower()

    def said(*needles: str) -> str:
        line = next((ln for ln in lines if any(n in ln.lower() for n in needles)), "")
        return f" ({line.strip()})" if line else ""

    if (
        "failed to run command" in low
        or "rsync: command not found" in low
        or ("rsync: not found" in low)
    ):
        return (
            f"rsync is not installed on {host} (Debian: apt-get install rsync), or the target's "
            f"rsync_path is wrong{said('failed to run', 'not found')}"
        )
    if "permission denied (publickey" in low:
        return (
            f"SSH to {host}: the target refused this monitor's key (public-key only, never a "
            f"password){said('permission denied')}"
        )
    if "host key verification failed" in low:
        return f"SSH to {host}: the host key is not in known_hosts or does not match"
    if "connection refused" in low:
        return f"SSH to {host}: connection refused — is sshd running on that port?"
    if ("timed out" in low and "connect" in low) or "no route to host" in low:
        return f"SSH to {host}: no answer in time{said('timed out', 'no route')}"
    if "no space left on device" in low or "disk quota exceeded" in low:
        return (
            f"no room for the copy on {host}: its file system is full"
            f"{said('no space left', 'quota')}"
        )
    if "permission denied" in low or "read-only file system" in low:
        return (
            f"{host} refused to write the copy: permission denied"
            f"{said('permission denied', 'read-only')}"
        )
    failure = next((ln for ln in reversed(lines) if ln.startswith("rsync: ")), None)
    if failure is None:
        failure = next((ln for ln in reversed(lines) if ln.startswith("rsync error: ")), None)
    return None if failure is None else f"rsync to {host} failed: {failure.strip()}"


Events = list[tuple[float, str]]


def by_stream(raw: RawRun) -> dict[int, tuple[Events, Events]]:
    """Each rsync's stamped (stdout, stderr) lines: one stream, or several run at once by
    ``stamp.py --all`` whose lines carry their place (``<I> ``, removed here)."""
    out, err = stamped(raw.stdout), stamped(raw.stderr)
    # stamp.py's own flag, wherever the command starts (ip netns exec ... in a namespace).
    at = next((i for i, arg in enumerate(raw.argv) if arg.endswith("stamp.py")), None)
    if at is None or raw.argv[at + 1 : at + 2] != (ALL,):
        return {0: (out, err)}
    streams: dict[int, tuple[Events, Events]] = {}
    for lines, side in ((out, 0), (err, 1)):
        for at, text in lines:
            m = TAGGED.match(text)
            if m is not None:
                streams.setdefault(int(m["i"]), ([], []))[side].append((at, m["text"]))
    return dict(sorted(streams.items()))


@dataclass
class Stream:
    """What one rsync's lines say: when each phase ended, its own figures (None: not reached)."""

    connected: float | None
    cipher: str | None
    started: float | None
    done: tuple[float, re.Match[str]] | None
    summary: tuple[float, re.Match[str]] | None
    committed: float | None
    ssh_total: re.Match[str] | None


def read_stream(out: Events, err: Events) -> Stream:
    connected = next((at for at, text in err if text.startswith("Authenticated to ")), None)
    cipher = next((m[1] for _, text in err if (m := CIPHER.search(text))), None)
    progress = [(i, at, m) for i, (at, text) in enumerate(out) if (m := PROGRESS.match(text))]
    # The file's name line: rsync prints it as it starts sending the file; its first progress
    # line comes only at the first one-second tick.
    started = None
    if progress:
        i, at, _ = progress[0]
        started = out[i - 1][0] if i > 0 and not PROGRESS.match(out[i - 1][1]) else at
    done = next(((at, m) for _, at, m in progress if m["pct"] == "100"), None)
    summary = next(((at, m) for at, text in out if (m := SUMMARY.match(text))), None)
    # The target's rsync exited (the copy written, fsynced, renamed): ssh -v logs its status.
    exited = next((at for at, text in err if "rtype exit-status" in text), None)
    committed = exited if exited is not None else summary[0] if summary else None
    ssh_total = next((m for _, text in err if (m := SSH_TOTAL.match(text))), None)
    return Stream(connected, cipher, started, done, summary, committed, ssh_total)


def _last(values: list[float | None]) -> float | None:
    """When the last stream reached a phase; None while any has not."""
    return None if not values or None in values else max(v for v in values if v is not None)


def parse(raw: RawRun, spec: CopySpec | None = None) -> dict[str, Any]:
    """Timers and rates from the stamped output of rsync and ssh -v, one rsync per stream:
    set-up until the last stream's name line, transfer from the first name line to the last
    100% line, commit to the last target rsync's exit. ToolFailed for their own errors,
    ParseError for output that is not a stamped rsync run."""
    streams = by_stream(raw)
    events = sorted(line for out, err in streams.values() for line in (*out, *err))
    if not events:
        raise copy.not_started("rsync", where(raw.argv), raw)
    first, last = events[0][0], events[-1][0]
    read = [read_stream(out, err) for out, err in streams.values()]
    done_all = all(r.done is not None for r in read)
    complete = (
        raw.returncode == 0
        and not raw.timed_out
        and done_all
        and all(r.summary is not None for r in read)
    )
    if raw.returncode not in (0, None) and not raw.timed_out:
        why = explain([text for _, text in events], raw.argv)
        if why is not None:
            raise ToolFailed(why)
    nbytes = sum(_number(r.done[1]["bytes"]) for r in read if r.done) if complete else None
    started = [r.started for r in read]
    first_started = min((at for at in started if at is not None), default=None)
    last_started = _last(started)
    last_done = _last([r.done[0] if r.done else None for r in read])
    transfer_s = _span(first_started, last_done)
    commit_s = _span(last_done, _last([r.committed for r in read]))
    elapsed_s = _span(first, last)
    tool_bps = tool_s = None
    if done_all:
        rates = [float(r.done[1]["rate"]) * UNIT[r.done[1]["unit"]] * 8 for r in read if r.done]
        tool_bps = round(sum(rates), 1)
        tool_s = max(
            int(m["h"]) * 3600 + int(m["m"]) * 60 + int(m["s"])
            for m in (r.done[1] for r in read if r.done)
        )
    summaries = [float(r.summary[1]["rate"].replace(",", "")) * 8 for r in read if r.summary]
    ssh_totals = [float(r.ssh_total[3]) for r in read if r.ssh_total]
    data: dict[str, Any] = {
        "complete": complete,
        "bytes": nbytes,
        "cipher": next((r.cipher for r in read if r.cipher), None),
        "setup_s": _span(first, last_started),
        "connect_s": _span(first, _last([r.connected for r in read])),
        "transfer_s": transfer_s,
        "commit_s": commit_s,
        "elapsed_s": elapsed_s,
        "throughput_bps": _bps(nbytes, transfer_s),
        "committed_throughput_bps": copy.committed_bps(nbytes, transfer_s, commit_s),
        "end_to_end_throughput_bps": _bps(nbytes, elapsed_s),
        "tool_throughput_bps": tool_bps,
        "tool_transfer_s": tool_s,
        "summary_throughput_bps": (
            round(sum(summaries), 1) if summaries and len(summaries) == len(read) else None
        ),
        "ssh_elapsed_s": max(ssh_totals) if len(ssh_totals) == len(read) else None,
        "streams": len(read),
        "connections": sum(r.connected is not None for r in read),
        "start_spread_s": _span(first_started, last_started),
    }
    if not complete:
        phase = (
            "connecting to the target"
            if any(r.connected is None for r in read)
            else "starting rsync on the target"
            if last_started is None
            else "copying"
            if not done_all
            else "committing the copy"
        )
        data["tool_error"] = f"rsync to {where(raw.argv)} did not finish: it was {phase}"
    return data


def check(data: dict[str, Any], spec: CopySpec) -> str | None:
    if not data.get("complete"):
        return str(data.get("tool_error") or "rsync did not finish the copy")
    if spec is not None and data.get("bytes") != spec.size_bytes:
        return f"rsync copied {data.get('bytes')} bytes, the spec asked for {spec.size_bytes}"
    if not data.get("throughput_bps"):
        return "rsync printed no transfer time: its output lacks the progress lines"
    return None


def summary(data: dict[str, Any]) -> str:
    mbps = copy.mbps
    return (
        f"{mbps(data.get('throughput_bps'))} over the transfer "
        f"({mbps(data.get('tool_throughput_bps'))} by rsync), "
        f"{mbps(data.get('end_to_end_throughput_bps'))} end to end; setup "
        f"{figure(data.get('setup_s'))} s, transfer {figure(data.get('transfer_s'))} s, commit "
        f"{figure(data.get('commit_s'))} s ({data.get('cipher') or '-'})"
    )


# ---------------------------------------------------------------------------------------------
# run


async def versions(ctx: ProbeContext) -> str | None:
    """rsync's version and OpenSSH's: both shape the output parse() reads."""
    found = [await tool_version(ctx.wrap(argv)) for argv in (VERSION_ARGV, SSH_VERSION_ARGV)]
    words = [v for v in found if v]
    return "; ".join(" ".join(w.split()) for w in words) or None


async def run_copy(
    module: ModuleType,
    spec: CopySpec,
    ctx: ProbeContext,
    storage: copy.Storage,
    sources: contextlib.AbstractContextManager[list[str]],
    *,
    fsync: bool = False,
) -> Result:
    """Lease a directory on the SSH target, copy ``sources`` into it (one rsync each, at once),
    log the run raw, parse it; failures as data, and the lease removes the directory and the
    target's rsyncs."""
    if ctx.servers is None:
        return failed_result(
            module,
            spec,
            ctx,
            f"{module.NAME} copies over SSH: give {ctx.target} an [targets.ssh] table (user, "
            "key_file, known_hosts) so that the monitor can log in there",
        )
    need = ServerNeed(
        kind=SSH_LOGIN,
        duration_s=math.ceil(spec.duration_s),
        size_bytes=spec.size_bytes,
        storage=storage,
    )

    async def run(lease: ServerLease, notes: list[str]) -> copy.Copied:
        if lease.login is None or lease.directory is None:
            raise RemoteError(f"{ctx.target}: the lease gave no SSH login or directory")
        name = f"iepm-{secrets.token_hex(8)}.dat"
        with sources as paths:
            argv = build_argv(
                spec,
                lease.address,
                source=paths,
                directory=lease.directory,
                name=name,
                login=lease.login,
                fsync=fsync,
            )
            raw = await run_command(ctx.wrap(argv), spec.deadline_s())
        return copy.Copied(raw, lease.address)

    async def version() -> str | None:
        for program in ("rsync", "ssh", STAMP_PYTHON):
            resolve_executable(program)
        return await versions(ctx)

    result, _ = await copy.leased_copy(module, spec, ctx, need, version, run)
    return result

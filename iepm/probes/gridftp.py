"""GridFTP copies with ``globus-url-copy``: what the memory-to-memory and disk-to-disk probes share.

The seeds' GridFTP, as Debian 12 packages it (``globus-gass-copy-progs`` on the monitor,
``globus-gridftp-server-progs`` on the target), in anonymous mode: no grid certificates, the
control and data channels in clear (``ftp://``). The target's agent starts the server for the
one copy (server kind ``gridftp``: its own home directory as the only path it may touch, one
session, the agent's deadline). Learnt from globus-url-copy 10.12 against the server 13.24:

* ``-dbg`` logs the control channel on stderr (each command and each reply) and one line per
  data block written and acknowledged, with no times: the command runs under :mod:`.stamp`,
  which prefixes every line with the time it was read, so ``parse()`` stays pure and
  ``iepm extract`` rebuilds the timers from the raw log.
* **connect** runs from the start to the server's ``230`` (logged in), **set-up** to its ``150
  Beginning transfer`` (after TYPE, MODE E, the buffer size, PASV, ALLO and STOR), **transfer**
  from there to the client's last data callback (``eof=true``, no error: the last byte left),
  **commit** from there to the server's ``226 Transfer Complete`` (the server wrote what was in
  flight and closed the file).
* ``-vb`` prints ``N bytes  X MB/sec avg  Y MB/sec inst`` lines on stdout (``\\r``-separated,
  block-buffered). The rate is computed from the server's performance markers (``112-Perf
  Marker``, sent every 5 s and at the end, time stamped to 0.1 s) and its MB is MiB: that is
  ``tool_throughput_bps``; a copy shorter than the markers' 0.1 s resolution reads high.
* ``-p N`` opens N data connections (MODE E), ``-tcp-bs`` sets the socket buffers on both
  ends (the server is told with ``SITE STORBUFSIZE``). ``-stall-timeout`` gives up when
  nothing moves, connecting included (globus-url-copy has no connect timeout of its own).
* A failure ends with ``error: ...`` and, when the server refused, its ``500-...`` lines (the
  system call's own words: "Permission denied", "No space left on device"); exit status 1.
* The server's file layer has no sync on close (``-sync-writes`` syncs only before restart
  markers; traced: no sync, fsync or fdatasync for a whole copy), so ``commit_s`` is the close,
  not a write-back: ``gridftp_disk`` offers ``commit = "none"`` only. Writing through a
  whitelisted ``dd conv=fsync`` on the server (``-DP``, the popen driver) was tried: 10.12 sent
  no disk-stack command to the anonymous server and the file layer wrote the file, unsynced.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import secrets
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import Field, field_validator

from iepm.errors import ToolFailed, ToolNotFound
from iepm.probes import copy
from iepm.probes.base import Column, ProbeContext, ServerLease, ServerNeed, figure
from iepm.results import Result
from iepm.runner import RawRun, resolve_executable, run_command, tool_version
from iepm.units import size_bytes

TOOL = "globus-url-copy"
SERVER = "gridftp"
CLIENT_PACKAGE = "globus-gass-copy-progs"
SERVER_PACKAGE = "globus-gridftp-server-progs"
DEFAULT_PORT = 2811
VERSION_ARGV = ("globus-url-copy", "-version")
MIN_WINDOW = 64 * 1024
MAX_WINDOW = 256 * 1024**2

REPLY = re.compile(r"^(?P<code>\d{3})[ -]")
EOF_SENT = re.compile(r"^debug: data callback, no error, .*offset=(?P<offset>\d+), eof=true")
PERF_TIME = re.compile(r"^\s*Timestamp:\s+(?P<at>[\d.]+)")
PERF_BYTES = re.compile(r"^\s*Stripe Bytes Transferred:\s+(?P<bytes>\d+)")
VB = re.compile(r"^\s*(?P<bytes>\d+) bytes\s+(?P<avg>[\d.]+) MB/sec avg\s+(?P<inst>[\d.]+) MB/sec")
MIB = 1024 * 1024

COLUMNS = [
    Column("bytes", "bytes copied"),
    Column("streams", "data connections globus-url-copy opened (-p)"),
    Column("window_bytes", "socket buffer asked for (-tcp-bs), bytes; none: autotuned"),
    Column("setup_s", "connect, log in, negotiate (MODE E, PASV, ALLO, STOR), s"),
    Column("connect_s", "connect and anonymous login (part of setup_s), s"),
    Column("transfer_s", "from the server's 150 to the client's last data block sent, s"),
    Column("commit_s", "from the last block sent to the server's 226 (file written, closed), s"),
    Column("elapsed_s", "globus-url-copy's whole run, s"),
    Column("throughput_bps", "bytes over transfer_s, bit/s"),
    Column("end_to_end_throughput_bps", "bytes over elapsed_s (set-up included), bit/s"),
    Column("tool_throughput_bps", "globus-url-copy's own -vb average (server's markers), bit/s"),
    Column("tool_transfer_s", "first to last performance marker of the server, s"),
]


class TransferSpec(copy.CopySpec):
    """One globus-url-copy copy. On an agent target the agent starts globus-gridftp-server for
    the copy (its own home directory, port and deadline); on a plain endpoint the copy writes
    into ``remote_dir`` of an anonymous server already listening on ``port``."""

    streams: int = Field(default=1, ge=1, le=16, description="parallel data connections (-p)")
    window: str | None = Field(
        default=None,
        description="TCP buffer size (-tcp-bs), K/M binary, 64K to 256M; unset: autotuned",
    )
    connect_timeout_s: int = Field(
        default=5,
        ge=1,
        le=120,
        description="give up when nothing moves for this many seconds, connecting included "
        "(-stall-timeout)",
        json_schema_extra={"cli": "connect-timeout"},
    )
    port: int = Field(
        default=DEFAULT_PORT, ge=1, le=65535, description="GridFTP port of a plain endpoint"
    )
    remote_dir: str = Field(
        default="/tmp",
        description="directory of a plain endpoint the copy writes into (agent: the slot's own)",
    )

    @field_validator("window")
    @classmethod
    def _window(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return copy.check_size("window", value, MIN_WINDOW, MAX_WINDOW, "256K or 4M")

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, value: str) -> str:
        return copy.check_dir("remote_dir", value)

    @property
    def window_bytes(self) -> int | None:
        return None if self.window is None else size_bytes(self.window, base=1024)


def build_argv(
    spec: TransferSpec,
    address: str,
    *,
    source: str = f"{copy.MEMORY_DIR}/iepm-xrdcp.src",
    path: str | None = None,
    port: int | None = None,
) -> list[str]:
    """The stamped globus-url-copy command copying ``source`` to ``path`` on the server; a
    relative ``path`` is under the login's home (-rp), as an agent's slot exports it."""
    host = f"[{address}]" if ":" in address else address
    path = path or f"{spec.remote_dir.rstrip('/')}/iepm-gridftp.dat"
    window = [] if spec.window_bytes is None else ["-tcp-bs", str(spec.window_bytes)]
    # -rp: a path is relative to the login's home; a root-relative one starts with %2F.
    target = f"%2F{path.lstrip('/')}" if path.startswith("/") else path
    return [
        copy.STAMP_PYTHON, "-I", copy.STAMP_SCRIPT,
        "globus-url-copy", "-dbg", "-vb", "-rp", "-p", str(spec.streams), *window,
        "-stall-timeout", str(spec.connect_timeout_s),
        f"file://{source}", f"ftp://{host}:{port or spec.port}/{target}",
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# parse


@dataclass
class Events:
    """Stamps (s since the epoch) of what globus-url-copy logged; None when it did not get
    there."""

    first: float | None = None
    last: float | None = None
    connected: float | None = None
    started: float | None = None
    sent: float | None = None
    sent_bytes: int | None = None
    done: float | None = None
    markers: list[tuple[float, int]] | None = None


def events(err: list[tuple[float, str]]) -> Events:
    found = Events(markers=[])
    marker_at: float | None = None
    for at, text in err:
        found.first = at if found.first is None else found.first
        found.last = at
        reply = REPLY.match(text)
        if reply is not None:
            code = reply["code"]
            if code == "230" and found.connected is None:
                found.connected = at
            elif code == "150" and found.started is None:
                found.started = at
            elif code == "226" and text.startswith("226 "):
                found.done = at
            continue
        sent = EOF_SENT.match(text)
        if sent is not None:
            found.sent, found.sent_bytes = at, int(sent["offset"])
            continue
        stamp = PERF_TIME.match(text)
        if stamp is not None:
            marker_at = float(stamp["at"])
            continue
        moved = PERF_BYTES.match(text)
        if moved is not None and marker_at is not None and found.markers is not None:
            found.markers.append((marker_at, int(moved["bytes"])))
    return found


def where(argv: tuple[str, ...]) -> str:
    url = next((a for a in reversed(argv) if a.startswith(("ftp://", "gsiftp://"))), "")
    return url.split("://", 1)[-1].split("/", 1)[0] if url else "the server"


def explain(lines: list[str], argv: tuple[str, ...]) -> str | None:
    """globus-url-copy's failure in words a person can act on (its own line kept), or None when
    the output names no failure."""
    at = next((i for i, ln in enumerate(lines) if ln.startswith("error: ")), None)
    if at is None:
        return None
    server = where(argv)
    told = [ln.strip() for ln in lines[at:] if ln.strip()]
    low = " ".join(told).lower()
    cause = next((ln for ln in told if "system call failed" in ln.lower()), told[-1])
    first = told[0].removeprefix("error: ")
    said = f"(globus-url-copy: {first}{'' if cause == told[0] else f'; {cause}'})"
    if "connection refused" in low:
        return (
            f"cannot connect to GridFTP on {server} — is globus-gridftp-server (Debian: "
            f"{SERVER_PACKAGE}) or the iepm agent running there, and the port open? {said}"
        )
    if "no space left on device" in low or "quota exceeded" in low:
        return f"no room for the copy on {server}: its file system is full {said}"
    if "permission denied" in low or "read-only file system" in low:
        return (
            f"the GridFTP server on {server} refused to write the file: permission denied — is "
            f"the directory writable by the server's anonymous user? {said}"
        )
    if "530" in low or "login incorrect" in low or "not allowed" in low:
        return (
            f"the GridFTP server on {server} refused the anonymous login: it must run with "
            f"-aa -anonymous-user USER {said}"
        )
    if "no such file" in low:
        return f"the GridFTP server on {server} has no such directory: remote_dir {said}"
    if "operation was aborted" in low:
        return (
            f"the GridFTP server on {server} did not answer: nothing moved for the stall "
            f"timeout (connect_timeout_s) {said}"
        )
    if "no route to host" in low or "timed out" in low or "unable to connect" in low:
        return f"cannot reach GridFTP on {server} {said}"
    return f"globus-url-copy to {server} failed: {' '.join(told)[:400]}"


def parse(raw: RawRun, spec: TransferSpec | None = None) -> dict[str, Any]:
    """Timers and rates from the stamped output of globus-url-copy -dbg -vb; ToolFailed for
    its own errors, ParseError for output that is not a stamped globus-url-copy run."""
    out, err = copy.stamped(raw.stdout), copy.stamped(raw.stderr)
    if not err:
        raise copy.not_started("globus-url-copy", where(raw.argv), raw)
    if raw.returncode not in (0, None) and not raw.timed_out:
        why = explain([text for _, text in err], raw.argv)
        if why is not None:
            raise ToolFailed(why)
    found = events(err)
    everything = sorted(out + err)
    first, last = everything[0][0], everything[-1][0]
    complete = (
        raw.returncode == 0
        and not raw.timed_out
        and found.sent is not None
        and found.done is not None
    )
    nbytes = found.sent_bytes if complete else None
    transfer_s = copy.span(found.started, found.sent)
    elapsed_s = copy.span(first, last)
    vb = [m for _, text in out if (m := VB.match(text))]
    markers = found.markers or []
    data: dict[str, Any] = {
        "complete": complete,
        "bytes": nbytes,
        "streams": spec.streams if spec is not None else _option(raw.argv, "-p"),
        "window_bytes": spec.window_bytes if spec is not None else _option(raw.argv, "-tcp-bs"),
        "setup_s": copy.span(first, found.started),
        "connect_s": copy.span(first, found.connected),
        "transfer_s": transfer_s,
        "commit_s": copy.span(found.sent, found.done),
        "elapsed_s": elapsed_s,
        "throughput_bps": copy.bps(nbytes, transfer_s),
        "end_to_end_throughput_bps": copy.bps(nbytes, elapsed_s),
        "tool_throughput_bps": round(float(vb[-1]["avg"]) * MIB * 8, 1) if vb else None,
        "tool_bytes": int(vb[-1]["bytes"]) if vb else None,
        "tool_transfer_s": (round(markers[-1][0] - markers[0][0], 1) if len(markers) > 1 else None),
    }
    if not complete:
        phase = (
            "connecting and logging in"
            if found.connected is None
            else "negotiating the transfer"
            if found.started is None
            else "copying"
            if found.sent is None
            else "closing the file"
        )
        data["tool_error"] = f"globus-url-copy to {where(raw.argv)} did not finish: it was {phase}"
    return data


def _option(argv: tuple[str, ...], flag: str) -> int | None:
    for option, value in itertools.pairwise(argv):
        if option == flag and value.isdigit():
            return int(value)
    return None


def check(data: dict[str, Any], spec: TransferSpec) -> str | None:
    if not data.get("complete"):
        return str(data.get("tool_error") or "globus-url-copy did not finish the copy")
    if spec is not None and data.get("bytes") != spec.size_bytes:
        return (
            f"globus-url-copy copied {data.get('bytes')} bytes, the spec asked for "
            f"{spec.size_bytes}"
        )
    if not data.get("throughput_bps"):
        return "globus-url-copy logged no transfer time: the log lacks the 150 or the last block"
    return None


def summary(data: dict[str, Any]) -> str:
    mbps = copy.mbps
    return (
        f"{mbps(data.get('throughput_bps'))} over the transfer "
        f"({mbps(data.get('tool_throughput_bps'))} by globus-url-copy), "
        f"{mbps(data.get('end_to_end_throughput_bps'))} end to end; setup "
        f"{figure(data.get('setup_s'))} s, transfer {figure(data.get('transfer_s'))} s, commit "
        f"{figure(data.get('commit_s'))} s"
    )


# ---------------------------------------------------------------------------------------------
# run


async def run_copy(
    module: ModuleType,
    spec: TransferSpec,
    ctx: ProbeContext,
    storage: copy.Storage,
    source: contextlib.AbstractContextManager[str],
) -> Result:
    """Lease a GridFTP server, copy ``source`` to it, log the run raw, parse it; failures as
    data (the agent removes the slot's file and server when the lease ends)."""
    need = ServerNeed(
        kind=SERVER,
        duration_s=math.ceil(spec.duration_s),
        streams=spec.streams,
        window_bytes=spec.window_bytes,
        size_bytes=spec.size_bytes,
        storage=storage,
    )
    name = f"iepm-{secrets.token_hex(8)}.dat"

    async def version() -> str | None:
        for program in (TOOL, copy.STAMP_PYTHON):
            try:
                resolve_executable(program)
            except ToolNotFound:
                package = CLIENT_PACKAGE if program == TOOL else "python3"
                raise ToolNotFound(
                    f"{program} is not installed on this monitor or not on PATH "
                    f"(PATH={os.environ.get('PATH', '')}); install it (Debian: apt-get install "
                    f"{package})"
                ) from None
        return await tool_version(ctx.wrap(VERSION_ARGV))

    async def run(lease: ServerLease, notes: list[str]) -> copy.Copied:
        # An agent's server has the slot's directory as the login's home: a relative path.
        port = lease.port or spec.port
        path = name if lease.port is not None else f"{spec.remote_dir.rstrip('/')}/{name}"
        with source as source_path:
            argv = build_argv(spec, lease.address, source=source_path, path=path, port=port)
            raw = await run_command(ctx.wrap(argv), spec.deadline_s())
        if lease.port is None:
            notes.append(f"[plain endpoint: the copy {path} is left on {lease.address}]")
        return copy.Copied(raw, lease.address)

    result, _ = await copy.leased_copy(module, spec, ctx, need, version, run)
    return result

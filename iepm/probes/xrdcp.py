"""XRootD copies with ``xrdcp``: what the memory-to-memory and disk-to-disk probes share.

The copy's phases are read from xrdcp's own debug log (``--debug 2``: one timestamped line per
event, microseconds, on stderr), so ``parse()`` stays pure and ``iepm extract`` reproduces every
timer from the raw log alone. Learnt from xrdcp 5.5.3:

* The destination is opened only after the client connected, did the handshake, logged in
  (and bound its extra ``--streams``) and stat-ed the path: **set-up** runs from xrdcp's first
  log line to the destination's "successfully opened". **Transfer** runs from there to the
  destination's "Sending a close command"; **commit** from there to its "Close returned".
* xrdcp prints its rate only in a progress bar drawn on a terminal: with its output captured it
  says nothing. What a person timing ``xrdcp`` sees is the whole run, set-up included, so
  ``end_to_end_throughput_bps`` is bytes over xrdcp's first-to-last log line, next to
  ``throughput_bps`` over the transfer time alone (the bias the seeds found in bbftp).
* A failed copy ends with one line ``Run: [ERROR|FATAL] <what> (source|destination)``, exit
  status non-zero. With ``--streams`` > 1, 5.5.3 also logs a harmless "The given URL is empty"
  error per chunk; only the ``Run:`` line decides.
* The client retries a refused connection for ``ConnectionWindow`` × ``ConnectionRetry``
  seconds (120 × 5 by default): the probe sets both (``-DI``), or a target that is down would
  hold the monitor for ten minutes.
* xrdcp has no socket-buffer option (5.5.3 knows no ``TCPWindow``: the kernel autotunes);
  ``--streams`` is its parallelism. Its pipeline is ``CPChunkSize`` bytes per write request,
  ``CPParallelChunks`` requests at a time, each a ``kXR_pgwrite`` with a CRC32C per 4 KiB page
  (computed by xrdcp, checked by xrootd) unless ``CpUsePgWrtRd`` is 0 (plain ``kXR_write``).
  The debug log shows each write request queued and answered: ``writes_in_flight`` and
  ``pipeline_empty_s`` say whether the client kept the server fed. Measured in the lab: the page
  checksums cost 1.3-1.6 s of CPU per GB on the two ends (README, "Application transfers").
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import secrets
import shlex
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import Field, field_validator

from iepm.errors import ParseError, ToolFailed, ToolNotFound
from iepm.probes import copy
from iepm.probes.base import (
    Column,
    ProbeContext,
    ServerLease,
    ServerNeed,
    figure,
)

# Re-exported: the xrdcp probes were the first copy probes, and callers name these here.
from iepm.probes.copy import MAX_SIZE as MAX_SIZE
from iepm.probes.copy import MEMORY_DIR, Storage
from iepm.probes.copy import MIN_SIZE as MIN_SIZE
from iepm.probes.copy import PATH_RE as PATH_RE
from iepm.probes.copy import memory_source as memory_source
from iepm.probes.copy import sweep_sources as sweep_sources
from iepm.results import Outcome, Result
from iepm.runner import RawRun, run_command, tool_version
from iepm.units import size_bytes

TOOL = "xrdcp"
SERVER = "xrootd"
DEFAULT_PORT = 1094
VERSION_ARGV = ("xrdcp", "--version")
# Topics of xrdcp's log the timers need; the rest (message handlers, poller) doubles its size.
LOG_MASK = "File|Utility|PostMaster|XRootDTransport|XRootD|AsyncSock"
# The commit step: Debian's python3 (it has python3-xrootd) running xrdsync.py.
SYNC_PYTHON = "/usr/bin/python3"
SYNC_SCRIPT = str(Path(__file__).with_name("xrdsync.py"))

LINE = re.compile(
    r"^\[(?P<when>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ [+-]\d{4})\]"
    r"\[(?P<level>\w+)\s*\]\[(?P<topic>\w+)\s*\] (?P<text>.*)$"
)
# The failure's own line: "Run: [FATAL] ..." or, for some server refusals, an App error.
RUN_ERROR = re.compile(
    r"^(?:Run: |\[[^]]+\]\[Error\s*\]\[App\s*\] )\[(?:ERROR|FATAL)\] (?P<what>.*?)\s*"
    r"(?:\((?P<side>source|destination)\))?\s*$"
)
ASIZE = re.compile(r"^Opening root://\S+?\?oss\.asize=(\d+) for writing")
SERVER_SAID = re.compile(r"\[(\d{4})\] (.*)$")
# A write request queued, and its answer handled (xrdcp's message handlers, ExDbgMsg topic).
WRITE_SENT = re.compile(r"MsgHandler created: \S+ \(message: kXR_(pg)?write ")
WRITE_DONE = re.compile(r"Calling MsgHandler: \S+ \(message: kXR_(pg)?write .* with status")
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 64 * 1024**2

COLUMNS = [
    Column("bytes", "bytes copied"),
    Column("streams", "TCP connections xrdcp used (--streams)"),
    Column("setup_s", "connect, handshake, login and open of the destination, s"),
    Column("connect_s", "connect and login (part of setup_s), s"),
    Column("transfer_s", "from the destination's open to its close request, s"),
    Column("commit_s", "close (and, when asked, sync) of the destination, s"),
    Column("elapsed_s", "xrdcp's whole run, first to last log line, s"),
    Column("throughput_bps", "bytes over transfer_s, bit/s"),
    Column("end_to_end_throughput_bps", "bytes over elapsed_s (set-up included), bit/s"),
    Column("write_requests", "write requests xrdcp sent (one per chunk)"),
    Column("page_checksums", "the writes carried a CRC32C per 4K page (kXR_pgwrite)"),
    Column("writes_in_flight", "mean write requests awaiting the server over transfer_s"),
    Column("pipeline_empty_s", "part of transfer_s with no write awaiting the server, s"),
    Column("sync_s", "the server's sync of the copy (commit = at_end), s"),
    Column("committed_throughput_bps", "bytes over transfer_s + commit_s (at_end), bit/s"),
]


class TransferSpec(copy.CopySpec):
    """One xrdcp copy. On an agent target the agent starts xrootd for the copy (its own export
    directory, port and deadline); on a plain endpoint the copy writes into ``remote_dir``."""

    streams: int = Field(default=1, ge=1, le=15, description="parallel TCP streams (--streams)")
    chunk_size: str = Field(
        default="8M",
        description="bytes per write request, 64K-64M (xrdcp's CPChunkSize; its default 8M)",
    )
    parallel_chunks: int = Field(
        default=4,
        ge=1,
        le=64,
        description="write requests in flight (xrdcp's CPParallelChunks; its default 4)",
    )
    page_checksums: bool = Field(
        default=True,
        description="write with a CRC32C per 4K page (kXR_pgwrite, xrdcp 5's default); "
        "false: plain kXR_write (CpUsePgWrtRd 0)",
    )
    port: int = Field(
        default=DEFAULT_PORT, ge=1, le=65535, description="xrootd port of a plain endpoint"
    )
    remote_dir: str = Field(
        default="/tmp",
        description="directory a plain endpoint exports for the copy (agent: the slot's own)",
    )

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, value: str) -> str:
        return copy.check_dir("remote_dir", value)

    @field_validator("chunk_size")
    @classmethod
    def _chunk_size(cls, value: str) -> str:
        return copy.check_size("chunk_size", value, MIN_CHUNK, MAX_CHUNK, "1M or 8M")

    @property
    def chunk_bytes(self) -> int:
        return size_bytes(self.chunk_size, base=1024)


def build_argv(
    spec: TransferSpec,
    address: str,
    *,
    source: str = f"{MEMORY_DIR}/iepm-xrdcp.src",
    path: str | None = None,
    port: int | None = None,
) -> list[str]:
    """The xrdcp command copying ``source`` to ``path`` on the server."""
    host = f"[{address}]" if ":" in address else address
    path = path or f"{spec.remote_dir.rstrip('/')}/iepm-xrdcp.dat"
    url = f"root://{host}:{port or spec.port}/{path}"
    return [
        "xrdcp", "--force", "--nopbar", "--streams", str(spec.streams), "--debug", "2",
        # Connection attempts end within the probe's connect timeout (see the module doc).
        "-DIConnectionWindow", str(spec.connect_timeout_s), "-DIConnectionRetry", "1",
        "-DIRequestTimeout", str(math.ceil(spec.duration_s)),
        # The copy's pipeline, written out even at xrdcp's defaults: the raw log says what ran.
        "-DICPChunkSize", str(spec.chunk_bytes),
        "-DICPParallelChunks", str(spec.parallel_chunks),
        "-DICpUsePgWrtRd", "1" if spec.page_checksums else "0",
        "-DSLogMask", LOG_MASK,
        source, url,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# parse


@dataclass
class Events:
    """Timestamps (s since the epoch) of what xrdcp logged, None when it did not get there."""

    first: float | None = None
    last: float | None = None
    connected: float | None = None
    opened: float | None = None
    close_sent: float | None = None
    closed: float | None = None
    close_ok: bool = False
    size: int | None = None
    substreams: int = 0
    # (time, +1 | -1) per write request queued / answered; whether they carried page CRCs.
    writes: list[tuple[float, int]] = field(default_factory=list)
    page_writes: bool | None = None


def _when(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f %z").timestamp()


def events(log: str) -> Events:
    found = Events()
    for line in log.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        at = _when(match["when"])
        found.first = at if found.first is None else found.first
        found.last = at
        text = match["text"]
        if "Logged in, session" in text and found.connected is None:
            found.connected = at
        elif "Stream " in text and " connected" in text and "Stream 0 " not in text:
            found.substreams += 1
        size = ASIZE.match(text)
        if size is not None:
            found.size = int(size[1])
        write = WRITE_SENT.search(text) or WRITE_DONE.search(text)
        if write is not None:
            found.writes.append((at, 1 if "created" in write[0] else -1))
            found.page_writes = write[1] is not None
        # The destination's own lines name it by URL; the source's are file://.
        if "@root://" not in text and "@roots://" not in text:
            continue
        if "successfully opened at" in text and found.opened is None:
            found.opened = at
        elif "Sending a close command" in text:
            found.close_sent = at
        elif "Close returned from" in text:
            found.closed = at
            found.close_ok = "[SUCCESS]" in text
    return found


_span = copy.span
_bps = copy.bps


def pipeline(found: Events) -> tuple[float | None, float | None]:
    """Over the transfer: the mean number of write requests awaiting the server's answer (time
    weighted), and the seconds with none — the client had nothing on the way to the server."""
    start, end = found.opened, found.close_sent
    if start is None or end is None or end <= start or not found.writes:
        return None, None
    weighted = empty = 0.0
    pending, at = 0, start
    for when, step in sorted(found.writes):
        when = min(max(when, start), end)
        weighted += pending * (when - at)
        empty += (when - at) if pending == 0 else 0.0
        pending, at = max(0, pending + step), when
    weighted += pending * (end - at)
    empty += (end - at) if pending == 0 else 0.0
    return round(weighted / (end - start), 3), round(empty, 6)


def where(argv: tuple[str, ...]) -> str:
    url = next((a for a in argv if a.startswith(("root://", "roots://"))), "the server")
    return url.split("://", 1)[-1].split("/", 1)[0]


def explain(what: str, side: str | None, argv: tuple[str, ...]) -> str:
    """xrdcp's ``Run:`` line turned into something a person can act on (original kept)."""
    server = where(argv)
    what = what.replace("\0", "").strip()  # the server's message ends in a NUL
    said = f"(xrdcp: {what}{f' ({side})' if side else ''})"
    low = what.lower()
    code = SERVER_SAID.search(what)
    if "connection error" in low or "connection refused" in low:
        return (
            f"cannot connect to xrootd on {server} — is the xrootd server (Debian: xrootd-server) "
            f"or the iepm agent running there, and the port open? {said}"
        )
    if "permission denied" in low or (code is not None and code[1] in ("3010", "3030")):
        return (
            f"the xrootd server on {server} refused to write the file: permission denied — is "
            f"the directory exported and writable by the server's user? {said}"
        )
    if "no such file" in low or (code is not None and code[1] == "3011"):
        return (
            f"the xrootd server on {server} has no such directory: remote_dir is not exported "
            f"there or does not exist {said}"
        )
    if "no space" in low or "not enough free space" in low or "maxsize" in low:
        return f"no room for the copy on {server}: its file system (or size limit) is full {said}"
    if "operation expired" in low or "timed out" in low:
        return f"the xrootd server on {server} stopped answering mid-copy {said}"
    return f"xrdcp to {server} failed: {what}"


def parse(raw: RawRun, spec: TransferSpec | None = None) -> dict[str, Any]:
    """Timers and rates from xrdcp's debug log; ToolFailed for xrdcp's own errors, ParseError
    for output that is not an xrdcp debug log."""
    log = raw.stderr
    failure = next(
        (m for line in reversed(log.splitlines()) if (m := RUN_ERROR.match(line.strip()))), None
    )
    found = events(log)
    if failure is not None:
        raise ToolFailed(explain(failure["what"], failure["side"], raw.argv))
    if found.first is None:
        complaint = next((ln.strip() for ln in reversed(log.splitlines()) if ln.strip()), None)
        if complaint and not raw.timed_out:
            raise ToolFailed(f"xrdcp to {where(raw.argv)} wrote no log; it said: {complaint}")
        raise ParseError(
            f"xrdcp to {where(raw.argv)} wrote no debug log (exit {raw.returncode}); it was "
            "killed or crashed before starting"
        )
    complete = found.close_ok and raw.returncode == 0 and not raw.timed_out
    nbytes = found.size if complete else None
    streams = spec.streams if spec is not None else _streams(raw.argv)
    transfer_s = _span(found.opened, found.close_sent)
    elapsed_s = _span(found.first, found.last)
    in_flight, idle_s = pipeline(found)
    data: dict[str, Any] = {
        "complete": complete,
        "bytes": nbytes,
        "size_bytes": found.size,
        "streams": streams,
        # Stream 0 carries the session; xrdcp adds one per --streams for the data.
        "connected_streams": found.substreams or (1 if found.connected is not None else 0),
        "setup_s": _span(found.first, found.opened),
        "connect_s": _span(found.first, found.connected),
        "transfer_s": transfer_s,
        "commit_s": _span(found.close_sent, found.closed),
        "elapsed_s": elapsed_s,
        "throughput_bps": _bps(nbytes, transfer_s),
        "end_to_end_throughput_bps": _bps(nbytes, elapsed_s),
        "write_requests": sum(1 for _, step in found.writes if step > 0),
        "page_checksums": found.page_writes,
        "writes_in_flight": in_flight,
        "pipeline_empty_s": idle_s,
    }
    if not complete:
        phase = (
            "connecting and logging in"
            if found.connected is None
            else "opening the destination"
            if found.opened is None
            else "copying"
            if found.close_sent is None
            else "closing the destination"
        )
        data["tool_error"] = f"xrdcp to {where(raw.argv)} did not finish: it was {phase}"
    return data


def _streams(argv: tuple[str, ...]) -> int | None:
    for flag, value in itertools.pairwise(argv):
        if flag in ("--streams", "-S") and value.isdigit():
            return int(value)
    return None


def check(data: dict[str, Any], spec: TransferSpec) -> str | None:
    if not data.get("complete"):
        return str(data.get("tool_error") or "xrdcp did not finish the copy")
    if spec is not None and data.get("bytes") != spec.size_bytes:
        return f"xrdcp copied {data.get('bytes')} bytes, the spec asked for {spec.size_bytes}"
    if not data.get("throughput_bps"):
        return "xrdcp reported no transfer time: the log lacks the destination's open or close"
    return None


def summary(data: dict[str, Any]) -> str:
    mbps = copy.mbps
    return (
        f"{mbps(data.get('throughput_bps'))} over the transfer, "
        f"{mbps(data.get('end_to_end_throughput_bps'))} end to end; setup "
        f"{figure(data.get('setup_s'))} s, transfer {figure(data.get('transfer_s'))} s, commit "
        f"{figure(data.get('commit_s'))} s"
    )


# ---------------------------------------------------------------------------------------------
# run


async def remove_remote(ctx: ProbeContext, spec: TransferSpec, port: int, path: str) -> str:
    """Remove a plain endpoint's copy (an agent removes its slot's files itself); one line for
    the diags."""
    host = f"[{ctx.address}]" if ":" in ctx.address else ctx.address
    argv = ctx.wrap(["xrdfs", f"root://{host}:{port}", "rm", path])
    env = {**os.environ, "XRD_CONNECTIONWINDOW": str(spec.connect_timeout_s)}
    env["XRD_CONNECTIONRETRY"] = "1"
    try:
        raw = await run_command(argv, spec.connect_timeout_s + 5.0, env=env)
    except ToolNotFound as exc:
        return f"[copy left on the endpoint: {exc}]"
    if raw.returncode != 0 or raw.timed_out:
        said = (raw.stderr.strip().splitlines() or ["(nothing)"])[-1]
        return f"[removing {path} failed: {shlex.join(argv)}: {said}]"
    return f"[removed {path}]"


def sync_argv(url: str, timeout_s: int) -> list[str]:
    return [SYNC_PYTHON, "-I", SYNC_SCRIPT, url, str(timeout_s)]


def parse_sync(raw: RawRun) -> dict[str, Any]:
    """The commit step's figures (see :mod:`.xrdsync`); ToolFailed when it did not sync."""
    line = next((ln for ln in reversed(raw.stdout.splitlines()) if ln.startswith("{")), None)
    if raw.timed_out:
        raise ToolFailed("the server did not finish syncing the copy before the deadline")
    try:
        found = json.loads(line) if line else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        said = (raw.stderr.strip().splitlines() or ["(nothing)"])[-1]
        raise ParseError(f"the commit step printed no figures (exit {raw.returncode}): {said}")
    if "error" in found:
        raise ToolFailed(f"committing the copy failed: {found['error']}")
    return {key: float(found[key]) for key in ("open_s", "sync_s", "close_s")}


def with_commit(data: dict[str, Any], sync: dict[str, Any]) -> dict[str, Any]:
    """Copy figures with the server's sync counted into the commit."""
    commit_s = round((data.get("commit_s") or 0.0) + sync["sync_s"], 6)
    return {
        **data,
        "sync_s": sync["sync_s"],
        "commit_s": commit_s,
        "committed_throughput_bps": copy.committed_bps(
            data.get("bytes"), data.get("transfer_s"), commit_s
        ),
    }


async def run_copy(
    module: ModuleType,
    spec: TransferSpec,
    ctx: ProbeContext,
    storage: Storage,
    source: contextlib.AbstractContextManager[str],
    *,
    commit: bool = False,
) -> Result:
    """Lease a server, copy ``source`` to it (and with ``commit`` have the server sync it before
    the lease ends), log the runs raw, parse them; failures as data."""
    need = ServerNeed(
        kind=SERVER,
        duration_s=math.ceil(spec.duration_s),
        streams=spec.streams,
        size_bytes=spec.size_bytes,
        storage=storage,
    )
    name = f"iepm-{secrets.token_hex(8)}.dat"

    async def run(lease: ServerLease, notes: list[str]) -> copy.Copied:
        # An agent's xrootd exports the slot's own directory as "/".
        port = lease.port or spec.port
        path = f"/{name}" if lease.port is not None else f"{spec.remote_dir.rstrip('/')}/{name}"
        with source as source_path:
            argv = build_argv(spec, lease.address, source=source_path, path=path, port=port)
            argv = ctx.wrap(argv)
            raw = await run_command(argv, spec.deadline_s())
        copied = copy.Copied(raw, lease.address)
        if commit and raw.returncode == 0 and not raw.timed_out:
            host = f"[{lease.address}]" if ":" in lease.address else lease.address
            left = max(1, math.ceil(spec.deadline_s() - raw.duration_s))
            url = f"root://{host}:{port}/{path}"
            copied.after.append(await run_command(ctx.wrap(sync_argv(url, left)), left + 2.0))
        if lease.port is None:
            notes.append(await remove_remote(ctx, spec, port, path))
        return copied

    result, copied = await copy.leased_copy(
        module, spec, ctx, need, lambda: tool_version(ctx.wrap(VERSION_ARGV)), run
    )
    if copied is None or not copied.after:
        return result
    synced = copied.after[0]
    update: dict[str, Any] = {"diags": result.diags + "\n" + synced.diags()}
    try:
        update["data"] = with_commit(result.data, parse_sync(synced))
    except (ToolFailed, ParseError) as exc:
        update |= {"outcome": Outcome.FAILED, "error": str(exc)}
    return result.model_copy(update=update)

"""What the file-copy probes share (xrdcp, rsync over SSH, GridFTP): the spec's size and deadline
fields, the generated and on-disk sources, the timers' arithmetic, and the leased run that turns
every failure into a result.

A copy probe module provides the tool (argv, ``parse``, ``check``) and calls :func:`leased_copy`
with a coroutine that runs the copy against the lease it is given; this module handles the lease,
the version, the raw log, and the failures (tool missing, lease refused, OS errors) as data.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import Field, field_validator

from iepm.errors import ConfigError, ParseError, RemoteError, ToolFailed, ToolNotFound
from iepm.probes.base import (
    ProbeContext,
    ProbeSpec,
    ServerLease,
    ServerNeed,
    failed_result,
    result_from_raw,
)
from iepm.results import Result
from iepm.runner import RawRun
from iepm.units import size_bytes

MIN_SIZE = 1024 * 1024
MAX_SIZE = 64 * 1024**3
# Memory file system for a generated source: a sparse file reads as zeros without using memory.
MEMORY_DIR = "/dev/shm"
# Name prefix of the generated sources (and of the disk sources, kept in ``source_dir``): one
# name for every copy probe, so that a disk source written for one tool serves the others.
SOURCE_PREFIX = "iepm-xrdcp"
PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*$")
# Tools that log events without times run under stamp.py (Debian's python3): see that module.
STAMP_PYTHON = "/usr/bin/python3"
STAMP_SCRIPT = str(Path(__file__).with_name("stamp.py"))
STAMPED = re.compile(r"^\[(?P<at>\d+\.\d+)\] (?P<text>.*)$")
# Seed of the disk source's bytes: incompressible, and the same file on every run.
SOURCE_SEED = 20261124
CHUNK = 4 * 1024 * 1024

Storage = Literal["memory", "disk"]


class CopySpec(ProbeSpec):
    """Fields every copy probe has: how much to copy and how long it may take."""

    size: str = Field(
        default="256M", description="bytes to copy, with K/M/G (binary), from 1M to 64G"
    )
    duration_s: float = Field(
        default=60.0,
        ge=1,
        le=3600,
        description="limit on the whole copy, s: the tool is killed at this deadline",
        json_schema_extra={"cli": "duration"},
    )
    connect_timeout_s: int = Field(
        default=5,
        ge=1,
        le=120,
        description="give up connecting after this many seconds",
        json_schema_extra={"cli": "connect-timeout"},
    )

    @field_validator("size")
    @classmethod
    def _size(cls, value: str) -> str:
        return check_size("size", value, MIN_SIZE, MAX_SIZE, "64M or 1G")

    @property
    def size_bytes(self) -> int:
        return size_bytes(self.size, base=1024)

    def deadline_s(self) -> float:
        return self.duration_s


class DiskSourceSpec(ProbeSpec):
    """Where a disk-to-disk copy's source file lives on the monitor."""

    source_dir: str = Field(
        default="/var/tmp",
        description=f"monitor directory holding the source file ({SOURCE_PREFIX}-SIZE.src, kept)",
    )

    @field_validator("source_dir")
    @classmethod
    def _source_dir(cls, value: str) -> str:
        return check_dir("source_dir", value)


def check_size(name: str, value: str, low: int, high: int, example: str) -> str:
    """A size like ``64M`` (K/M/G of 1024) within [low, high] bytes; the error names the field,
    the value and the range in the same units."""
    try:
        nbytes = size_bytes(value, base=1024)
    except ValueError:
        raise ValueError(f"{name} {value!r} is not a size like {example}") from None
    if not low <= nbytes <= high:
        raise ValueError(f"{name} {value!r} must be between {_short(low)} and {_short(high)}")
    return value.strip()


def _short(nbytes: int) -> str:
    for unit, factor in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes % factor == 0:
            return f"{nbytes // factor}{unit}"
    return str(nbytes)


def check_dir(name: str, value: str) -> str:
    """An absolute path of plain characters, no ``..``: safe in a command line and a URL."""
    if not PATH_RE.match(value) or "/../" in f"{value}/":
        raise ValueError(
            f"{name} {value!r} must be an absolute path of letters, digits, '.', '_', '-' and "
            "'/' (no '..')"
        )
    return value


# ---------------------------------------------------------------------------------------------
# timers


def span(start: float | None, end: float | None) -> float | None:
    """Seconds from ``start`` to ``end`` (6 decimals), None when either is missing."""
    return None if start is None or end is None else round(max(0.0, end - start), 6)


def bps(nbytes: int | None, seconds: float | None) -> float | None:
    """``nbytes`` over ``seconds`` in bit/s, None without both."""
    if nbytes is None or not seconds:
        return None
    return round(nbytes * 8 / seconds, 1)


def committed_bps(
    nbytes: int | None, transfer_s: float | None, commit_s: float | None
) -> float | None:
    """Bytes over transfer + commit: what the copy moved to stable storage per second."""
    if transfer_s is None or commit_s is None:
        return None
    return bps(nbytes, transfer_s + commit_s)


def not_started(tool: str, where: str, raw: RawRun) -> ToolFailed | ParseError:
    """The error for a copy tool that printed nothing stamped: ToolFailed with the last thing
    it said (a refused login, a missing file), or ParseError when it was killed or crashed
    before saying anything."""
    complaint = next((ln.strip() for ln in reversed(raw.stderr.splitlines()) if ln), None)
    if complaint and not raw.timed_out:
        return ToolFailed(f"{tool} to {where} did not start; it said: {complaint}")
    return ParseError(
        f"{tool} to {where} printed nothing stamped (exit {raw.returncode}): it was killed or "
        "crashed before starting"
    )


def stamped(text: str) -> list[tuple[float, str]]:
    """The (time, line) pairs of stamp.py's output; unstamped lines are skipped."""
    lines = []
    for line in text.splitlines():
        match = STAMPED.match(line)
        if match is not None:
            lines.append((float(match["at"]), match["text"]))
    return lines


def mbps(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f} Mbit/s"


def with_committed(text: str, data: dict[str, Any]) -> str:
    """A disk probe's summary: the committed rate first when there is one."""
    committed = data.get("committed_throughput_bps")
    return text if committed is None else f"{committed / 1e6:.1f} Mbit/s committed; {text}"


# ---------------------------------------------------------------------------------------------
# sources


def sweep_sources() -> None:
    """Remove the sources of monitors that died mid-copy (the PID in the name is gone)."""
    for stale in Path(MEMORY_DIR).glob(f"{SOURCE_PREFIX}-*-*"):
        pid = stale.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def memory_source(nbytes: int) -> Iterator[str]:
    """A sparse file of ``nbytes`` on a memory file system: reads as zeros at memory speed and
    holds no pages. Removed afterwards."""
    with memory_sources([nbytes]) as paths:
        yield paths[0]


@contextlib.contextmanager
def memory_sources(sizes: list[int]) -> Iterator[list[str]]:
    """One sparse file per size (``source``, or ``source.I`` for several: the parts of a copy
    run over parallel connections) in one directory on a memory file system. Removed
    afterwards."""
    sweep_sources()
    directory = tempfile.mkdtemp(prefix=f"{SOURCE_PREFIX}-{os.getpid()}-", dir=MEMORY_DIR)
    names = ["source"] if len(sizes) == 1 else [f"source.{i}" for i in range(len(sizes))]
    paths = [Path(directory) / name for name in names]
    try:
        for path, nbytes in zip(paths, sizes, strict=True):
            with path.open("wb") as f:
                f.truncate(nbytes)
        yield [str(path) for path in paths]
    finally:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.rmdir(directory)


def disk_source_path(nbytes: int, directory: str) -> str:
    return f"{directory.rstrip('/')}/{SOURCE_PREFIX}-{nbytes}.src"


@contextlib.contextmanager
def disk_source(nbytes: int, directory: str) -> Iterator[str]:
    """The source file on disk: written once (seeded random bytes, fsynced) and kept for the
    next runs, so that a copy does not pay for making it."""
    path = Path(disk_source_path(nbytes, directory))
    if not path.exists() or path.stat().st_size != nbytes:
        rng = random.Random(SOURCE_SEED)
        partial = path.with_suffix(".partial")
        with partial.open("wb") as f:
            left = nbytes
            while left:
                block = rng.randbytes(min(CHUNK, left))
                f.write(block)
                left -= len(block)
            f.flush()
            os.fsync(f.fileno())
        partial.replace(path)
    yield str(path)


# ---------------------------------------------------------------------------------------------
# the leased run


@dataclass
class Copied:
    """What a copy ran: the copy itself and any step after it (a commit), all logged raw."""

    raw: RawRun
    address: str
    after: list[RawRun] = field(default_factory=list)


# Runs the copy against the lease; may add one-line notes for the diags (a cleanup's outcome).
CopyStep = Callable[[ServerLease, list[str]], Awaitable[Copied]]


async def leased_copy(
    module: ModuleType,
    spec: CopySpec,
    ctx: ProbeContext,
    need: ServerNeed,
    version: Callable[[], Awaitable[str | None]],
    copy: CopyStep,
) -> tuple[Result, Copied | None]:
    """Lease ``need``, run ``copy`` against the lease, log its runs raw and parse the copy.

    Returns the result and what ran (None when nothing did: a missing tool, a refused lease,
    an OS error — each a failed result naming the reason). The lease's note leads the diags;
    the lease ends (server and files removed) before this returns."""
    notes: list[str] = []
    try:
        found = await version()
        async with ctx.server(need) as lease:
            notes.append(lease.note)
            copied = await copy(lease, notes)
    except ToolNotFound as exc:
        return failed_result(module, spec, ctx, str(exc)), None
    except (RemoteError, ConfigError, OSError) as exc:
        diags = "\n".join(n for n in notes if n)
        return failed_result(module, spec, ctx, str(exc), diags=diags), None
    params = spec.model_dump(mode="json")
    if ctx.raw_log is not None:
        for raw in (copied.raw, *copied.after):
            ctx.raw_log.append(ctx.target, module.NAME, raw, params=params)
    result = result_from_raw(module, spec, replace(ctx, address=copied.address), copied.raw, found)
    diags = "\n".join([*(n for n in notes if n), result.diags])
    return result.model_copy(update={"diags": diags}), copied

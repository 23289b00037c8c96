"""Raw logs: every tool output kept verbatim so results can be re-extracted.

One file per target × probe × UTC day (``LOGDIR/YYYY-MM-DD/TARGET.PROBE.log``). Each run is
appended as a record framed by lines carrying its unique token, so no tool output can be
mistaken for a frame. The probe's parameters ride along so that re-extraction reads the output
exactly as the first extraction did::

    ==== iepm-run token=3f2a… time=2026-11-22T11:04:21.123Z target=cern-1 probe=ping \
        exit=0 timeout=0 duration_s=9.012     (one line in the file)
    $ ping -c 10 198.18.3.2
    % params {"count": 10, "interval_s": 1.0, …}
    …stdout…
    ---- stderr token=3f2a…
    …stderr…
    ==== end token=3f2a…
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import logging
import os
import re
import shlex
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from iepm.results import format_time
from iepm.runner import RawRun

HEADER_RE = re.compile(
    r"^==== iepm-run token=(?P<token>[0-9a-f]+) time=(?P<time>\S+) target=(?P<target>\S+) "
    r"probe=(?P<probe>\S+) exit=(?P<exit>\S+) timeout=(?P<timeout>[01]) "
    r"duration_s=(?P<duration>[0-9.]+)$"
)
PARAMS_PREFIX = "% params "
SAFE_NAME_RE = re.compile(r"[^A-Za-z0-9._-]")


def safe_name(name: str) -> str:
    """A target or probe name made safe for a file name."""
    return SAFE_NAME_RE.sub("_", name) or "_"


@dataclass(frozen=True)
class LoggedRun:
    target: str
    probe: str
    raw: RawRun
    path: Path
    line: int
    params: dict[str, Any] | None = None


# Records held in memory while the raw-log file system refuses writes (ENOSPC, EIO), written
# in order once it takes them again; beyond this many bytes the oldest are given up (counted).
MAX_HELD_BYTES = 64 * 1024 * 1024
log = logging.getLogger(__name__)


class RawLog:
    """Append-only raw log directory.

    A write that fails (a full disk) never fails the probe: the record is held in memory and
    appended before the next record, and ``held``/``write_failures``/``last_error`` say so.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._held: deque[tuple[Path, bytes]] = deque()
        self._held_bytes = 0
        self.write_failures = 0
        self.dropped = 0
        self.last_error: str | None = None

    @property
    def held(self) -> int:
        """Records waiting in memory for the file system to take them."""
        return len(self._held)

    def path_for(self, target: str, probe: str, moment: datetime) -> Path:
        day = moment.strftime("%Y-%m-%d")
        return self.directory / day / f"{safe_name(target)}.{safe_name(probe)}.log"

    def append(
        self, target: str, probe: str, raw: RawRun, params: dict[str, Any] | None = None
    ) -> Path:
        """Append one record (fsynced); where it goes, even if it is held in memory for now."""
        path = self.path_for(target, probe, raw.started_at)
        record = format_record(target, probe, raw, params).encode("utf-8")
        self._held.append((path, record))
        self._held_bytes += len(record)
        self.catch_up()
        return path

    def catch_up(self) -> int:
        """Write the held records, oldest first, until one fails; returns how many are left."""
        while self._held:
            path, record = self._held[0]
            try:
                _write_record(path, record)
            except OSError as exc:
                self.write_failures += 1
                self.last_error = f"{path}: {exc.strerror or exc}"
                log.error(
                    "raw log not writable, %d records held in memory: %s",
                    len(self._held),
                    self.last_error,
                )
                self._bound()
                return len(self._held)
            self._held.popleft()
            self._held_bytes -= len(record)
        return 0

    def _bound(self) -> None:
        while self._held_bytes > MAX_HELD_BYTES and len(self._held) > 1:
            _path, record = self._held.popleft()
            self._held_bytes -= len(record)
            self.dropped += 1
            log.error("raw log: %d held records given up (memory bound)", self.dropped)

    def files(self) -> list[Path]:
        # Days older than the retention's compress_after_days are gzipped (iepm archive prune).
        return sorted([*self.directory.glob("*/*.log"), *self.directory.glob("*/*.log.gz")])

    def runs(self) -> Iterator[LoggedRun]:
        for path in self.files():
            yield from read_log(path)


def _write_record(path: Path, record: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of the whole record, then fsync: a kill can only cut the last record, and a
    # write the disk refuses part-way is cut back off, so no torn record stays behind.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, record)
            if written != len(record):
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(record)} bytes)")
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _text_block(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def format_record(
    target: str, probe: str, raw: RawRun, params: dict[str, Any] | None = None
) -> str:
    exit_code = "none" if raw.returncode is None else str(raw.returncode)
    header = (
        f"==== iepm-run token={raw.token} time={format_time(raw.started_at)} "
        f"target={safe_name(target)} probe={safe_name(probe)} exit={exit_code} "
        f"timeout={int(raw.timed_out)} duration_s={raw.duration_s:.3f}\n"
    )
    # The command must stay on one line; shlex quoting keeps newlines, so escape them.
    command = raw.command_line.replace("\\", "\\\\").replace("\n", "\\n")
    # Always written, so that a tool's first output line is never taken for it.
    params_line = f"{PARAMS_PREFIX}{json.dumps(params, sort_keys=True)}\n"
    return (
        header
        + f"$ {command}\n"
        + params_line
        + _text_block(raw.stdout)
        + f"---- stderr token={raw.token}\n"
        + _text_block(raw.stderr)
        + f"==== end token={raw.token}\n"
    )


def read_log(path: Path) -> Iterator[LoggedRun]:
    """Yield every complete record of a raw log; a record cut short by a crash is skipped."""
    blob = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    # Read as read_text() would (universal newlines: \r\n and \r become \n), gzipped or not.
    text = io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8", errors="replace").read()
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        match = HEADER_RE.match(lines[i].rstrip("\n"))
        if not match:
            i += 1
            continue
        start = i
        token = match["token"]
        stderr_marker = f"---- stderr token={token}\n"
        end_marker = f"==== end token={token}\n"
        command = lines[i + 1][2:].rstrip("\n") if i + 1 < len(lines) else ""
        command = re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], command)
        j = i + 2
        params = None
        if j < len(lines) and lines[j].startswith(PARAMS_PREFIX):
            try:
                params = json.loads(lines[j][len(PARAMS_PREFIX) :])
            except json.JSONDecodeError:
                params = None
            j += 1
        stdout_lines: list[str] = []
        while j < len(lines) and lines[j] != stderr_marker:
            stdout_lines.append(lines[j])
            j += 1
        stderr_lines: list[str] = []
        j += 1
        while j < len(lines) and lines[j] != end_marker:
            stderr_lines.append(lines[j])
            j += 1
        if j >= len(lines):
            # A record cut short (a crash or a full disk): skip it, keep reading after it.
            i = start + 1
            continue
        i = j + 1
        exit_text = match["exit"]
        raw = RawRun(
            argv=tuple(shlex.split(command)),
            stdout="".join(stdout_lines),
            stderr="".join(stderr_lines),
            returncode=None if exit_text == "none" else int(exit_text),
            timed_out=match["timeout"] == "1",
            started_at=datetime.fromisoformat(match["time"].replace("Z", "+00:00")),
            duration_s=float(match["duration"]),
            token=token,
        )
        yield LoggedRun(match["target"], match["probe"], raw, path, start + 1, params)

"""The spool: results and cycle records the archive could not take yet, in a JSON-lines file.

Append-safe: every record is one line written by one ``write`` on an ``O_APPEND`` descriptor and
fsynced, so a ``kill -9`` or a full disk can only cut the *last* line short. A cut (or otherwise
unreadable) line is skipped, reported with its file and line number, and kept verbatim in
``<spool>.rejected`` for a person to look at — it never stops the records after it. A record
appended after a cut line starts on a line of its own.

Flushing is crash-safe and idempotent: the spool is first renamed to ``<spool>.flushing`` (new
records go to a fresh spool meanwhile), its records are written to the archive with "insert
unless already there", and the file is removed only once every record is in. A flush that
fails keeps the file and is simply run again; a result already in the archive (for example
written by an archive call that outlived its deadline) is counted as present, not an error.

Line format: ``{"kind": "result", "result": ENVELOPE}`` or ``{"kind": "cycle", "cycle": {...}}``;
a bare envelope (the spool of earlier versions) is read as a result.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from iepm.results import Result
from iepm.store.archive import Cycle

log = logging.getLogger(__name__)

# Records per archive transaction while flushing: a bounded time per call (each has a deadline).
FLUSH_CHUNK = 500


@dataclass
class SpoolRead:
    """What one read of a spool file found."""

    results: list[Result] = field(default_factory=list)
    cycles: list[Cycle] = field(default_factory=list)
    # "FILE:LINE: why" for every line skipped.
    rejected: list[str] = field(default_factory=list)


def _cycle_record(cycle: Cycle) -> dict[str, Any]:
    record = asdict(cycle)
    record["started_at"] = cycle.started_at.isoformat()
    record["finished_at"] = cycle.finished_at.isoformat()
    return record


def _cycle_from(record: dict[str, Any]) -> Cycle:
    values = dict(record)
    values["started_at"] = datetime.fromisoformat(values["started_at"])
    values["finished_at"] = datetime.fromisoformat(values["finished_at"])
    return Cycle(**values)


def encode_result(result: Result) -> bytes:
    record = {"kind": "result", "result": result.envelope()}
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def encode_cycle(cycle: Cycle) -> bytes:
    record = {"kind": "cycle", "cycle": _cycle_record(cycle)}
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class Spool:
    """One spool file (``path``) and its flushing copy beside it."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.flushing = self.path.with_name(self.path.name + ".flushing")
        self.rejected = self.path.with_name(self.path.name + ".rejected")
        # An append (from the event loop) and the rename that starts a flush (from the archive's
        # worker thread) never interleave: a record is in the file flushed, or in the next one.
        self._appending = threading.Lock()
        self._flushing = threading.Lock()

    # -- writing -------------------------------------------------------------------------------

    def append_result(self, result: Result) -> None:
        """Append one result, fsynced on return; OSError (e.g. ENOSPC) is the caller's to handle
        — nothing of the record is then counted as written."""
        self._append(encode_result(result))

    def append_cycle(self, cycle: Cycle) -> None:
        self._append(encode_cycle(cycle))

    def _append(self, line: bytes) -> None:
        with self._appending:
            self._append_locked(line)

    def _append_locked(self, line: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            # After a line cut short, start on a line of our own (the cut one is then skipped).
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = b"\n" + line
            written = os.write(fd, line)
            if written != len(line):
                # A short write (a nearly full disk): the partial line will be skipped on reading.
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- reading -------------------------------------------------------------------------------

    def pending(self) -> bool:
        return self.path.exists() or self.flushing.exists()

    def files(self) -> list[Path]:
        """The spool files with records, the one being flushed first."""
        return [p for p in (self.flushing, self.path) if p.exists()]

    @staticmethod
    def records(path: Path) -> Iterator[Result | Cycle | str]:
        """The records of one spool file in order, streamed; a line that cannot be read comes
        as a string "FILE:LINE: why" (and is kept aside in the ``.rejected`` file)."""
        with path.open("rb") as spool:
            for number, raw in enumerate(spool, start=1):
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                    if not isinstance(record, dict):
                        raise ValueError("not a JSON object")
                    kind = record.get("kind", "result")
                    if kind == "result":
                        body = record.get("result", record) if "kind" in record else record
                        yield Result.model_validate(body)
                    elif kind == "cycle":
                        yield _cycle_from(record["cycle"])
                    else:
                        raise ValueError(f"unknown record kind {kind!r}")
                except json.JSONDecodeError:
                    _keep_rejected(path, number, raw)
                    yield f"{path}:{number}: cut short (not complete JSON)"
                except (ValueError, KeyError, TypeError, ValidationError) as exc:
                    _keep_rejected(path, number, raw)
                    yield f"{path}:{number}: {_one_line(exc)}"

    @classmethod
    def read(cls, path: Path) -> SpoolRead:
        found = SpoolRead()
        for record in cls.records(path):
            if isinstance(record, Result):
                found.results.append(record)
            elif isinstance(record, Cycle):
                found.cycles.append(record)
            else:
                found.rejected.append(record)
        return found

    def flush(
        self,
        write_results: Callable[[list[Result]], int],
        write_cycles: Callable[[list[Cycle]], int],
    ) -> tuple[int, int, list[str]]:
        """Move every spooled record into the archive through the two writers (each "insert
        unless there", returning how many were new), ``FLUSH_CHUNK`` records per call, reading
        the file as it goes (memory stays flat after a long outage). Returns (results, cycles)
        read and the lines rejected. Raises whatever a writer raises; the records then stay
        spooled."""
        with self._flushing:
            return self._flush(write_results, write_cycles)

    def _flush(
        self,
        write_results: Callable[[list[Result]], int],
        write_cycles: Callable[[list[Cycle]], int],
    ) -> tuple[int, int, list[str]]:
        n_results = n_cycles = 0
        rejected: list[str] = []
        while True:
            if not self.flushing.exists():
                with self._appending:
                    if not self.path.exists():
                        return n_results, n_cycles, rejected
                    os.replace(self.path, self.flushing)
            results: list[Result] = []
            cycles: list[Cycle] = []
            for record in self.records(self.flushing):
                if isinstance(record, Result):
                    results.append(record)
                elif isinstance(record, Cycle):
                    cycles.append(record)
                else:
                    log.warning("spool line skipped (kept in %s): %s", self.rejected, record)
                    rejected.append(record)
                if len(results) >= FLUSH_CHUNK:
                    n_results += len(results)
                    write_results(results)
                    results = []
                if len(cycles) >= FLUSH_CHUNK:
                    n_cycles += len(cycles)
                    write_cycles(cycles)
                    cycles = []
            if results:
                write_results(results)
            if cycles:
                write_cycles(cycles)
            n_results += len(results)
            n_cycles += len(cycles)
            self.flushing.unlink()

    def count(self) -> tuple[int, int]:
        """(results, cycles) waiting in the spool files (a read of the files)."""
        results = cycles = 0
        for path in self.files():
            with path.open("rb") as spool:
                for raw in spool:
                    if b'"kind":"cycle"' in raw[:20]:
                        cycles += 1
                    elif raw.strip():
                        results += 1
        return results, cycles


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _keep_rejected(path: Path, number: int, raw: bytes) -> None:
    rejected = path.with_name(path.name.removesuffix(".flushing") + ".rejected")
    try:
        with rejected.open("ab") as out:
            out.write(f"# {path.name}:{number}\n".encode() + raw.rstrip(b"\n") + b"\n")
    except OSError as exc:  # a full disk: the line stays in the spool file read next time
        log.error("cannot keep rejected spool line %s:%d in %s: %s", path, number, rejected, exc)
        raise

"""The UDP flow collector: receive export packets, decode them, write the records in batches.

Two processes, so that decoding and archive writes never hold up the socket:

- the **receiver** (:class:`Collector`, the ``iepm flows collect`` process) only drains the
  socket: datagrams are packed into frames of up to ``FRAME_BYTES`` and queued in memory (the
  *spool*, at most ``spool_bytes``), and a sender thread writes the frames to the worker's stdin.
  A burst the worker cannot take at once waits in the spool instead of overflowing the socket's
  receive buffer; a frame that does not fit in the spool is dropped and counted.
- the **worker** (``python -m iepm.flows.worker``, started through the project's supervisor)
  decodes the frames and writes the records through :class:`Pipeline` (a writer thread behind a
  bounded queue, so a hung archive drops batches, counted, and decoding goes on).

On stop the receiver reads what the kernel already queued, hands every frame over, closes the
worker's stdin and waits for its report: a record that reached the socket is stored or counted as
dropped, never left behind. Records carry a digest id, so nothing is stored twice. (If the
worker dies, what it had read and what the pipe held — at most its queue and 64 KiB — is lost
without a count; the rest is counted in ``spool_dropped`` and the report says the worker died.)
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import queue
import resource
import socket
import struct
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from subprocess import PIPE
from typing import IO, Any

from iepm.errors import IepmError
from iepm.flows.decode import Decoder, DecodeStats
from iepm.flows.records import FlowColumns
from iepm.flows.store import add_flows
from iepm.runner import SyncSupervised, start_process_sync
from iepm.store import Archive

log = logging.getLogger(__name__)

# A UDP burst is absorbed by the socket buffer while the receiver is busy; the kernel caps it at
# net.core.rmem_max unless we are root (SO_RCVBUFFORCE).
RCVBUF_BYTES = 64 << 20
SO_RCVBUFFORCE = 33  # Linux; Python's socket module does not name it
MAX_DATAGRAM = 65535
# How often the receiver looks at the stop flag while no datagram comes.
POLL_S = 0.2
# On stop, what the kernel already accepted is still read, for at most this long.
DRAIN_S = 5.0
# Receiver → worker frames: large enough that a write per frame costs nothing per datagram,
# small enough that records reach the archive soon at low rates (also sent every FRAME_S).
FRAME_BYTES = 1 << 20
FRAME_S = 0.05
SPOOL_BYTES = 512 << 20
# One datagram inside a frame: exporter address length, datagram length.
ITEM = struct.Struct("!BH")
READY = "ready"  # the worker's first line: archive open, records will be stored
PROGRESS = "flows progress"  # the worker's stderr lines with ``progress_s`` set
FRAME = struct.Struct("!I")
# The writer joins queued batches into one transaction of at most about this many records.
WRITE_RECORDS = 50_000


@dataclass
class CollectorReport:
    """What a collector run did: the receiver's counters, the decoder's and the archive's."""

    decode: DecodeStats
    received: int = 0  # datagrams read from the socket
    spool_dropped: int = 0  # datagrams dropped because the spool was full (worker behind)
    spool_peak_bytes: int = 0
    stored: int = 0  # new rows
    duplicates: int = 0  # records already stored (a datagram seen twice)
    dropped: int = 0  # records in batches the archive could not take in time
    store_errors: int = 0  # batches whose write failed
    batches: int = 0
    elapsed_s: float = 0.0
    receiver_peak_rss_kb: int = 0
    worker_peak_rss_kb: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["decode"] = self.decode.as_dict()
        out["errors"] = self.errors[-5:]
        return out


def peak_rss_kb() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux


class Pipeline:
    """Decode datagrams and write their records in batches (the worker's part).

    The caller decodes (:meth:`feed`) and a writer thread takes full batches through a bounded
    queue. A batch that cannot be queued within the write deadline — the archive is hung — is
    dropped and counted."""

    def __init__(
        self,
        archive: Archive | None,
        *,
        batch_records: int = 5000,
        flush_s: float = 1.0,
        write_deadline_s: float = 30.0,
        queue_batches: int = 8,
        source: str = "udp",
    ) -> None:
        self.archive = archive
        self.batch_records = batch_records
        self.flush_s = flush_s
        self.write_deadline_s = write_deadline_s
        self.source = source
        self.decoder = Decoder()
        self.report = CollectorReport(self.decoder.stats)
        self._queue: queue.Queue[FlowColumns | None] = queue.Queue(maxsize=queue_batches)
        self.lock = threading.Lock()  # guards report (the writer thread updates it)
        self._batch = FlowColumns()  # columns, not a tuple per record (see FlowColumns)
        self._flushed = time.monotonic()
        self._writer = threading.Thread(target=self._write_loop, name="iepm-flows-writer")
        self._writer.daemon = True
        self._writer.start()

    def feed(self, packet: bytes, exporter: str) -> None:
        self._batch.extend(FlowColumns.of(self.decoder.decode(packet, exporter)))
        if len(self._batch) >= self.batch_records:
            self.tick(force=True)

    def feed_many(self, packets: list[tuple[bytes, str]]) -> None:
        """:meth:`feed` for a receiver frame's datagrams, decoded together (numpy per frame)."""
        self._batch.extend(self.decoder.decode_columns(packets))
        if len(self._batch) >= self.batch_records:
            self.tick(force=True)

    def tick(self, *, force: bool = False) -> None:
        """Hand the pending records to the writer if the batch is full or ``flush_s`` passed."""
        now = time.monotonic()
        if len(self._batch) and (force or now - self._flushed >= self.flush_s):
            self._hand_over(self._batch)
            self._batch, self._flushed = FlowColumns(), now

    def close(self) -> CollectorReport:
        """Write what is pending, waiting at most the write deadline for the archive."""
        if len(self._batch):
            self._hand_over(self._batch)
            self._batch = FlowColumns()
        self._queue_put(None)
        self._writer.join(self.write_deadline_s)
        if self._writer.is_alive():
            self.error(f"archive writes still running after {self.write_deadline_s:g} s")
        return self.report

    def _hand_over(self, batch: FlowColumns) -> None:
        if not self._queue_put(batch):
            with self.lock:
                self.report.dropped += len(batch)
            self.error(f"archive took no batch for {self.write_deadline_s:g} s: batch dropped")

    def _queue_put(self, item: FlowColumns | None) -> bool:
        try:
            self._queue.put(item, timeout=self.write_deadline_s)
        except queue.Full:
            return False
        return True

    def _write_loop(self) -> None:
        done = False
        while not done:
            batch = self._queue.get()
            if batch is None:
                break
            # Batches that queued up while the last write ran go in the same transaction (up
            # to WRITE_RECORDS): a backlog is written with fewer commits, each an fsync.
            while len(batch) < WRITE_RECORDS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    done = True
                    break
                batch.extend(more)
            if self.archive is None:  # decode-only: count as stored
                stored = len(batch)
            else:
                try:
                    stored = add_flows(self.archive, batch, self.source)
                except IepmError as exc:
                    with self.lock:
                        self.report.store_errors += 1
                        self.report.dropped += len(batch)
                    self.error(str(exc))
                    continue
            with self.lock:
                self.report.batches += 1
                self.report.stored += stored
                self.report.duplicates += len(batch) - stored

    def error(self, message: str) -> None:
        log.error("flows collector: %s", message)
        with self.lock:
            self.report.errors.append(message)


def unpack_frame(frame: bytes) -> list[tuple[bytes, str]]:
    """The (datagram, exporter) pairs of one receiver frame."""
    out = []
    pos, end = 0, len(frame)
    while pos < end:
        exporter_len, size = ITEM.unpack_from(frame, pos)
        pos += ITEM.size
        exporter = frame[pos : pos + exporter_len].decode()
        pos += exporter_len
        out.append((frame[pos : pos + size], exporter))
        pos += size
    return out


class Collector:
    """A bound UDP socket, the spool behind it and the worker process that stores the records."""

    def __init__(
        self,
        archive_url: str | None,
        host: str,
        port: int,
        *,
        batch_records: int = 5000,
        flush_s: float = 1.0,
        write_deadline_s: float = 30.0,
        source: str = "udp",
        rcvbuf_bytes: int = RCVBUF_BYTES,
        spool_bytes: int = SPOOL_BYTES,
        progress_s: float | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf_bytes)
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(POLL_S)
        self.settings = {
            "db": archive_url, "batch_records": batch_records, "flush_s": flush_s,
            "write_deadline_s": write_deadline_s, "source": source, "progress_s": progress_s,
        }  # fmt: skip
        self.write_deadline_s = write_deadline_s
        self.spool_bytes = spool_bytes
        self.report = CollectorReport(DecodeStats())
        self.stop = threading.Event()
        self.ready = threading.Event()  # the worker has opened the archive
        self._spool: collections.deque[bytes | None] = collections.deque()
        self._spooled = 0  # bytes in the spool
        self._ready = threading.Condition()
        self._worker: SyncSupervised | None = None
        self._worker_out = bytearray()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def worker_pid(self) -> int | None:
        return None if self._worker is None else self._worker.pid

    def run(self, duration_s: float | None = None) -> CollectorReport:
        """Receive until :attr:`stop` is set (or ``duration_s`` passes); then hand over what is
        pending and wait for the worker to store it."""
        started = time.monotonic()
        worker = self._worker = start_process_sync(
            [sys.executable, "-m", "iepm.flows.worker"], stdin=PIPE, stdout=PIPE, stderr=None
        )
        assert worker.popen.stdin is not None and worker.popen.stdout is not None
        self._send_frame(worker.popen.stdin, json.dumps(self.settings).encode())
        sender = threading.Thread(
            target=self._send_loop, args=(worker.popen.stdin,), name="iepm-flows-sender"
        )
        reader = threading.Thread(
            target=self._read_report, args=(worker.popen.stdout,), name="iepm-flows-report"
        )
        sender.daemon = reader.daemon = True
        sender.start()
        reader.start()
        try:
            self._receive(started, duration_s)
        finally:
            self.sock.close()
            with self._ready:
                self._spool.append(None)
                self._ready.notify()
            self._finish(sender, reader)
            self.report.elapsed_s = time.monotonic() - started
            self.report.receiver_peak_rss_kb = peak_rss_kb()
        return self.report

    def _receive(self, started: float, duration_s: float | None) -> None:
        parts: list[bytes] = []
        size = 0
        framed = time.monotonic()
        recvfrom = self.sock.recvfrom
        pack = ITEM.pack
        names: dict[str, bytes] = {}
        received = 0
        draining_until: float | None = None
        while True:
            if draining_until is None and (
                self.stop.is_set()
                or (duration_s is not None and time.monotonic() - started >= duration_s)
            ):
                # Read what the kernel already accepted (a TERM must not drop it), then stop.
                self.sock.settimeout(0.0)
                draining_until = time.monotonic() + DRAIN_S
            try:
                packet, peer = recvfrom(MAX_DATAGRAM)
            except (TimeoutError, BlockingIOError):
                packet = b""
                if draining_until is not None:
                    break
            else:
                name = names.get(peer[0])
                if name is None:
                    name = names[peer[0]] = peer[0].encode()[:255]
                parts.append(pack(len(name), len(packet)))
                parts.append(name)
                parts.append(packet)
                size += len(packet) + len(name) + ITEM.size
                received += 1
            now = time.monotonic()
            if draining_until is not None and now > draining_until:
                break
            if size and (size >= FRAME_BYTES or now - framed >= FRAME_S):
                self._spool_frame(b"".join(parts), len(parts) // 3)
                parts, size, framed = [], 0, now
                self.report.received = received
        if parts:
            self._spool_frame(b"".join(parts), len(parts) // 3)
        self.report.received = received

    def _spool_frame(self, frame: bytes, datagrams: int) -> None:
        with self._ready:
            if self._spooled + len(frame) > self.spool_bytes:
                self.report.spool_dropped += datagrams
                return
            self._spool.append(frame)
            self._spooled += len(frame)
            self.report.spool_peak_bytes = max(self.report.spool_peak_bytes, self._spooled)
            self._ready.notify()

    def _send_loop(self, stdin: IO[bytes]) -> None:
        dead = False
        while True:
            with self._ready:
                while not self._spool:
                    self._ready.wait()
                frame = self._spool.popleft()
                if frame is not None:
                    self._spooled -= len(frame)
            if frame is None:
                break
            if not dead:
                try:
                    self._send_frame(stdin, frame)
                    continue
                except (ValueError, OSError):  # a broken pipe: the worker is gone
                    dead = True
                    self._error("the flows worker stopped taking records")
            with self._ready:
                self.report.spool_dropped += len(unpack_frame(frame))
        with contextlib.suppress(OSError):
            stdin.close()

    @staticmethod
    def _send_frame(stdin: IO[bytes], frame: bytes) -> None:
        stdin.write(FRAME.pack(len(frame)))
        stdin.write(frame)
        stdin.flush()

    def _read_report(self, stdout: IO[bytes]) -> None:
        if stdout.readline().strip() == READY.encode():
            self.ready.set()
        while chunk := stdout.read(65536):
            self._worker_out += chunk

    def _finish(self, sender: threading.Thread, reader: threading.Thread) -> None:
        """Wait for the spool to be handed over and the worker's report; stop it if late."""
        assert self._worker is not None
        # Every frame still spooled must reach the worker, which may be writing a backlog: wait
        # as long as the spool shrinks, and at most the write deadline without progress.
        spooled, progress_at = self._spooled, time.monotonic()
        while sender.is_alive() and self._worker.popen.poll() is None:
            sender.join(0.5)
            if self._spooled != spooled:
                spooled, progress_at = self._spooled, time.monotonic()
            elif time.monotonic() - progress_at > self.write_deadline_s * 2 + DRAIN_S:
                self._error("the flows worker took no records in time: stopped")
                break
        # The worker writes what it holds: its queue of batches, each within the deadline.
        if self._worker.wait(self.write_deadline_s * 2 + DRAIN_S) is None:
            self._error("the flows worker did not finish its writes in time: stopped")
        self._worker.stop()
        sender.join(DRAIN_S)  # a stopped worker breaks the pipe: the rest is counted dropped
        reader.join(DRAIN_S)
        text = bytes(self._worker_out).decode(errors="replace").strip()
        try:
            worker = json.loads(text.splitlines()[-1]) if text else None
        except json.JSONDecodeError:
            worker = None
        if not isinstance(worker, dict):
            self._error(f"the flows worker gave no report (exit status {self._worker.returncode})")
            return
        decode = worker.pop("decode", {})
        for key, value in decode.items():
            setattr(self.report.decode, key, value)
        for key in ("stored", "duplicates", "dropped", "store_errors", "batches"):
            setattr(self.report, key, worker.get(key, 0))
        self.report.worker_peak_rss_kb = worker.get("worker_peak_rss_kb", 0)
        self.report.errors[:0] = worker.get("errors", [])

    def _error(self, message: str) -> None:
        log.error("flows collector: %s", message)
        self.report.errors.append(message)

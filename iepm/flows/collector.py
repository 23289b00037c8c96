"""The UDP flow collector: receive export packets, decode them, write the records in batches.

Two threads: the receiver decodes as datagrams arrive and hands full batches to the writer
through a bounded queue, so a slow archive never stalls the socket (whose receive buffer is what
absorbs bursts). A batch that cannot be queued within the write deadline — the archive is hung —
is dropped and counted, and the collector keeps receiving.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from iepm.errors import IepmError
from iepm.flows.decode import Decoder, DecodeStats, Flow
from iepm.flows.store import add_flows
from iepm.store import Archive

log = logging.getLogger(__name__)

# A UDP burst is absorbed by the socket buffer while a batch is decoded or written; the kernel
# caps it at net.core.rmem_max unless we are root (SO_RCVBUFFORCE).
RCVBUF_BYTES = 64 << 20
SO_RCVBUFFORCE = 33  # Linux; Python's socket module does not name it
MAX_DATAGRAM = 65535
# How often the receiver looks at the stop flag while no datagram comes.
POLL_S = 0.2
# On stop, what the kernel already accepted is still read, for at most this long.
DRAIN_S = 5.0


@dataclass
class CollectorReport:
    """What a collector run did: the decoder's counters and the archive's."""

    decode: DecodeStats
    stored: int = 0  # new rows
    duplicates: int = 0  # records already stored (a datagram seen twice)
    dropped: int = 0  # records in batches the archive could not take in time
    store_errors: int = 0  # batches whose write failed
    batches: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["decode"] = self.decode.as_dict()
        out["errors"] = self.errors[-5:]
        return out


class Collector:
    """A bound UDP socket and the threads that read and store what arrives on it."""

    def __init__(
        self,
        archive: Archive | None,
        host: str,
        port: int,
        *,
        batch_records: int = 5000,
        flush_s: float = 1.0,
        write_deadline_s: float = 30.0,
        queue_batches: int = 8,
        source: str = "udp",
        rcvbuf_bytes: int = RCVBUF_BYTES,
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
        self.archive = archive
        self.batch_records = batch_records
        self.flush_s = flush_s
        self.write_deadline_s = write_deadline_s
        self.source = source
        self.decoder = Decoder()
        self.report = CollectorReport(self.decoder.stats)
        self._queue: queue.Queue[list[Flow] | None] = queue.Queue(maxsize=queue_batches)
        self._lock = threading.Lock()
        self.stop = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.sock.getsockname()[:2]
        return str(host), int(port)

    def run(self, duration_s: float | None = None) -> CollectorReport:
        """Receive until :attr:`stop` is set (or ``duration_s`` passes); then write what is
        pending, waiting at most the write deadline for the archive."""
        started = time.monotonic()
        writer = threading.Thread(target=self._write_loop, name="iepm-flows-writer", daemon=True)
        writer.start()
        batch: list[Flow] = []
        flushed = time.monotonic()
        decode = self.decoder.decode
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if duration_s is not None and now - started >= duration_s:
                    break
                try:
                    packet, peer = self.sock.recvfrom(MAX_DATAGRAM)
                except TimeoutError:
                    packet = b""
                else:
                    batch.extend(decode(packet, peer[0]))
                if batch and (len(batch) >= self.batch_records or now - flushed >= self.flush_s):
                    self._hand_over(batch)
                    batch, flushed = [], now
            batch.extend(self._drain())
        finally:
            if batch:
                self._hand_over(batch)
            self._queue_put(None)
            writer.join(self.write_deadline_s)
            if writer.is_alive():
                self._error(f"archive writes still running after {self.write_deadline_s:g} s")
            self.sock.close()
            self.report.elapsed_s = time.monotonic() - started
        return self.report

    def _drain(self) -> list[Flow]:
        """Decode the datagrams already queued on the socket (a TERM must not drop them)."""
        flows: list[Flow] = []
        self.sock.settimeout(0.0)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            try:
                packet, peer = self.sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, TimeoutError):
                break
            flows.extend(self.decoder.decode(packet, peer[0]))
        return flows

    def _hand_over(self, batch: list[Flow]) -> None:
        if not self._queue_put(batch):
            with self._lock:
                self.report.dropped += len(batch)
            self._error(f"archive took no batch for {self.write_deadline_s:g} s: batch dropped")

    def _queue_put(self, item: list[Flow] | None) -> bool:
        try:
            self._queue.put(item, timeout=self.write_deadline_s)
        except queue.Full:
            return False
        return True

    def _write_loop(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self.archive is None:  # decode-only (benchmarks): count as stored
                stored = len(batch)
            else:
                try:
                    stored = add_flows(self.archive, batch, self.source)
                except IepmError as exc:
                    with self._lock:
                        self.report.store_errors += 1
                        self.report.dropped += len(batch)
                    self._error(str(exc))
                    continue
            with self._lock:
                self.report.batches += 1
                self.report.stored += stored
                self.report.duplicates += len(batch) - stored

    def _error(self, message: str) -> None:
        log.error("flows collector: %s", message)
        with self._lock:
            self.report.errors.append(message)

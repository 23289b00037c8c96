"""The UDP collector on loopback, writing to a real archive (SQLite, and PostgreSQL when marked)."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from iepm.errors import StoreError
from iepm.flows.collector import PROGRESS, Collector, CollectorReport, Pipeline
from iepm.flows.store import add_flows, read_flows
from iepm.store import Archive
from testkit import flow_encoder as enc
from testkit.flow_encoder import F

# A real UDP collector on loopback (its writer a child process), and `iepm flows collect`.
pytestmark = pytest.mark.servers

NOW = int(time.time() * 1000)
UPTIME = 3_600_000
ROOT = Path(__file__).resolve().parents[2]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met within the deadline")
        time.sleep(0.01)


def sample(n: int, base: int = 0) -> list[F]:
    return [
        F("198.18.1.2", "198.18.2.2", 40000 + base + i, 5201, 6, 1000 * (i + 1), 10,
          NOW - 20_000 + i, NOW - 1000 + i)
        for i in range(n)
    ]  # fmt: skip


@pytest.fixture
def archive(archive_url: str) -> Iterator[Archive]:
    with Archive.open(archive_url) as opened:
        yield opened


class Running:
    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.report: CollectorReport | None = None
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        self.report = self.collector.run()

    def finish(self) -> CollectorReport:
        self.collector.stop.set()
        self.thread.join(120)  # the worker writes its backlog first (slow on a busy host)
        assert not self.thread.is_alive(), "collector still running"
        assert self.report is not None
        return self.report


def test_collects_all_versions_once_each_and_counts_loss(
    archive: Archive, archive_url: str
) -> None:
    collector = Collector(archive_url, "127.0.0.1", 0, batch_records=4, flush_s=0.05)
    running = Running(collector)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    address = collector.address
    v5 = enc.v5(sample(3), seq=0, now_ms=NOW, uptime_ms=UPTIME)
    v9 = enc.v9(
        [enc.template_set(9, 256, enc.V9_FIELDS),
         enc.data_set(256, sample(2, 10), enc.V9_FIELDS, now_ms=NOW, uptime_ms=UPTIME)],
        seq=0, now_ms=NOW - NOW % 1000 + 1000, uptime_ms=UPTIME,
    )  # fmt: skip
    ipfix = enc.ipfix(
        [enc.template_set(10, 300, enc.IPFIX_FIELDS),
         enc.data_set(300, sample(4, 20), enc.IPFIX_FIELDS, now_ms=NOW)],
        seq=0, now_ms=NOW,
    )  # fmt: skip
    # The v5 datagram twice (a duplicate), then one whose sequence skips 5 records.
    gap = enc.v5(sample(1, 30), seq=8, now_ms=NOW, uptime_ms=UPTIME)
    for packet in (v5, v5, v9, ipfix, gap, b"\x00\x05truncated"):
        out.sendto(packet, address)
    out.close()
    wait_until(lambda: collector.report.received == 6)
    report = running.finish()
    assert report.decode.packets == 6 and report.spool_dropped == 0
    assert report.decode.records == 3 + 3 + 2 + 4 + 1
    assert report.stored == 3 + 2 + 4 + 1 and report.duplicates == 3
    assert report.decode.truncated == 1
    # The duplicate's sequence number is behind: out of order, and the gap 3→8 is 5 records.
    assert report.decode.out_of_order == 1 and report.decode.lost == 5
    stored = list(read_flows(archive))
    assert len(stored) == 10
    assert {f.version for f in stored} == {5, 9, 10}
    assert sorted(f.bytes for f in stored if f.version == 10) == [1000, 2000, 3000, 4000]


def test_reimport_stores_nothing_twice(archive: Archive) -> None:
    from iepm.flows.decode import Decoder

    flows = Decoder().decode(enc.v5(sample(5), seq=0, now_ms=NOW, uptime_ms=UPTIME), "198.18.0.1")
    assert add_flows(archive, flows, "test") == 5
    assert add_flows(archive, flows + flows, "test") == 0
    assert len(list(read_flows(archive))) == 5


def test_a_hung_archive_drops_batches_and_keeps_decoding() -> None:
    release = threading.Event()

    class Stuck:
        def writing(self, doing: str) -> None:
            release.wait(30)
            raise StoreError("archive hung")

    pipeline = Pipeline(
        Stuck(),  # type: ignore[arg-type]
        batch_records=1, flush_s=0.01, write_deadline_s=0.2, queue_batches=1,
    )  # fmt: skip
    for seq in range(6):
        pipeline.feed(enc.v5(sample(1, seq), seq=seq, now_ms=NOW, uptime_ms=UPTIME), "198.18.0.1")
    assert pipeline.report.dropped > 0  # the queue was full for the whole write deadline
    release.set()
    report = pipeline.close()
    assert report.decode.records == 6 and report.decode.lost == 0
    assert report.stored == 0 and report.dropped == 6  # records, queued late or failed
    assert "batch dropped" in report.errors[0]


# 15,000 records in 500-record batches: seconds of backlog for the worker when stop comes,
# so stop still finds the socket and the spool full (45,000 tested the same, 3 times longer).
BURST_PACKETS = 500
BURST_RECORDS = 30 * BURST_PACKETS


def test_stop_hands_every_queued_record_over_and_stores_none_twice(
    archive: Archive, archive_url: str
) -> None:
    """A burst sent just before stop: what the socket and the spool hold still reaches the
    archive (the worker writes its backlog after the receiver stopped), each record once."""
    packets = [
        enc.v5(
            [F("198.18.1.2", "198.18.2.2", 40000 + i, 5201, 6, 30 * k + i + 1, 10, NOW - 9000, NOW)
             for i in range(30)],
            seq=30 * k, now_ms=NOW, uptime_ms=UPTIME,
        )
        for k in range(BURST_PACKETS)
    ]  # fmt: skip
    for attempt in range(2):
        collector = Collector(archive_url, "127.0.0.1", 0, batch_records=500, flush_s=0.05)
        running = Running(collector)
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for packet in packets:
            out.sendto(packet, collector.address)
        out.close()
        report = running.finish()  # no wait: stop while the datagrams are still queued
        assert report.received == len(packets) and report.spool_dropped == 0, report.errors
        assert report.decode.records == BURST_RECORDS and report.dropped == 0
        if attempt == 0:
            assert report.stored == BURST_RECORDS and report.duplicates == 0
        else:  # the same records again: all known
            assert report.stored == 0 and report.duplicates == BURST_RECORDS
        assert report.worker_peak_rss_kb > 0
    with archive.reading("count") as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM flows").scalar() == BURST_RECORDS


def test_a_full_spool_drops_datagrams_and_counts_them(archive_url: str) -> None:
    collector = Collector(archive_url, "127.0.0.1", 0, spool_bytes=1)
    running = Running(collector)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for seq in range(5):
        out.sendto(
            enc.v5(sample(2, seq), seq=2 * seq, now_ms=NOW, uptime_ms=UPTIME), collector.address
        )
    out.close()
    wait_until(lambda: collector.report.received == 5)
    report = running.finish()
    assert report.spool_dropped == 5 and report.stored == 0 and report.decode.packets == 0


def _exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, all its threads, without reaping it."""
    flags = os.WEXITED | os.WNOWAIT | os.WNOHANG
    return os.waitid(os.P_PID, pid, flags) is not None


def test_a_dead_worker_is_reported_and_what_it_missed_counted(archive_url: str) -> None:
    collector = Collector(archive_url, "127.0.0.1", 0, flush_s=0.05)
    running = Running(collector)
    wait_until(collector.ready.is_set, 120)
    pid = collector.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # our own child, by its PID
    # Gone, not only signalled: every thread exited (one in disk sleep ends when its I/O does),
    # so its end of the pipe is closed. What the pipe held when it died is lost, uncounted.
    wait_until(lambda: _exited(pid), 60)
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for seq in range(5):
        packet = enc.v5(sample(2, seq), seq=2 * seq, now_ms=NOW, uptime_ms=UPTIME)
        out.sendto(packet, collector.address)
    out.close()
    wait_until(lambda: collector.report.received == 5)
    report = running.finish()
    assert report.spool_dropped == 5 and report.stored == 0
    assert any("worker" in e for e in report.errors), report.errors


def progress_lines(stream: IO[str], until: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Read ``flows progress`` lines until one satisfies ``until`` (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not select.select([stream], [], [], 0.5)[0]:
            continue
        line = stream.readline()
        assert line, "stderr closed"
        if line.startswith(PROGRESS):
            item: dict[str, int] = json.loads(line[len(PROGRESS) :])
            if until(item):
                return item
    raise AssertionError("no such progress line within 60 s")


def test_cli_collect_stores_and_reports_on_term(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iepm.cli", "flows", "collect", "--listen", "127.0.0.1:0",
         "--db", url, "--flush-s", "0.05", "--progress-s", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the collector says where it listens once bound
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        out.sendto(enc.v5(sample(7), seq=0, now_ms=NOW, uptime_ms=UPTIME), ("127.0.0.1", port))
        out.close()
        with Archive.open(url) as archive:
            # The worker starts (imports, opens the archive) after the datagram came: a loaded
            # host takes its time.
            wait_until(lambda: len(list(read_flows(archive))) == 7, 120)
        # Progress lines count records once they are committed.
        item = progress_lines(proc.stderr, lambda item: item["stored"] == 7)
        assert item["records"] == 7 and item["pid"] != proc.pid
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0
    report = json.loads(stdout)
    assert report["decode"]["records"] == 7 and report["stored"] == 7


def test_cli_collect_rejects_a_bad_listen_address(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "iepm.cli", "flows", "collect", "--listen", "nowhere",
         "--db", f"sqlite:///{tmp_path / 'a.db'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "--listen" in proc.stderr

"""Flow ingest: ``iepm flows collect`` against nfcapd on the same stream, in the same run.

For NetFlow v5, v9 and IPFIX, export packets (30 records each, sequence numbers running, v9/IPFIX
templates re-sent every 20 packets, every record distinct) are replayed on loopback; every packet
goes to both collectors, which get the same socket receive buffer. nfcapd writes its file
(counted with ``nfdump -I``); iepm writes its archive. Three parts:

- ``receive``: short steps (``--seconds``) at rising rates. A collector's *loss-free receive
  rate* is the highest step at which it got every record (iepm: decoded, its spool may still be
  writing them); ``ratio`` is iepm's over nfcapd's.
- ``sustained``: the stream is held for ``--hold`` seconds (long enough that iepm's memory spool
  cannot hide a backlog) at rising rates, into SQLite and into PostgreSQL. iepm's records count
  only once committed to the archive (the worker's progress lines, ``--progress-s``). iepm's
  *sustained loss-free rate* is the highest step at which every record was in the archive within
  ``KEPT_PACE_S`` of the sender's end; ``stored_per_s`` is the slope of its committed count over
  the hold (after the first ``WARMUP`` of it), the rate it sustains when the stream is faster.
  nfcapd's sustained loss-free rate is the highest step at which its file had every record
  (steps go on with nfcapd alone once iepm fell behind). ``ratio``: iepm's over nfcapd's.
- ``store``: where the worker's time goes, per record, on the same rows: decoding, building the
  rows (ids), iepm's ``add_flows`` into a fresh archive, and the baseline a user would reach with
  no iepm code at all: the driver alone (sqlite3 ``executemany`` of a plain INSERT in WAL mode /
  psycopg's binary ``COPY`` straight into the table), same schema, same transactions.

- ``ceiling``: the archive's own ceiling, with nothing of iepm's Python in the way: the same kind of
  rows, as a CSV file built beforehand, loaded into iepm's real ``flows`` table (primary key and
  indexes) by the server's ``COPY FROM`` file / the ``sqlite3`` CLI's ``.import``; rows/s (the
  fastest of ``CEILING_LOADS``) and CPU per row (the load barely moves it). ``summary`` puts it
  beside nfcapd's sustained loss-free rate and iepm's stored/s of the same run, with the ratios.

iepm's memory is the peak RSS (VmHWM) of its two processes (receiver + worker). PostgreSQL is a
durable server (fsync on) started for the run (testkit/pg.py), or ``--pg-url``. Prints one JSON
object; each step also goes to stderr as it ends.

    .venv/bin/python benchmarks/flows.py [--parts ceiling,store,receive,sustained]
        [--versions 5,9,10]
        [--seconds 2] [--rates 5000,...] [--hold 60] [--sustained-rates 20000,...]
        [--dbs sqlite,postgresql] [--store-rows 300000] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from iepm.flows import store  # noqa: E402
from iepm.flows.collector import PROGRESS  # noqa: E402
from iepm.flows.decode import Decoder  # noqa: E402
from iepm.flows.records import FlowColumns  # noqa: E402
from iepm.store import Archive  # noqa: E402
from testkit import flow_encoder as enc  # noqa: E402  (the independent encoder of the tests)
from testkit.net import free_port  # noqa: E402
from testkit.pg import find_bindir, running_server  # noqa: E402

RECORDS_PER_PACKET = 30
TEMPLATE_EVERY = 20
POOL_PACKETS = 20 * TEMPLATE_EVERY  # distinct base packets; each sent copy is made unique
RCVBUF = 4 << 20  # within net.core.rmem_max here, so nfcapd (SO_RCVBUF) gets what iepm gets
TICK_S = 0.002
KEPT_PACE_S = 5.0  # the worker writes at least every second (flush_s); a few writes late
WARMUP = 0.1  # of the hold, before the stored-rate slope is taken
PROGRESS_S = 0.5
# Octet counts of the pool's records: a marker found again in the packet, to patch it.
MARK = 0x5EED0000
SEQ_OFFSET = {5: 16, 9: 12, 10: 8}
WRITE_ROWS = 50_000  # rows per transaction in the store part (the writer's WRITE_RECORDS)
CEILING_LOADS = 3  # loads of the same file per ceiling; the fastest is the ceiling (load noise)
FRAME_PACKETS = 600  # datagrams per decode_many call in the store part (a 1 MiB receiver frame)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.01)


def udp_queue(port: int) -> int | None:
    """Bytes waiting in the receive queue of the UDP socket on ``port`` (None: no socket)."""
    out = subprocess.run(
        ["ss", "-Huln", f"sport = :{port}"], capture_output=True, text=True, timeout=5
    ).stdout.split()
    return int(out[1]) if len(out) > 1 else None


class Stream:
    """Export packets of one version, made with the tests' encoder once (a pool), then copied
    with their sequence number and each record's octet count rewritten: every record of the
    stream is distinct (iepm would store a repeated one once), at a sender's cost of a few
    ``pack_into`` per packet instead of encoding each record."""

    def __init__(self, version: int, rng: random.Random) -> None:
        self.version = version
        now = int(time.time() * 1000)
        wide = version == 10  # the IPFIX template's octet counter is 8 bytes
        self.pool: list[bytes] = []
        self.offsets: list[list[int]] = []
        for k in range(POOL_PACKETS):
            flows = [
                enc.F(f"198.18.{rng.randrange(256)}.{rng.randrange(256)}", "198.19.0.1",
                      rng.randrange(1024, 65536), 5201, 6, MARK + i,
                      rng.randrange(1, 10**6), now - 60_000 + k, now - 1000 + k)
                for i in range(RECORDS_PER_PACKET)
            ]  # fmt: skip
            if version == 5:
                packet = enc.v5(flows, seq=0, now_ms=now, uptime_ms=3_600_000)
            else:
                fields = enc.V9_FIELDS if version == 9 else enc.IPFIX_FIELDS
                sets = [enc.template_set(version, 256, fields)] if k % TEMPLATE_EVERY == 0 else []
                sets.append(enc.data_set(256, flows, fields, now_ms=now, uptime_ms=3_600_000))
                packet = (
                    enc.v9(sets, seq=0, now_ms=now, uptime_ms=3_600_000)
                    if version == 9
                    else enc.ipfix(sets, seq=0, now_ms=now)
                )
            width = 8 if wide else 4
            marks = [packet.find((MARK + i).to_bytes(width, "big"), 16) for i in range(30)]
            if min(marks) < 0 or len(set(marks)) != RECORDS_PER_PACKET:
                raise RuntimeError(f"v{version}: octet markers not found in the pool packet")
            self.pool.append(packet)
            self.offsets.append(marks)
        self.octets = struct.Struct(">Q" if wide else ">I")

    def packet(self, k: int) -> bytes:
        """Packet ``k`` of the stream: sequence as the exporter would number it (records for
        v5/IPFIX, packets for v9), octet counts 1 + the record's index in the stream."""
        buf = bytearray(self.pool[k % POOL_PACKETS])
        first = k * RECORDS_PER_PACKET
        struct.pack_into(">I", buf, SEQ_OFFSET[self.version], k if self.version == 9 else first)
        pack = self.octets.pack_into
        for i, offset in enumerate(self.offsets[k % POOL_PACKETS]):
            pack(buf, offset, first + i + 1)
        return bytes(buf)


def send(stream: Stream, packets: int, rate_records: float, ports: list[int]) -> float:
    """Send ``packets`` of ``stream`` to every port at ``rate_records`` records/s; returns the
    seconds taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    per_s = rate_records / RECORDS_PER_PACKET
    start = time.monotonic()
    sent = 0
    while sent < packets:
        due = min(packets, int((time.monotonic() - start) * per_s) + 1)
        while sent < due:
            packet = stream.packet(sent)
            for port in ports:
                sock.sendto(packet, ("127.0.0.1", port))
            sent += 1
        time.sleep(TICK_S)  # pacing between bursts of due packets, not a wait for a condition
    sock.close()
    return time.monotonic() - start


def stop(proc: subprocess.Popen[Any], timeout_s: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def vm_hwm_kb(pid: int | None) -> int:
    """Peak resident memory of a running process (0 if it is gone)."""
    if pid is None:
        return 0
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


class Nfcapd:
    def __init__(self, work: Path) -> None:
        self.port = free_port(udp=True)
        self.dir = work / f"nf-{self.port}"
        self.dir.mkdir()
        self.proc = subprocess.Popen(
            ["nfcapd", "-b", "127.0.0.1", "-p", str(self.port), "-w", str(self.dir),
             "-t", "3600", "-B", str(RCVBUF)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: udp_queue(self.port) is not None, 120, "nfcapd listening")

    def records(self) -> int:
        """Stop nfcapd (it closes its file) and count the records in its files."""
        stop(self.proc)
        total = 0
        for f in sorted(self.dir.glob("nfcapd.2*")):
            out = subprocess.run(
                ["nfdump", "-I", "-r", str(f)], capture_output=True, text=True, timeout=120
            ).stdout
            for line in out.splitlines():
                if line.startswith("Flows:"):
                    total += int(line.split(":")[1])
        shutil.rmtree(self.dir, ignore_errors=True)
        return total


class Iepm:
    """``iepm flows collect`` with progress lines: records decoded and committed, over time."""

    def __init__(self, db: str) -> None:
        self.port = free_port(udp=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "iepm.cli", "flows", "collect", "--listen",
             f"127.0.0.1:{self.port}", "--db", db, "--rcvbuf-bytes", str(RCVBUF),
             "--progress-s", str(PROGRESS_S)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
        )  # fmt: skip
        self.storing = threading.Event()
        self.progress: list[tuple[float, int, int]] = []  # (monotonic, decoded, stored)
        self.worker_pid: int | None = None
        self.stderr_closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        wait_until(
            lambda: self.storing.is_set() or self.proc.poll() is not None, 120, "iepm storing"
        )
        if not self.storing.is_set():
            raise RuntimeError("iepm flows collect exited before storing")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # the worker shares this stderr: EOF when both are gone
            if line.strip() == "storing records":
                self.storing.set()
            elif line.startswith(PROGRESS):
                item = json.loads(line[len(PROGRESS) :])
                self.worker_pid = item["pid"]
                self.progress.append((time.monotonic(), item["records"], item["stored"]))
        self.stderr_closed.set()

    def stored(self) -> int:
        return self.progress[-1][2] if self.progress else 0

    def stored_at(self, when: float) -> tuple[float, int]:
        """The last progress line at or before ``when``: (its time, records committed)."""
        best = (when, 0)
        for at, _, stored in self.progress:
            if at <= when:
                best = (at, stored)
        return best

    def peak_rss_kb(self) -> int:
        return vm_hwm_kb(self.proc.pid) + vm_hwm_kb(self.worker_pid)

    def finish(self) -> dict[str, Any]:
        """TERM: the receiver hands everything over, the worker writes it; its report."""
        stop(self.proc, 900)
        self.stderr_closed.wait(60)
        assert self.proc.stdout is not None
        lines = self.proc.stdout.read().strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    def abandon(self) -> None:
        """Kill both processes (ours, by PID): a backlog that would take minutes to write."""
        for pid in (self.proc.pid, self.worker_pid):
            if pid is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(30)
        self.stderr_closed.wait(30)


def receive_step(version: int, stream: Stream, rate: float, seconds: float, work: Path) -> dict:
    count = max(1, int(rate * seconds / RECORDS_PER_PACKET))
    iepm = Iepm(f"sqlite:///{work / f'recv-{uuid.uuid4().hex[:8]}.db'}")
    nf = Nfcapd(work)
    try:
        took = send(stream, count, rate, [iepm.port, nf.port])
        wait_until(lambda: udp_queue(iepm.port) == 0 and udp_queue(nf.port) == 0, 60, "drained")
        # VmHWM, not the report's ru_maxrss: Linux carries a parent's peak across fork+exec
        # into ru_maxrss, and this benchmark's own process is large.
        rss_kb = iepm.peak_rss_kb()
    finally:
        nf_records = nf.records()
        report = iepm.finish()
    sent = count * RECORDS_PER_PACKET
    return {
        "version": version, "rate_records_per_s": rate,
        "achieved_records_per_s": round(sent / took), "sent": sent,
        "iepm_records": report["decode"]["records"], "iepm_stored": report["stored"],
        "iepm_lost_by_sequence": report["decode"]["lost"],
        "iepm_spool_dropped_datagrams": report["spool_dropped"],
        "iepm_spool_peak_mb": round(report["spool_peak_bytes"] / 2**20, 1),
        "iepm_peak_rss_kb": rss_kb, "nfcapd_records": nf_records,
    }  # fmt: skip


def sustained_step(
    version: int, stream: Stream, rate: float, hold_s: float, db: str | None, work: Path
) -> dict[str, Any]:
    """``hold_s`` of stream at ``rate`` to nfcapd and (``db`` given) to iepm storing into db."""
    count = max(1, int(rate * hold_s / RECORDS_PER_PACKET))
    sent = count * RECORDS_PER_PACKET
    iepm = Iepm(db) if db is not None else None
    nf = Nfcapd(work)
    row: dict[str, Any] = {"version": version, "rate_records_per_s": rate, "sent": sent}
    row["load_before"] = os.getloadavg()[0]  # 2 cores shared with other work: the spread
    try:
        begun = time.monotonic()
        took = send(stream, count, rate, [nf.port] + ([iepm.port] if iepm else []))
        ended = time.monotonic()
        row["achieved_records_per_s"] = round(sent / took)
        wait_until(lambda: udp_queue(nf.port) == 0, 60, "nfcapd drained")
        if iepm is not None:
            # Kept pace: everything committed within KEPT_PACE_S of the sender's end.
            with suppress(TimeoutError):
                wait_until(lambda: iepm.stored() >= sent, KEPT_PACE_S, "iepm caught up")
            caught_up = time.monotonic() - ended if iepm.stored() >= sent else None
            t0, s0 = iepm.stored_at(begun + WARMUP * took)
            t1, s1 = iepm.stored_at(ended)
            row |= {
                "iepm_stored_at_send_end": s1,
                "iepm_stored_per_s": round((s1 - s0) / (t1 - t0)) if t1 > t0 else None,
                "iepm_decoded_at_send_end": next(
                    (d for at, d, _ in reversed(iepm.progress) if at <= ended), 0
                ),
                "iepm_all_stored_after_send_s": None if caught_up is None else round(caught_up, 2),
                "iepm_peak_rss_kb": iepm.peak_rss_kb(),
            }
    finally:
        row["nfcapd_records"] = nf.records()
        if iepm is not None:
            if iepm.stored() >= sent:
                report = iepm.finish()
                row["iepm_stored"] = report.get("stored")
                row["iepm_lost_by_sequence"] = report.get("decode", {}).get("lost")
                row["iepm_spool_dropped_datagrams"] = report.get("spool_dropped")
            else:
                # Behind: writing the backlog would take (sent - stored) / stored_per_s more.
                row["iepm_stored"] = iepm.stored()
                iepm.abandon()
    row["load_after"] = os.getloadavg()[0]
    if iepm is not None:
        row["iepm_kept_pace"] = (
            row["iepm_stored"] == sent
            and row.get("iepm_all_stored_after_send_s") is not None
            and row["iepm_all_stored_after_send_s"] <= KEPT_PACE_S
        )
    return row


def store_part(kind: str, url: str, base_url: str, rows_n: int, version: int) -> dict[str, Any]:
    """Per-record cost of each stage of the worker, on the same records, and the driver alone."""
    stream = Stream(version, random.Random(7))
    packets = [stream.packet(k) for k in range(rows_n // RECORDS_PER_PACKET)]
    # The per-record path (the code before numpy) as the decoding baseline, then the worker's
    # way: a frame of datagrams (FRAME_PACKETS) per decode_columns call, records as columns.
    reference = Decoder(vectorised=False)
    t = time.process_time()
    expected = [f for p in packets for f in reference.decode(p, "127.0.0.1")]
    reference_cpu = time.process_time() - t
    decoder = Decoder()
    t = time.process_time()
    columns = FlowColumns()
    for i in range(0, len(packets), FRAME_PACKETS):
        frame = [(p, "127.0.0.1") for p in packets[i : i + FRAME_PACKETS]]
        columns.extend(decoder.decode_columns(frame))
    decode_cpu = time.process_time() - t
    if columns.flows() != expected:
        raise RuntimeError("the numpy decoder's flows differ from the per-record decoder's")
    t = time.process_time()
    rows = list(store.flow_rows(columns, "udp"))
    rows_cpu = time.process_time() - t
    n = len(columns)

    def timed(write: Callable[[Any], None], items: Any) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(0, len(items), WRITE_ROWS):
            write(items[i : i + WRITE_ROWS])
        return time.perf_counter() - wall, time.process_time() - cpu

    with Archive.open(url) as archive:
        ours_wall, ours_cpu = timed(lambda chunk: store.add_flows(archive, chunk, "udp"), columns)
    with Archive.open(base_url):
        pass  # the same schema, made by iepm; the writes below are the driver's alone
    if kind == "sqlite":
        conn = sqlite3.connect(make_url(base_url).database or "", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        insert = f"INSERT INTO flows ({store._ID_SQL}) VALUES ({', '.join(['?'] * 15)})"

        def bare(chunk: list[Any]) -> None:
            conn.execute("BEGIN")
            conn.executemany(insert, chunk)
            conn.execute("COMMIT")

        base_wall, base_cpu = timed(bare, rows)
        conn.close()
        baseline = "sqlite3 executemany INSERT, WAL, synchronous=FULL, default cache"
    else:
        pg = psycopg.connect(
            make_url(base_url).set(drivername="postgresql").render_as_string(False)
        )

        def bare(chunk: list[Any]) -> None:
            with (
                pg.cursor() as cur,
                cur.copy(f"COPY flows ({store._ID_SQL}) FROM STDIN (FORMAT BINARY)") as copy,
            ):
                copy.set_types(store._PG_TYPES)
                for r in chunk:
                    copy.write_row(r)
            pg.commit()

        base_wall, base_cpu = timed(bare, rows)
        pg.close()
        baseline = "psycopg binary COPY straight into flows, no conflict check"
    return {
        "db": kind, "version": version, "records": n,
        "decode_cpu_us_per_record": round(decode_cpu / n * 1e6, 2),
        "decode_per_record_path_cpu_us_per_record": round(reference_cpu / n * 1e6, 2),
        "ids_and_rows_cpu_us_per_record": round(rows_cpu / n * 1e6, 2),
        "figure": {"add_flows_records_per_s": round(n / ours_wall),
                   "add_flows_cpu_us_per_record": round(ours_cpu / n * 1e6, 2)},
        "baseline": {"what": baseline, "records_per_s": round(n / base_wall),
                     "cpu_us_per_record": round(base_cpu / n * 1e6, 2)},
        "ratio": round(base_wall / ours_wall, 3),
        # Decoding then storing on one core of this process alone (PostgreSQL's own work is
        # in its server processes, not counted here).
        "worker_cpu_bound_records_per_s": round(n / (decode_cpu + ours_cpu) if ours_cpu else 0),
    }  # fmt: skip


def ceiling_part(kind: str, url: str, rows_n: int, version: int, work: Path) -> dict[str, Any]:
    """The archive's own ceiling: flow rows per second the database takes when nothing of iepm's
    Python is in the way, by the tool a user would pick, from a CSV file built beforehand —
    ``COPY flows ... FROM 'FILE' (FORMAT csv)`` read by the PostgreSQL server, the ``sqlite3``
    CLI's ``.import`` — into iepm's real ``flows`` table (primary key and both indexes), empty,
    in one transaction; the fastest of ``CEILING_LOADS`` loads.
    The rows are the store part's: the stream's records with iepm's ids."""
    stream = Stream(version, random.Random(11))
    packets = [stream.packet(k) for k in range(rows_n // RECORDS_PER_PACKET)]
    flows = Decoder().decode_columns([(p, "127.0.0.1") for p in packets])
    path = work / f"ceiling-{kind}-v{version}.csv"
    with path.open("w", newline="") as out:
        csv.writer(out).writerows(store.flow_rows(flows, "udp"))
    target = make_url(url)
    if kind == "sqlite":
        command = ["sqlite3", target.database or "", ".mode csv", f".import {path} flows"]
        what = "sqlite3 CLI .import of a CSV file (WAL, synchronous=FULL as iepm leaves the file)"
    else:
        # The server reads the file itself (it runs as another user: let it in).
        work.chmod(0o755)
        path.chmod(0o644)
        conninfo = target.set(drivername="postgresql").render_as_string(False)
        command = [f"COPY flows ({store._ID_SQL}) FROM '{path}' (FORMAT csv)"]
        what = "COPY flows FROM a CSV file read by the server (one transaction, fsync on)"
    walls, cpus, loads = [], [], []
    for _ in range(CEILING_LOADS):
        with Archive.open(url) as archive, archive.writing("empty flows") as conn:
            conn.exec_driver_sql("DELETE FROM flows")  # iepm's schema, empty: the tool's load
        loads.append(os.getloadavg()[0])
        if kind == "sqlite":
            child = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
            walls.append(time.perf_counter() - wall)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # sqlite3 does all of SQLite's work in its own process.
            cpus.append(after.ru_utime + after.ru_stime - child.ru_utime - child.ru_stime)
            if done.returncode != 0:
                raise RuntimeError(f"sqlite3 failed: {done.stderr.strip()}")
        else:
            with psycopg.connect(conninfo, autocommit=True) as pg:
                pg.execute("VACUUM flows")
                pg.execute("CHECKPOINT")  # the last load's dirty pages are not this one's work
                pg.autocommit = False
                # This connection's backend and the server's own processes (WAL writer,
                # checkpointer): their CPU is the archive's per-row cost, which load barely moves.
                pids = [*server_pids(), pg.info.backend_pid]
                server_cpu = cpu_s(pids)
                wall = time.perf_counter()
                pg.execute(command[0])
                pg.commit()
                walls.append(time.perf_counter() - wall)
                cpus.append(cpu_s(pids) - server_cpu)
        with Archive.open(url) as archive, archive.reading("count") as conn:
            stored = conn.exec_driver_sql("SELECT count(*) FROM flows").scalar_one()
        if stored != len(flows):
            raise RuntimeError(f"{kind} ceiling: {stored} rows stored of {len(flows)}")
    path.unlink()
    n, best_wall = len(flows), min(walls)
    return {
        "db": kind, "version": version, "rows": n, "what": what, "loads": CEILING_LOADS,
        "ceiling_rows_per_s": round(n / best_wall),
        "ceiling_rows_per_s_each": [round(n / w) for w in walls],
        # PostgreSQL: the backend's CPU, and the server's own processes' only for the run's own
        # server (not with --pg-url).
        "cpu_us_per_row": round(min(cpus) / n * 1e6, 2),
        "load_1min_each": [round(x, 2) for x in loads],
    }  # fmt: skip


PG_SERVER: dict[str, int] = {}  # the postmaster's PID when the run started its own server


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (0 for one that is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick


def server_pids() -> list[int]:
    """The run's own PostgreSQL server: the postmaster and its children (the backends, the
    WAL writer, the checkpointer); empty with ``--pg-url``."""
    root = PG_SERVER.get("pid")
    if root is None:
        return []
    pids = [root]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == root:
                pids.append(int(stat.parent.name))
    return pids


@contextmanager
def databases(dbs: list[str], pg_url: str | None, work: Path) -> Iterator[Callable[[str], str]]:
    """A function giving a new, empty database URL of a kind, each dropped afterwards."""
    with ExitStack() as stack:
        admin: psycopg.Connection[Any] | None = None
        server_url = pg_url
        if "postgresql" in dbs:
            if server_url is None:
                bindir = find_bindir()
                if bindir is None:
                    raise SystemExit("no PostgreSQL server binaries: give --pg-url or --dbs sqlite")
                # A durable server (fsync on): the figures are what a real archive would see.
                server = stack.enter_context(running_server(bindir, settings={}))
                server_url = server.url()
                pid_file = server.directory / "data" / "postmaster.pid"
                PG_SERVER["pid"] = int(pid_file.read_text().split()[0])
            admin = psycopg.connect(
                make_url(server_url).set(drivername="postgresql").render_as_string(False),
                autocommit=True,
            )
            stack.callback(admin.close)

        def new(kind: str) -> str:
            name = f"iepm_bench_{uuid.uuid4().hex[:8]}"
            if kind == "sqlite":
                return f"sqlite:///{work / (name + '.db')}"
            assert admin is not None and server_url is not None
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            stack.callback(
                admin.execute,
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
            )
            return make_url(server_url).set(database=name).render_as_string(False)

        yield new


def best(rates: list[float]) -> float:
    return max(rates) if rates else 0.0


def summary(report: dict[str, Any], versions: list[int], dbs: list[str]) -> list[dict[str, Any]]:
    """Per version and archive, the figures of this run side by side: nfcapd's sustained
    loss-free rate, the archive's ceiling, iepm's sustained stored/s, and their ratios."""
    out = []
    for version in versions:
        sustained = report.get("sustained", {}).get(f"v{version}", {})
        nfcapd = sustained.get("baseline", {}).get("nfcapd_sustained_loss_free_records_per_s")
        for kind in dbs:
            load = [
                x for s in sustained.get("steps", []) if s["db"] in (kind, None)
                for x in (s["load_before"], s["load_after"])
            ]  # fmt: skip
            ceiling = ceiling_cpu = worker_cpu = None
            for c in report.get("ceiling", []):
                if c["db"] == kind and c["version"] == version:
                    ceiling, ceiling_cpu = c["ceiling_rows_per_s"], c["cpu_us_per_row"]
                    load += c["load_1min_each"]
            for p in report.get("store", []):
                if p["db"] == kind and p["version"] == version:
                    # The worker's own CPU per record: decoding, then ids, rows and the write.
                    spent = (
                        p["decode_cpu_us_per_record"],
                        p["figure"]["add_flows_cpu_us_per_record"],
                    )
                    worker_cpu = round(sum(spent), 2)
            ours = sustained.get(kind, {}).get("figure", {})
            stored, loss_free = (
                ours.get("iepm_best_stored_per_s"),
                ours.get("iepm_sustained_loss_free_records_per_s"),
            )

            def ratio(a: float | None, b: float | None) -> float | None:
                return round(a / b, 3) if a is not None and b else None

            out.append({
                "version": version, "db": kind, "nfcapd_loss_free_records_per_s": nfcapd,
                "nfcapd_is_lower_bound": sustained.get("baseline_is_lower_bound"),
                "archive_ceiling_rows_per_s": ceiling,
                "archive_ceiling_cpu_us_per_row": ceiling_cpu,
                "iepm_worker_cpu_us_per_record": worker_cpu, "iepm_stored_per_s": stored,
                "iepm_loss_free_records_per_s": loss_free,
                "ceiling_over_nfcapd": ratio(ceiling, nfcapd),
                "iepm_stored_over_nfcapd": ratio(stored, nfcapd),
                "iepm_loss_free_over_nfcapd": ratio(loss_free, nfcapd),
                "iepm_stored_over_ceiling": ratio(stored, ceiling),
                "load_1min_range": [round(min(load), 1), round(max(load), 1)] if load else None,
            })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="ceiling,store,receive,sustained")
    parser.add_argument("--versions", default="5,9,10")
    parser.add_argument("--seconds", type=float, default=2.0, help="per receive step")
    parser.add_argument("--rates", default="10000,40000,160000,320000,640000")
    parser.add_argument("--hold", type=float, default=60.0, help="seconds per sustained step")
    parser.add_argument("--sustained-rates", default="10000,20000,40000,80000,160000,320000")
    parser.add_argument("--dbs", default="sqlite,postgresql")
    parser.add_argument("--store-rows", type=int, default=300_000)
    parser.add_argument("--pg-url", help="PostgreSQL server to create scratch databases on")
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    if shutil.which("nfcapd") is None or shutil.which("nfdump") is None:
        print(json.dumps({"benchmark": "flows", "skipped": "nfcapd/nfdump not installed"}))
        return
    parts = args.parts.split(",")
    versions = [int(v) for v in args.versions.split(",")]
    dbs = args.dbs.split(",")
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"benchmark": "flows", "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="iepm-bench-flows-") as tmp:
        work = Path(tmp)
        with databases(dbs, args.pg_url, work) as new_db:
            if "store" in parts:
                report["store"] = [
                    store_part(kind, new_db(kind), new_db(kind), args.store_rows, version)
                    for version in versions
                    for kind in dbs
                ]
                sys.stderr.write(json.dumps(report["store"]) + "\n")
            if "ceiling" in parts:
                report["ceiling"] = [
                    ceiling_part(kind, new_db(kind), args.store_rows, version, work)
                    for version in versions
                    for kind in dbs
                ]
                sys.stderr.write(json.dumps(report["ceiling"]) + "\n")
            streams = {v: Stream(v, rng) for v in versions}
            if "receive" in parts:
                out = report["receive"] = {"seconds_per_step": args.seconds}
                rates = [float(r) for r in args.rates.split(",")]
                for version in versions:
                    steps = []
                    for rate in rates:
                        row = receive_step(version, streams[version], rate, args.seconds, work)
                        steps.append(row)
                        sys.stderr.write(json.dumps(row) + "\n")
                        if (
                            row["iepm_records"] < row["sent"]
                            and row["nfcapd_records"] < row["sent"]
                        ):
                            break  # both lose: higher rates tell nothing more
                    ours = best(
                        [s["rate_records_per_s"] for s in steps if s["iepm_records"] == s["sent"]]
                    )
                    theirs = best(
                        [s["rate_records_per_s"] for s in steps if s["nfcapd_records"] == s["sent"]]
                    )
                    out[f"v{version}"] = {
                        "figure": {"iepm_loss_free_receive_records_per_s": ours},
                        "baseline": {"nfcapd_loss_free_records_per_s": theirs},
                        "ratio": round(ours / theirs, 3) if theirs else None,
                        "baseline_is_lower_bound": theirs == rates[-1],
                        "iepm_peak_rss_kb": max(s["iepm_peak_rss_kb"] for s in steps),
                        "steps": steps,
                    }  # fmt: skip
            if "sustained" in parts:
                out = report["sustained"] = {"hold_s": args.hold, "kept_pace_s": KEPT_PACE_S}
                rates = [float(r) for r in args.sustained_rates.split(",")]
                for version in versions:
                    steps, behind = [], set()
                    nf_ok = True
                    for rate in rates:
                        ran = False
                        for kind in dbs:
                            if kind in behind:
                                continue
                            row = sustained_step(
                                version, streams[version], rate, args.hold, new_db(kind), work
                            ) | {"db": kind}
                            steps.append(row)
                            sys.stderr.write(json.dumps(row) + "\n")
                            ran = True
                            if not row["iepm_kept_pace"]:
                                behind.add(kind)
                            nf_ok = nf_ok and row["nfcapd_records"] == row["sent"]
                        if not ran and nf_ok:
                            row = sustained_step(
                                version, streams[version], rate, args.hold, None, work
                            ) | {"db": None}
                            steps.append(row)
                            sys.stderr.write(json.dumps(row) + "\n")
                            nf_ok = row["nfcapd_records"] == row["sent"]
                        elif not ran:
                            break
                    theirs = best(
                        [s["rate_records_per_s"] for s in steps if s["nfcapd_records"] == s["sent"]]
                    )
                    entry: dict[str, Any] = {
                        "baseline": {"nfcapd_sustained_loss_free_records_per_s": theirs},
                        "baseline_is_lower_bound": theirs == rates[-1],
                    }  # fmt: skip
                    for kind in dbs:
                        mine = [s for s in steps if s["db"] == kind]
                        ours = best([s["rate_records_per_s"] for s in mine if s["iepm_kept_pace"]])
                        stored = max((s["iepm_stored_per_s"] or 0 for s in mine), default=0)
                        entry[kind] = {
                            "figure": {"iepm_sustained_loss_free_records_per_s": ours,
                                       "iepm_best_stored_per_s": stored},
                            "ratio": round(ours / theirs, 3) if theirs else None,
                            "stored_ratio": round(stored / theirs, 3) if theirs else None,
                            "iepm_peak_rss_kb": max([0] + [s["iepm_peak_rss_kb"] for s in mine]),
                        }  # fmt: skip
                    entry["steps"] = steps
                    out[f"v{version}"] = entry
    report["summary"] = summary(report, versions, dbs)
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

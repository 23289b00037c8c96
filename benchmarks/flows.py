"""Flow ingest rate: ``iepm flows collect`` against nfcapd on the same stream, in the same run.

For NetFlow v5, v9 and IPFIX, export packets (30 records each, sequence numbers running, v9/IPFIX
templates re-sent every 20 packets) are replayed on loopback at rising record rates; every
packet goes to both collectors, which get the same socket receive buffer. After each step the
sender waits until both sockets' queues are empty, then stops both: iepm prints its counts
(records decoded, sequence loss) and has written every record to a SQLite archive; nfcapd's file
is counted with ``nfdump -I``. A collector's *loss-free rate* is the highest step at which it got
every record; ``ratio`` is iepm's over nfcapd's (the goal: ≥ 1). iepm's receiver holds a burst
its worker cannot write at once in a spool and writes it afterwards, so the loss-free rate of a
short step can exceed what it sustains: ``kept_pace_records_per_s`` is the highest step at which
it also finished storing within KEPT_PACE_S of the sender's end, and ``iepm_stored_per_s`` the
records stored per second from the first sent to the last stored. iepm's memory is the peak RSS
of its two processes (receiver + worker). Prints one JSON object.

    .venv/bin/python benchmarks/flows.py [--seconds 2] [--rates 5000,10000,...] [--versions 5,9,10]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.flows import encoder as enc  # noqa: E402  (the independent encoder of the tests)

RECORDS_PER_PACKET = 30
TEMPLATE_EVERY = 20
RCVBUF = 4 << 20  # within net.core.rmem_max here, so nfcapd (SO_RCVBUF) gets what iepm gets
TICK_S = 0.002
KEPT_PACE_S = 2.0


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


def storing(proc: subprocess.Popen[str], timeout_s: float) -> None:
    """Wait for ``iepm flows collect`` to say it stores records (its stderr)."""
    deadline = time.monotonic() + timeout_s
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        if not select.select([proc.stderr], [], [], 0.5)[0]:
            continue
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("iepm flows collect exited before storing")
        if line.strip() == "storing records":
            return
    raise TimeoutError(f"iepm storing: not within {timeout_s:g} s")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def packets(version: int, count: int, rng: random.Random) -> list[bytes]:
    now = int(time.time() * 1000)
    out = []
    for k in range(count):
        flows = [
            enc.F(f"198.18.{rng.randrange(256)}.{rng.randrange(256)}", "198.19.0.1",
                  rng.randrange(1024, 65536), 5201, 6, rng.randrange(1, 10**9),
                  rng.randrange(1, 10**6), now - 60_000 + k, now - 1000 + k)
            for _ in range(RECORDS_PER_PACKET)
        ]  # fmt: skip
        if version == 5:
            out.append(enc.v5(flows, seq=k * RECORDS_PER_PACKET, now_ms=now, uptime_ms=3_600_000))
            continue
        fields = enc.V9_FIELDS if version == 9 else enc.IPFIX_FIELDS
        sets = [enc.template_set(version, 256, fields)] if k % TEMPLATE_EVERY == 0 else []
        sets.append(enc.data_set(256, flows, fields, now_ms=now, uptime_ms=3_600_000))
        if version == 9:
            out.append(enc.v9(sets, seq=k, now_ms=now, uptime_ms=3_600_000))
        else:
            out.append(enc.ipfix(sets, seq=k * RECORDS_PER_PACKET, now_ms=now))
    return out


def send(stream: list[bytes], rate_records: float, ports: list[int]) -> float:
    """Send ``stream`` to every port at ``rate_records`` records/s; returns the seconds taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    per_s = rate_records / RECORDS_PER_PACKET
    start = time.monotonic()
    sent = 0
    while sent < len(stream):
        due = min(len(stream), int((time.monotonic() - start) * per_s) + 1)
        while sent < due:
            for port in ports:
                sock.sendto(stream[sent], ("127.0.0.1", port))
            sent += 1
        time.sleep(TICK_S)  # pacing between bursts of due packets, not a wait for a condition
    sock.close()
    return time.monotonic() - start


def nfdump_count(directory: Path) -> int:
    files = sorted(directory.glob("nfcapd.2*"))
    total = 0
    for f in files:
        out = subprocess.run(
            ["nfdump", "-I", "-r", str(f)], capture_output=True, text=True, timeout=60
        ).stdout
        for line in out.splitlines():
            if line.startswith("Flows:"):
                total += int(line.split(":")[1])
    return total


def stop(proc: subprocess.Popen[Any], timeout_s: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def step(stream: list[bytes], rate: float, work: Path) -> dict[str, Any]:
    iepm_port, nf_port = free_port(), free_port()
    nf_dir = work / f"nf-{nf_port}"
    nf_dir.mkdir()
    db = f"sqlite:///{work / f'iepm-{iepm_port}.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    iepm = subprocess.Popen(
        [sys.executable, "-m", "iepm.cli", "flows", "collect", "--listen",
         f"127.0.0.1:{iepm_port}", "--db", db, "--rcvbuf-bytes", str(RCVBUF)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    nfcapd = subprocess.Popen(
        ["nfcapd", "-b", "127.0.0.1", "-p", str(nf_port), "-w", str(nf_dir), "-t", "3600",
         "-B", str(RCVBUF)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    sent_at = time.monotonic()
    try:
        # The step starts once iepm's worker has the archive open (its start-up is not rate).
        storing(iepm, 120)
        wait_until(lambda: udp_queue(nf_port) is not None, 120, "nfcapd listening")
        took = send(stream, rate, [iepm_port, nf_port])
        sent_at = time.monotonic()
        wait_until(lambda: udp_queue(iepm_port) == 0 and udp_queue(nf_port) == 0, 60, "drained")
    finally:
        stop(nfcapd)
        nf_done_s = time.monotonic() - sent_at
        stop(iepm, 600)
        # iepm's worker may still be writing a backlog held in its spool: the step ends for
        # iepm when every record is in the archive and the process has exited.
        iepm_done_s = time.monotonic() - sent_at
    report = json.loads(iepm.stdout.read().strip().splitlines()[-1]) if iepm.stdout else {}
    sent = len(stream) * RECORDS_PER_PACKET
    return {
        "rate_records_per_s": rate,
        "achieved_records_per_s": round(sent / took),
        "sent": sent,
        "iepm_records": report["decode"]["records"],
        "iepm_stored": report["stored"],
        "iepm_lost_by_sequence": report["decode"]["lost"],
        "iepm_spool_dropped_datagrams": report["spool_dropped"],
        "iepm_spool_peak_mb": round(report["spool_peak_bytes"] / 2**20, 1),
        "iepm_peak_rss_kb": report["receiver_peak_rss_kb"] + report["worker_peak_rss_kb"],
        # Records stored per second from the first sent to the last stored: what iepm sustains.
        "iepm_stored_per_s": round(report["stored"] / (took + iepm_done_s)),
        "iepm_done_after_send_s": round(iepm_done_s, 2),
        "nfcapd_done_after_send_s": round(nf_done_s, 2),
        "nfcapd_records": nfdump_count(nf_dir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per step")
    parser.add_argument("--rates", default="5000,10000,20000,40000,80000,160000,320000")
    parser.add_argument("--versions", default="5,9,10")
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    if shutil.which("nfcapd") is None or shutil.which("nfdump") is None:
        print(json.dumps({"benchmark": "flows", "skipped": "nfcapd/nfdump not installed"}))
        return
    rng = random.Random(args.seed)
    rates = [float(r) for r in args.rates.split(",")]
    report: dict[str, Any] = {"benchmark": "flows", "seconds_per_step": args.seconds}
    with tempfile.TemporaryDirectory(prefix="iepm-bench-flows-") as tmp:
        work = Path(tmp)
        for version in (int(v) for v in args.versions.split(",")):
            steps = []
            for rate in rates:
                count = max(1, int(rate * args.seconds / RECORDS_PER_PACKET))
                row = step(packets(version, count, rng), rate, work)
                steps.append(row)
                sys.stderr.write(json.dumps({"version": version, **row}) + "\n")
                if row["iepm_records"] < row["sent"] and row["nfcapd_records"] < row["sent"]:
                    break  # both lose: higher rates tell nothing more
            ours = [s["rate_records_per_s"] for s in steps if s["iepm_stored"] == s["sent"]]
            theirs = [s["rate_records_per_s"] for s in steps if s["nfcapd_records"] == s["sent"]]
            # Kept pace: every record stored and the archive no more than KEPT_PACE_S behind
            # the sender at the end (not a burst absorbed by the spool and written later).
            paced = [
                s["rate_records_per_s"]
                for s in steps
                if s["iepm_stored"] == s["sent"] and s["iepm_done_after_send_s"] <= KEPT_PACE_S
            ]
            figure, baseline = (max(ours) if ours else 0.0), (max(theirs) if theirs else 0.0)
            sustained = max(paced) if paced else 0.0
            report[f"v{version}"] = {
                "figure": {"loss_free_records_per_s": figure},
                "baseline": {"nfcapd_loss_free_records_per_s": baseline},
                "ratio": round(figure / baseline, 3) if baseline else None,
                "baseline_is_lower_bound": bool(theirs) and theirs[-1] == rates[-1],
                "kept_pace_records_per_s": sustained,
                "kept_pace_ratio": round(sustained / baseline, 3) if baseline else None,
                "iepm_best_stored_per_s": max(s["iepm_stored_per_s"] for s in steps),
                "iepm_peak_rss_kb": max(s["iepm_peak_rss_kb"] for s in steps),
                "steps": steps,
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

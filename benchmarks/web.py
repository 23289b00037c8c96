"""Latency of `iepm serve` under 20 concurrent clients, on a synthetic archive seeded from real
NDT series; the baseline is `/api/v1/health` (same server, same stack, no archive access).

Synthetic model (documented, deterministic with --seed): each target is assigned one real
M-Lab NDT client×server pair from ``../shared/data/ndt/`` (download throughput in Mbit/s and
mean RTT in ms, irregular samples over months). The pair's series are stretched over the
synthetic span, so a synthetic result at relative time u ∈ [0, 1) takes the real value at the
same relative position u — keeping the real level shifts, outliers and day-to-day spread — then
multiplied by lognormal noise with σ = 0.05 (so repeated stretches of one real sample differ).
One result per target every 90 minutes, alternating ping (rtt_avg_ms from the series;
min/max around it; loss from a 2 % chance of one lost packet in ten) and iperf3
(throughput_bps from the series); 1 % of the runs fail (timeout or server busy). ``--full`` is
the issue's case: 100 targets × 2 years ≈ 1.17 M results.

Measured, each for --requests requests spread over 20 concurrent clients (httpx async, one
connection each): the overview page, a target page (random target), and /api/v1/results
(random target, probe=ping, 28-day window, 100 results, random offset). The server runs in
its own process, started as a user starts it: `iepm serve --workers N` (default 1). The app
computes each page's figures once per minute (concurrent requests wait for that one
computation), so a target's first request is the expensive one; the overview's first (cold)
request is reported separately. Prints one JSON object.

    .venv/bin/python benchmarks/web.py [--targets 20 --days 60 | --full] [--requests 400]
        [--workers N] [--db sqlite:///PATH (reuse an archive built by an earlier --keep run)]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.results import Outcome, Result, format_time, new_result_id
from iepm.store import Archive

NDT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ndt"
STEP = timedelta(minutes=90)
CLIENTS = 20
NOISE_SIGMA = 0.05
# The synthetic archive ends at the start of the current hour: pages show "now", as people
# open them (an archive reused with --db a day later shows a day less of its window).
END = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)


def read_ndt(path: Path) -> list[float]:
    values = []
    for line in path.read_text(encoding="utf-8").splitlines():
        _stamp, _, value = line.partition(",")
        try:
            number = float(value)
        except ValueError:
            continue
        if math.isfinite(number) and number > 0:
            values.append(number)
    return values


def ndt_pairs() -> list[tuple[str, list[float], list[float]]]:
    """(name, throughput Mbit/s, RTT ms) for every download pair with both series."""
    pairs = []
    for thr in sorted(NDT.glob("*_d_throughput.txt")):
        rtt = thr.with_name(thr.name.replace("_throughput", "_rttmean"))
        if rtt.exists():
            t, r = read_ndt(thr), read_ndt(rtt)
            if len(t) > 50 and len(r) > 50:
                pairs.append((thr.name.removesuffix("_d_throughput.txt"), t, r))
    if not pairs:
        raise SystemExit(f"no NDT series found in {NDT}")
    return pairs


def synthetic(targets: int, days: int, seed: int) -> Iterator[Result]:
    rng = random.Random(seed)
    pairs = ndt_pairs()
    slots = int(timedelta(days=days) / STEP)
    start = END - slots * STEP
    assigned = [pairs[i % len(pairs)] for i in range(targets)]
    for slot in range(slots):
        when = start + slot * STEP
        u = slot / slots
        for index, (source, thr, rtt) in enumerate(assigned):
            target = f"site-{index:03d}"
            noise = math.exp(rng.gauss(0.0, NOISE_SIGMA))
            common: dict[str, Any] = {
                "monitor": "bench-mon",
                "target": target,
                "target_address": f"198.18.{index // 250}.{index % 250 + 1}",
                "started_at": when + timedelta(seconds=index * 7),
                "raw_token": new_result_id(),
                "tool_version": f"synthetic from ndt {source}",
            }
            failed = rng.random() < 0.01
            if (slot + index) % 2 == 0:
                avg = rtt[int(u * len(rtt))] * noise
                lost = 1 if rng.random() < 0.02 else 0
                data = {
                    "packets_sent": 10,
                    "packets_received": 10 - lost,
                    "loss_percent": 10.0 * lost,
                    "rtt_min_ms": round(avg * 0.97, 3),
                    "rtt_avg_ms": round(avg, 3),
                    "rtt_max_ms": round(avg * 1.08, 3),
                    "rtt_mdev_ms": round(avg * 0.02, 3),
                }
                yield Result(
                    probe="ping",
                    tool="ping",
                    duration_s=9.0,
                    params={"count": 10, "interval_s": 1.0},
                    data={} if failed else data,
                    outcome=Outcome.TIMEOUT if failed else Outcome.OK,
                    succeeded=not failed,
                    error="ping did not finish within 15 s" if failed else None,
                    diags="ping -n -c 10",
                    **common,
                )
            else:
                throughput = thr[int(u * len(thr))] * 1e6 * noise
                data = {
                    "throughput_bps": throughput,
                    "sender_throughput_bps": throughput * 1.01,
                    "retransmits": rng.randint(0, 50),
                    "stream_count": 1,
                    "window_bytes": 4194304,
                    "mean_rtt_ms": round(rtt[int(u * len(rtt))], 3),
                }
                yield Result(
                    probe="iperf3",
                    tool="iperf3",
                    duration_s=10.0,
                    params={"streams": 1, "window": "4M"},
                    data={} if failed else data,
                    outcome=Outcome.FAILED if failed else Outcome.OK,
                    succeeded=not failed,
                    error="iperf3: the server is busy running a test" if failed else None,
                    diags="iperf3 -c -J",
                    **common,
                )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


SERVER = """
import sys, typer
from iepm.web.cli import register
app = typer.Typer()
app.callback()(lambda: None)
register(app)
app(sys.argv[1:])
"""


def start_server(url: str, port: int, workers: int) -> subprocess.Popen[bytes]:
    """`iepm serve` exactly as a user runs it, in its own process group."""
    root = Path(__file__).resolve().parents[1]
    argv = ["serve", "--db", url, "--listen", f"127.0.0.1:{port}", "--workers", str(workers)]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, *argv], cwd=root, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start within 60 s")


async def load(base: str, paths: list[str]) -> list[float]:
    """Run ``paths`` over CLIENTS concurrent clients; latencies in seconds, all must be 200."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for path in paths:
        queue.put_nowait(path)
    latencies: list[float] = []

    async def client() -> None:
        limits = httpx.Limits(max_connections=1)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
            while not queue.empty():
                path = queue.get_nowait()
                t0 = time.perf_counter()
                response = await http.get(path)
                latencies.append(time.perf_counter() - t0)
                if response.status_code != 200:
                    raise SystemExit(f"{path}: {response.status_code} {response.text[:200]}")

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def figures(latencies: list[float], baseline: dict[str, float]) -> dict[str, Any]:
    p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
    return {
        "requests": len(latencies),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "ratio_p50": round(p50 / baseline["p50_ms"], 1),
        "ratio_p99": round(p99 / baseline["p99_ms"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--days", type=int, default=60)
    parser.add_argument("--full", action="store_true", help="100 targets × 730 days")
    parser.add_argument("--requests", type=int, default=400, help="per endpoint")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="iepm serve --workers")
    parser.add_argument("--db", help="use this archive (built by an earlier --keep run)")
    parser.add_argument("--keep", action="store_true", help="keep the generated archive")
    args = parser.parse_args()
    if args.full:
        args.targets, args.days = 100, 730
    tmp = None if args.db else tempfile.mkdtemp(prefix="iepm-bench-web-")
    url = args.db or f"sqlite:///{Path(str(tmp)) / 'archive.db'}"
    build_s = None
    if args.db is None:
        t0 = time.perf_counter()
        with Archive.open(url) as archive:
            batch: list[Result] = []
            for result in synthetic(args.targets, args.days, args.seed):
                batch.append(result)
                if len(batch) == 50_000:
                    archive.add_many(batch)
                    batch = []
            archive.add_many(batch)
        build_s = time.perf_counter() - t0
    with Archive.open(url) as archive:
        total = archive.count()
        targets = archive.targets()
        first = next(archive.results(limit=1), None)
        last = next(archive.results(limit=1, order="desc"), None)
    span_days = round((last.started_at - first.started_at).days) + 1 if first and last else 0
    rng = random.Random(args.seed)
    port = free_port()
    server = start_server(url, port, args.workers)
    base = f"http://127.0.0.1:{port}"
    n = args.requests
    # The API window: the archive's last 28 days, whenever it was built.
    end = last.started_at + timedelta(seconds=1) if last else END
    since = format_time(end - timedelta(days=28))
    try:
        t0 = time.perf_counter()
        cold = httpx.get(f"{base}/", timeout=120)
        overview_cold_ms = (time.perf_counter() - t0) * 1000
        assert cold.status_code == 200, cold.text[:300]
        # Warm-up (connections, first imports and queries), not counted.
        asyncio.run(load(base, ["/api/v1/health"] * 2 * CLIENTS))
        health = asyncio.run(load(base, ["/api/v1/health"] * n))
        baseline = {
            "p50_ms": percentile(health, 50) * 1000,
            "p99_ms": percentile(health, 99) * 1000,
        }
        overview = asyncio.run(load(base, ["/"] * n))
        target_page = asyncio.run(load(base, [f"/targets/{rng.choice(targets)}" for _ in range(n)]))
        api = asyncio.run(
            load(
                base,
                [
                    f"/api/v1/results?target={rng.choice(targets)}&probe=ping&since={since}"
                    f"&limit=100&offset={rng.randrange(0, 100)}"
                    for _ in range(n)
                ],
            )
        )
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers, by our child's PID
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)
    out = {
        "benchmark": "web",
        "backend": url.split(":", 1)[0],
        "results": total,
        "targets": len(targets),
        "days": span_days,
        "clients": CLIENTS,
        "workers": args.workers,
        "archive_build_s": None if build_s is None else round(build_s, 1),
        "baseline": {"endpoint": "/api/v1/health", **{k: round(v, 2) for k, v in baseline.items()}},
        "overview_cold_ms": round(overview_cold_ms, 1),
        "overview": figures(overview, baseline),
        "target_page": figures(target_page, baseline),
        "api_results": figures(api, baseline),
    }
    if args.keep or tmp is None:
        out["archive"] = url
    else:
        for path in Path(tmp).glob("*"):
            path.unlink()
        Path(tmp).rmdir()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

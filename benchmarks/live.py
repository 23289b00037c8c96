"""How fast a published sample reaches browsers following ``/live/events``, and what many of
them cost the server, on SQLite and on PostgreSQL.

``iepm serve`` runs in its own process (as a user starts it). A publisher in this process
publishes one ping sample every ``--interval-s`` through ``iepm.store.live.publish`` (value =
its publish time); ``--streams`` clients (one asyncio loop, httpx) follow the stream, and each
sample's delivery latency is its arrival time minus its publish time (same host clock).
Baseline: the same with one client, same server, same run. Also the server's CPU seconds per
second of each phase (from /proc), which shows the cost of fan-out: every stream reads the
watcher's ring, not the archive. PostgreSQL is a private throwaway cluster (testkit/pg.py).
Prints one JSON object.

    .venv/bin/python benchmarks/live.py [--streams 50] [--seconds 10] [--interval-s 0.1]
        [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.store import Archive, live
from iepm.store.live import LiveSample
from testkit.net import free_port

START_TIMEOUT_S = 90.0
TICKS_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S  # utime + stime


@contextlib.contextmanager
def server(url: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "iepm.cli", "serve", "--db", url, "--listen", f"127.0.0.1:{port}"],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("iepm serve did not start")
            time.sleep(0.2)
        yield base, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(5)


async def follow(
    client: httpx.AsyncClient,
    base: str,
    latencies: list[float],
    ready: asyncio.Event,
    stop: list[float],
) -> None:
    async with client.stream("GET", f"{base}/live/events?probe=bench") as response:
        ready.set()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"samples"' in line:
                now_s = time.time()
                for row in json.loads(line[6:])["samples"]:
                    latencies.append(now_s - row[5])
            if time.monotonic() > stop[0]:
                return


def phase(url: str, base: str, pid: int, streams: int, seconds: float, every_s: float) -> Any:
    latencies: list[float] = []
    published = 0
    archive = Archive.open(url)

    stop = [float("inf")]  # set when publishing ends: the last samples still arrive

    async def clients() -> None:
        # One client for all streams: a client each would build 50 TLS contexts (seconds of
        # CPU on a busy host) before the first stream opened.
        limits = httpx.Limits(max_connections=streams + 5)
        timeout = httpx.Timeout(5.0, read=30.0)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            readies = [asyncio.Event() for _ in range(streams)]
            tasks = [asyncio.create_task(follow(client, base, latencies, r, stop)) for r in readies]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
            started.set()
            while stop[0] == float("inf"):
                await asyncio.sleep(0.1)
            await asyncio.wait(tasks, timeout=max(0.0, stop[0] - time.monotonic()) + 1)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    started = threading.Event()
    loop_thread = threading.Thread(target=lambda: asyncio.run(clients()))
    loop_thread.start()
    started.wait(60)
    time.sleep(1.0)  # every stream past its first events
    cpu0, wall0 = cpu_s(pid), time.monotonic()
    while time.monotonic() - wall0 < seconds:
        now_s = time.time()
        live.publish(archive, "bench", [LiveSample("t", "bench", "rtt_ms", now_s, now_s)])
        published += 1
        time.sleep(every_s)
    cpu_per_s = (cpu_s(pid) - cpu0) / (time.monotonic() - wall0)
    # Each client returns at its first event after this (a published sample or a keep-alive).
    stop[0] = time.monotonic() + 3
    loop_thread.join(seconds + 30)
    archive.close()
    ms = sorted(x * 1000 for x in latencies)
    return {
        "streams": streams,
        "published": published,
        "delivered": len(ms),
        "expected": published * streams,
        "latency_p50_ms": round(statistics.median(ms), 1) if ms else None,
        "latency_p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 1) if ms else None,
        "server_cpu_s_per_s": round(cpu_per_s, 3),
    }


def run(url: str, streams: int, seconds: float, every_s: float) -> dict[str, Any]:
    Archive.open(url).close()  # create it before the server opens it read-only
    with server(url) as (base, pid):
        baseline = phase(url, base, pid, 1, seconds, every_s)
        many = phase(url, base, pid, streams, seconds, every_s)
    return {
        "figure": f"delivery latency p50 with {streams} streams (ms)",
        "value": many["latency_p50_ms"],
        "baseline": baseline["latency_p50_ms"],
        "ratio": round(many["latency_p50_ms"] / baseline["latency_p50_ms"], 2),
        "cpu_ratio": round(
            many["server_cpu_s_per_s"] / max(baseline["server_cpu_s_per_s"], 1e-3), 2
        ),
        "one_stream": baseline,
        "many_streams": many,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--interval-s", type=float, default=0.1)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    out: dict[str, Any] = {"streams": args.streams, "seconds": args.seconds,
                           "interval_s": args.interval_s, "backends": {}}  # fmt: skip
    for backend in args.backends.split(","):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="iepm-bench-live-") as tmp:
                url = f"sqlite:///{Path(tmp) / 'archive.db'}"
                out["backends"]["sqlite"] = run(url, args.streams, args.seconds, args.interval_s)
        elif backend == "postgresql":
            from testkit.pg import find_bindir, running_server

            bindir = find_bindir()
            if bindir is None:
                out["backends"]["postgresql"] = {"skipped": "no PostgreSQL server binaries"}
                continue
            with running_server(bindir) as pg:
                url = pg.create_database("iepm_bench_live")
                out["backends"]["postgresql"] = run(
                    url, args.streams, args.seconds, args.interval_s
                )
        print(json.dumps({backend: out["backends"][backend]}), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

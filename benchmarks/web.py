"""Latency of `iepm serve` under 20 concurrent clients, on a synthetic archive seeded from real
NDT series, on SQLite and on PostgreSQL; the baseline is `/api/v1/health` (same server, same
stack, same moment, no archive access).

Synthetic model (documented, deterministic with --seed): each target is assigned one real
M-Lab NDT client×server pair from ``../shared/data/ndt/`` (download throughput in Mbit/s and
mean RTT in ms, irregular samples over months). The pair's series are stretched over the
synthetic span, so a synthetic result at relative time u ∈ [0, 1) takes the real value at the
same relative position u — keeping the real level shifts, outliers and day-to-day spread — then
multiplied by lognormal noise with σ = 0.05 (so repeated stretches of one real sample differ).
One result per target every 90 minutes, alternating ping (rtt_avg_ms from the series;
min/max around it; loss from a 2 % chance of one lost packet in ten) and iperf3
(throughput_bps from the series); 1 % of the runs fail (timeout or server busy). The default is
the issue's case: 100 targets × 2 years ≈ 1.17 M results (``--targets``/``--years`` scale it).
Rows are written straight into the ``results`` table in the envelope's stored form (the same
columns ``Archive.add_many`` writes; one envelope is checked against ``Result`` first), because
building a million pydantic envelopes would take longer than the measurement.

Measured with wrk (Debian's C load generator: one thread, 20 connections, each sending its
next request as soon as the last is answered) for --seconds per endpoint: the overview page, a
target page (random targets, so both computed and cached pages), every target's first visit
(each page computed for that very request: the worst case), and /api/v1/results (random
target, probe=ping, 28-day window, 100 results, random offset). The server runs in its own
process, started as a user starts it: `iepm serve --workers N` (default 2, one per core).
Pages' figures are computed once per 30 s per worker (concurrent requests wait for that one
computation, later ones get the last copy while it is refreshed); the overview's first (cold)
request is reported separately. Each endpoint starts after 5 s of idle server.
PostgreSQL is a private throwaway cluster (testkit/pg.py: initdb
in a temporary directory, removed afterwards). Prints one JSON object.

    .venv/bin/python benchmarks/web.py [--targets 100] [--years 2] [--seconds 10]
        [--backends sqlite,postgresql] [--workers 2] [--db URL (an existing archive)]
        [--clients 20]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
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
from sqlalchemy import insert

from iepm.results import Result, format_time, new_result_id
from iepm.store import Archive, rollup
from iepm.store.schema import results as RESULTS
from testkit.net import free_port

NDT = Path(__file__).resolve().parents[2] / "shared" / "data" / "ndt"
STEP = timedelta(minutes=90)
CLIENTS = 20
SETTLE_S = 5.0  # idle time before each measured endpoint
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


def synthetic(targets: int, days: int, seed: int) -> Iterator[dict[str, Any]]:
    """Rows of the ``results`` table (the envelope's stored form), oldest first."""
    rng = random.Random(seed)
    pairs = ndt_pairs()
    slots = int(timedelta(days=days) / STEP)
    start = END - slots * STEP
    assigned = [pairs[i % len(pairs)] for i in range(targets)]
    for slot in range(slots):
        when = start + slot * STEP
        u = slot / slots
        for index, (source, thr, rtt) in enumerate(assigned):
            noise = math.exp(rng.gauss(0.0, NOISE_SIGMA))
            failed = rng.random() < 0.01
            row: dict[str, Any] = {
                "id": new_result_id(),
                "schema": 1,
                "monitor": "bench-mon",
                "target": f"site-{index:03d}",
                "target_address": f"198.18.{index // 250}.{index % 250 + 1}",
                "started_at": when + timedelta(seconds=index * 7),
                "raw_token": new_result_id(),
                "tool_version": f"synthetic from ndt {source}",
                "succeeded": not failed,
            }
            if (slot + index) % 2 == 0:
                avg = rtt[int(u * len(rtt))] * noise
                lost = 1 if rng.random() < 0.02 else 0
                row.update(
                    probe="ping",
                    tool="ping",
                    duration_s=9.0,
                    params={"count": 10, "interval_s": 1.0},
                    outcome="timeout" if failed else "ok",
                    error="ping did not finish within 15 s" if failed else None,
                    diags="ping -n -c 10",
                    data={}
                    if failed
                    else {
                        "packets_sent": 10,
                        "packets_received": 10 - lost,
                        "loss_percent": 10.0 * lost,
                        "rtt_min_ms": round(avg * 0.97, 3),
                        "rtt_avg_ms": round(avg, 3),
                        "rtt_max_ms": round(avg * 1.08, 3),
                        "rtt_mdev_ms": round(avg * 0.02, 3),
                    },
                )
            else:
                throughput = thr[int(u * len(thr))] * 1e6 * noise
                row.update(
                    probe="iperf3",
                    tool="iperf3",
                    duration_s=10.0,
                    params={"streams": 1, "window": "4M"},
                    outcome="failed" if failed else "ok",
                    error="iperf3: the server is busy running a test" if failed else None,
                    diags="iperf3 -c -J",
                    data={}
                    if failed
                    else {
                        "throughput_bps": throughput,
                        "sender_throughput_bps": throughput * 1.01,
                        "retransmits": rng.randint(0, 50),
                        "stream_count": 1,
                        "window_bytes": 4194304,
                        "mean_rtt_ms": round(rtt[int(u * len(rtt))], 3),
                    },
                )
            yield row


def build(url: str, targets: int, days: int, seed: int) -> float:
    """Fill the archive at ``url``; returns the seconds it took."""
    rows = synthetic(targets, days, seed)
    first = next(rows)
    # The rows must be what the archive would store for a real envelope.
    stored = Result.model_validate(first).envelope()
    stored["started_at"] = first["started_at"]
    if stored != first:
        raise SystemExit(f"synthetic row differs from its envelope: {first} vs {stored}")
    t0 = time.perf_counter()
    with Archive.open(url) as archive, archive.writing("building the benchmark archive") as conn:
        conn.execute(insert(RESULTS), [first])
        while batch := list(itertools.islice(rows, 20_000)):
            conn.execute(insert(RESULTS), batch)
        # Written around Archive.add_many (for speed), so the daily summaries are built here.
        rollup.rebuild(conn)
    return time.perf_counter() - t0


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


WRK_SCRIPT = r"""
-- Requests the paths listed in $IEPM_WRK_PATHS in order, round robin; stops after
-- $IEPM_WRK_LIMIT responses when that is > 0; prints one JSON line with the figures.
local paths = {}
for line in io.lines(os.getenv("IEPM_WRK_PATHS")) do paths[#paths + 1] = line end
local limit = tonumber(os.getenv("IEPM_WRK_LIMIT") or "0")
local i, answered, bad = 0, 0, 0
request = function()
  i = i % #paths + 1
  return wrk.format("GET", paths[i])
end
response = function(status, headers, body)
  answered = answered + 1
  if status ~= 200 then bad = bad + 1 end
  if limit > 0 and answered >= limit then wrk.thread:stop() end
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "socket_errors": %d, "non_2xx": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d, "mean_us": %.1f, "duration_us": %d}\n',
    summary.requests, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean, summary.duration))
end
"""


def load(base: str, paths: list[str], seconds: float, limit: int = 0) -> dict[str, Any]:
    """``wrk`` with CLIENTS connections on one thread, requesting ``paths`` round robin for
    ``seconds`` (or until ``limit`` responses); its figures. wrk is C with an event loop: it
    costs the two cores a fraction of what a Python client would, so the figures measure the
    server rather than the load generator."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: scripts/install-system-deps.sh installs it (Debian wrk)")
    with tempfile.TemporaryDirectory(prefix="iepm-wrk-") as tmp:
        listing, script = Path(tmp, "paths"), Path(tmp, "load.lua")
        listing.write_text("\n".join(paths) + "\n", encoding="utf-8")
        script.write_text(WRK_SCRIPT, encoding="utf-8")
        env = {**os.environ, "IEPM_WRK_PATHS": str(listing), "IEPM_WRK_LIMIT": str(limit)}
        argv = ["wrk", "-t1", f"-c{CLIENTS}", f"-d{seconds:g}s", "--timeout", "30s"]
        proc = subprocess.run(
            [*argv, "-s", str(script), base],
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
            start_new_session=True,
        )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"wrk failed ({proc.returncode}): {proc.stderr.strip()[:300]}")
    out: dict[str, Any] = json.loads(lines[-1])
    if out["socket_errors"] or out["non_2xx"]:
        raise SystemExit(
            f"{paths[0]}…: {out['socket_errors']} socket errors, {out['non_2xx']} non-2xx answers"
        )
    return out


def figures(run: dict[str, Any], baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    p50, p99 = run["p50_us"] / 1000, run["p99_us"] / 1000
    out: dict[str, Any] = {
        "requests": run["requests"],
        "per_second": round(run["requests"] / (run["duration_us"] / 1e6), 1),
        "p50_ms": round(p50, 2),
        "p90_ms": round(run["p90_us"] / 1000, 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(run["max_us"] / 1000, 2),
    }
    if baseline is not None:
        out["ratio_p50"] = round(p50 / (baseline["p50_us"] / 1000), 1)
        out["ratio_p99"] = round(p99 / (baseline["p99_us"] / 1000), 1)
    return out


def measure(url: str, seconds: float, workers: int, seed: int) -> dict[str, Any]:
    """Serve the archive at ``url`` and load it; the figures of one backend."""
    with Archive.open(url) as archive:
        total = archive.count()
        targets = archive.targets()
        first = next(archive.results(limit=1), None)
        last = next(archive.results(limit=1, order="desc"), None)
    if not targets or first is None or last is None:
        raise SystemExit(f"the archive {url} has no results")
    rng = random.Random(seed)
    port = free_port()
    server = start_server(url, port, workers)
    base = f"http://127.0.0.1:{port}"
    # The API window: the archive's last 28 days, whenever it was built.
    since = format_time(last.started_at + timedelta(seconds=1) - timedelta(days=28))
    random_targets = [f"/targets/{rng.choice(targets)}" for _ in range(10_000)]
    api_paths = [
        f"/api/v1/results?target={rng.choice(targets)}&probe=ping&since={since}"
        f"&limit=100&offset={rng.randrange(0, 100)}"
        for _ in range(10_000)
    ]
    try:
        t0 = time.perf_counter()
        cold = httpx.get(f"{base}/", timeout=120)
        overview_cold_ms = (time.perf_counter() - t0) * 1000
        if cold.status_code != 200:
            raise SystemExit(f"/: {cold.status_code} {cold.text[:300]}")
        # Warm-up (connections, first imports and queries in every worker), not counted.
        load(base, ["/api/v1/health", "/"], 2)

        def measured(paths: list[str], limit: int = 0) -> dict[str, Any]:
            # Each endpoint starts on an idle server: requests still being computed for the
            # previous one (cold pages finish seconds after wrk stops) would be charged to it.
            time.sleep(SETTLE_S)
            return load(base, paths, seconds, limit)

        health = measured(["/api/v1/health"])
        # Every target's first visit (nothing cached: the page is computed for that request),
        # under the same 20 clients.
        first_visits = [f"/targets/{t}" for t in rng.sample(targets, len(targets))]
        cold_targets = measured(first_visits, limit=len(first_visits))
        overview = measured(["/"])
        target_page = measured(random_targets)
        api = measured(api_paths)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers, by our child's PID
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)
    return {
        "results": total,
        "targets": len(targets),
        "days": (last.started_at - first.started_at).days + 1,
        "baseline": {"endpoint": "/api/v1/health", **figures(health)},
        "overview_cold_ms": round(overview_cold_ms, 1),
        "overview": figures(overview, health),
        "target_page": figures(target_page, health),
        "target_page_first_visits": figures(cold_targets, health),
        "api_results": figures(api, health),
    }


@contextlib.contextmanager
def archive_url(backend: str) -> Iterator[str]:
    """A fresh, empty archive on ``backend``, removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="iepm-bench-web-") as tmp:
            yield f"sqlite:///{Path(tmp) / 'archive.db'}"
        return
    from testkit.pg import find_bindir, running_server

    bindir = find_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL server binaries not found (scripts/install-system-deps.sh)")
    with running_server(bindir) as server:
        yield server.create_database("iepm_bench_web")


def set_clients(n: int) -> None:
    global CLIENTS  # load() and the report read it
    CLIENTS = n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=100)
    parser.add_argument("--years", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="of load per endpoint")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2, help="iepm serve --workers")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--db", help="measure this existing archive instead of building one")
    parser.add_argument(
        "--clients", type=int, default=CLIENTS, help="concurrent connections (1: cost per request)"
    )
    args = parser.parse_args()
    if args.clients < 1:
        raise SystemExit("--clients must be at least 1")
    set_clients(args.clients)
    days = max(1, round(args.years * 365))
    out: dict[str, Any] = {
        "benchmark": "web",
        "clients": CLIENTS,
        "workers": args.workers,
        "seconds_per_endpoint": args.seconds,
        "aim_p99_ms": 300,
        "backends": {},
    }
    if args.db:
        out["backends"][args.db.split(":", 1)[0]] = measure(
            args.db, args.seconds, args.workers, args.seed
        )
    else:
        out.update(targets=args.targets, years=args.years)
        for backend in args.backends.split(","):
            if backend not in ("sqlite", "postgresql"):
                raise SystemExit(f"--backends: unknown backend {backend!r}")
            with archive_url(backend) as url:
                build_s = build(url, args.targets, days, args.seed)
                figures_ = measure(url, args.seconds, args.workers, args.seed)
                out["backends"][backend] = {"archive_build_s": round(build_s, 1), **figures_}
            print(json.dumps({backend: out["backends"][backend]}), file=sys.stderr)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

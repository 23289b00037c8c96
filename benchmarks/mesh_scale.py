"""A mesh's archive at scale on PostgreSQL: a 50-host two-way mesh over 90 days (≈10 million
results), the grid page, a pair page and `/api/v1/results` under 20 concurrent clients, and the
write rate with 50 monitors writing at once against one monitor writing alone, in the same run.

Synthetic model (deterministic with --seed): hosts h00…h49 on a plane; a pair's RTT is 2 ms plus
its distance (up to ~150 ms), its throughput a per-pair level (lognormal around 500 Mbit/s,
lower for longer paths) times lognormal noise σ 0.1; every directed pair runs ping, traceroute
and iperf3 once per 90-minute cycle (3 × 50 × 49 × 16 per day); 1 % of runs fail. Rows are
copied straight into ``results`` with PostgreSQL's COPY in the envelope's stored form (one row
is checked against ``Result`` first), then the daily summaries are built by the archive's own
``rollup.rebuild``, as a migration would.

Latencies are measured with wrk (benchmarks/web.py: one thread, --clients connections) against
`iepm serve --workers 2`, each endpoint after 5 s idle, against `/api/v1/health` as baseline:
the grid (`/mesh`, throughput, 7 days), pair pages (random pairs), and `/api/v1/results`
(random monitor and target, probe ping, 28-day window, 100 results). Writes: N processes, each
an `Archive` writing one result per transaction (as `iepm run` does) for --write-seconds after a
common start; the baseline is one such process alone, in the same run.

    .venv/bin/python benchmarks/mesh_scale.py [--hosts 50] [--days 90] [--seconds 10]
        [--writers 50] [--write-seconds 10 (0: pages only)] [--db URL (an existing archive)]
        [--db URL --build (build into that empty archive, then measure: re-measure with --db)]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import web as webbench  # benchmarks/web.py: wrk load, server start, private PostgreSQL

from iepm.results import Result, format_time, new_result_id
from iepm.store import Archive, partitions, rollup

STEP = timedelta(minutes=90)
END = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
COLUMNS = (
    "id", "schema", "probe", "tool", "tool_version", "monitor", "target", "target_address",
    "started_at", "duration_s", "outcome", "succeeded", "error", "diags", "raw_token", "purpose",
    "params", "data",
)  # fmt: skip


def hosts(n: int) -> list[str]:
    return [f"h{i:02d}" for i in range(n)]


def pair_model(n: int, seed: int) -> dict[tuple[int, int], tuple[float, float]]:
    """(rtt_ms, throughput level bit/s) per directed pair."""
    rng = random.Random(seed)
    where = [(rng.uniform(0, 100), rng.uniform(0, 100)) for _ in range(n)]
    model = {}
    for i in range(n):
        for j in range(n):
            if i != j:
                rtt = 2.0 + math.dist(where[i], where[j])
                level = 500e6 * math.exp(rng.gauss(0, 0.4)) * 30 / (30 + rtt)
                model[(i, j)] = (rtt, level)
    return model


def rows(n: int, days: int, seed: int):  # type: ignore[no-untyped-def]
    """Rows of ``results`` in COPY order, oldest cycle first."""
    rng = random.Random(seed)
    model = pair_model(n, seed)
    names = hosts(n)
    slots = int(timedelta(days=days) / STEP)
    start = END - slots * STEP
    for slot in range(slots):
        when = start + slot * STEP
        for (i, j), (rtt, level) in model.items():
            src, dst = names[i], names[j]
            address = f"198.18.{j // 250}.{j % 250 + 1}"
            for k, probe in enumerate(("ping", "traceroute", "iperf3")):
                failed = rng.random() < 0.01
                moment = when + timedelta(seconds=(j * 3 + k) * 20)
                if probe == "ping":
                    avg = rtt * math.exp(rng.gauss(0, 0.05))
                    data: dict[str, Any] = {
                        "packets_sent": 10, "packets_received": 10, "loss_percent": 0.0,
                        "rtt_min_ms": round(avg * 0.97, 3), "rtt_avg_ms": round(avg, 3),
                        "rtt_max_ms": round(avg * 1.1, 3), "rtt_mdev_ms": round(avg * 0.02, 3),
                    }  # fmt: skip
                    params: dict[str, Any] = {"count": 10, "interval_s": 1.0}
                    tool, duration = "ping", 9.0
                elif probe == "traceroute":
                    hops = 4 + int(rtt // 20)
                    data = {"reached": True, "hop_count": hops, "silent_hops": 0,
                            "destination_address": address, "max_hops": 30, "hops": []}  # fmt: skip
                    params = {"max_hops": 30, "queries": 1, "method": "udp"}
                    tool, duration = "traceroute", 2.0
                else:
                    thr = level * math.exp(rng.gauss(0, 0.1))
                    data = {"throughput_bps": thr, "sender_throughput_bps": thr * 1.01,
                            "retransmits": rng.randint(0, 50), "stream_count": 4,
                            "mean_rtt_ms": round(rtt, 3)}  # fmt: skip
                    params = {"streams": 4, "window": "8M"}
                    tool, duration = "iperf3", 10.0
                yield (
                    new_result_id(), 1, probe, tool, "synthetic", src, dst, address, moment,
                    duration, "failed" if failed else "ok", not failed,
                    f"{tool} failed (synthetic)" if failed else None, "", new_result_id(),
                    "routine", json.dumps(params), json.dumps({} if failed else data),
                )  # fmt: skip


def check_row(row: tuple[Any, ...]) -> None:
    stored = dict(zip(COLUMNS, row, strict=True))
    stored["params"], stored["data"] = json.loads(stored["params"]), json.loads(stored["data"])
    envelope = Result.model_validate(stored).envelope()
    envelope["started_at"] = stored["started_at"]
    if envelope != stored:
        raise SystemExit(f"synthetic row differs from its envelope: {stored} vs {envelope}")


def build(url: str, n: int, days: int, seed: int) -> dict[str, Any]:
    source = rows(n, days, seed)
    first = next(source)
    check_row(first)
    t0 = time.perf_counter()
    count = 1
    with Archive.open(url) as archive, archive.writing("building the benchmark archive") as conn:
        # One COPY of millions of rows, then the rollups: longer than the archive's deadline.
        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        # Rows land in their month's partition (iepm/store/partitions.py), not the default one.
        partitions.create(conn, partitions.spanning(END - timedelta(days=days), END))
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy(f"COPY results ({', '.join(COLUMNS)}) FROM STDIN") as cp:  # type: ignore[union-attr]
            cp.write_row(first)
            for row in source:
                cp.write_row(row)
                count += 1
                if count % 1_000_000 == 0:
                    print(f"  {count:,} rows copied", file=sys.stderr)
        copied_s = time.perf_counter() - t0
        rollup.rebuild(conn)
    return {"results": count, "copy_s": round(copied_s, 1),
            "build_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


def _writer(url: str, name: str, ready: Any, go: Any, seconds: float, out: Any) -> None:
    from testkit import sample

    try:
        archive = Archive.open(url)
        archive.count()  # connected and migrated before the common start
    except Exception as exc:  # the parent stops every writer and says why
        ready.put(f"error: {name}: {exc}")
        return
    with archive:
        ready.put(name)
        go.wait(timeout=600)
        done = 0
        stop = time.time() + seconds
        while time.time() < stop:
            archive.add(sample.ping(target="h00", monitor=name, started_at=END))
            done += 1
    out.put(done)


def write_rate(url: str, writers: int, seconds: float) -> dict[str, Any]:
    """Results per second stored by ``writers`` processes at once, one result per transaction,
    all started together once every one is connected."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_writer, args=(url, f"w{i:02d}", ready, go, seconds, out))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    counted = False
    try:
        for _ in procs:
            if (got := ready.get(timeout=600)).startswith("error: "):
                raise SystemExit(f"mesh_scale: writer failed: {got[7:]}")
        go.set()
        counts = [out.get(timeout=seconds + 300) for _ in procs]
        counted = True
    finally:
        for p in procs:
            if not counted:  # a writer that failed or never started: the rest wait on `go`
                p.kill()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join(timeout=30)
    total = sum(counts)
    return {"writers": writers, "results": total, "per_second": round(total / seconds, 1),
            "per_writer_per_second": round(total / seconds / writers, 1)}  # fmt: skip


def measure(url: str, seconds: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with Archive.open(url) as archive:
        targets = archive.targets()
    port = webbench.free_port()
    server = webbench.start_server(url, port, 2)
    base = f"http://127.0.0.1:{port}"
    since = format_time(END - timedelta(days=28))
    pairs = [rng.sample(targets, 2) for _ in range(5000)]
    try:
        t0 = time.perf_counter()
        cold = httpx.get(f"{base}/mesh?metric=iperf3.throughput_bps&days=7", timeout=300)
        grid_cold_ms = (time.perf_counter() - t0) * 1000
        if cold.status_code != 200:
            raise SystemExit(f"/mesh: {cold.status_code} {cold.text[:300]}")
        webbench.load(base, ["/api/v1/health"], 2)

        def measured(paths: list[str]) -> dict[str, Any]:
            time.sleep(webbench.SETTLE_S)
            return webbench.load(base, paths, seconds)

        health = measured(["/api/v1/health"])
        grid = measured(["/mesh?metric=iperf3.throughput_bps&days=7"])
        pair = measured([f"/mesh/pair?a={a}&b={b}&days=7" for a, b in pairs])
        api = measured(
            [f"/api/v1/results?target={b}&monitor={a}&probe=ping&since={since}&limit=100"
             for a, b in pairs]
        )  # fmt: skip
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=5)
    return {
        "baseline": {"endpoint": "/api/v1/health", **webbench.figures(health)},
        "grid_cold_ms": round(grid_cold_ms, 1),
        "grid": webbench.figures(grid, health),
        "pair_page": webbench.figures(pair, health),
        "api_results": webbench.figures(api, health),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=50)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--seconds", type=float, default=10.0, help="of load per endpoint")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--writers", type=int, default=50)
    parser.add_argument("--write-seconds", type=float, default=10.0, help="0: no write test")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--db", help="an existing PostgreSQL archive (built before): no build")
    parser.add_argument(
        "--build", action="store_true", help="with --db: build into that (empty) archive first"
    )
    args = parser.parse_args()
    if args.build and not args.db:
        parser.error("--build goes with --db (without --db the archive is always built)")
    webbench.set_clients(args.clients)
    out: dict[str, Any] = {
        "benchmark": "mesh_scale", "hosts": args.hosts, "days": args.days,
        "clients": args.clients, "aim_p99_ms": 300, "load": os.getloadavg()[0],
    }  # fmt: skip

    def run(url: str) -> None:
        if args.db is None or args.build:
            out["build"] = build(url, args.hosts, args.days, args.seed)
            print(json.dumps(out["build"]), file=sys.stderr)
        out["pages"] = measure(url, args.seconds, args.seed)
        out["load_after_pages"] = os.getloadavg()[0]
        if args.write_seconds <= 0:
            return
        one = write_rate(url, 1, args.write_seconds)
        many = write_rate(url, args.writers, args.write_seconds)
        ratio = round(many["per_second"] / one["per_second"], 2)
        out["writes"] = {"one_monitor": one, "many_monitors": many, "ratio_total": ratio}

    if args.db:
        run(args.db)
    else:
        with webbench.archive_url("postgresql") as url:
            run(url)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

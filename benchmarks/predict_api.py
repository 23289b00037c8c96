"""Latency of the prediction endpoints on a seeded archive, against /api/v1/health (no archive
access) and /api/v1/aggregates (one path's figures from the archive) in the same run.

A synthetic SQLite archive: ``--targets`` targets measured hourly for 28 days by one monitor
(iperf3 throughput with lognormal noise on a level per target, and ping). Requests go through
the ASGI app in process (no network, one client, cache off, Table 1's reused walks dropped
before each request): the figures are the server's work per request. For each endpoint: the
median CPU time (the figure: a busy machine stretches wall time, not the work), the median
and P90 wall time over ``--repeat`` requests, and the median CPU time's ratios to the
baselines'.

Usage: .venv/bin/python benchmarks/predict_api.py [--targets 10] [--repeat 20] → JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient

from iepm.analysis import predict
from iepm.results import Result, format_time, new_result_id
from iepm.store import Archive
from iepm.web.app import create_app

END = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


def results(targets: int) -> list[Result]:
    rng = np.random.default_rng(15)
    out = []
    hours = 28 * 24
    for k in range(targets):
        level = float(rng.uniform(50e6, 900e6))
        for i in range(hours):
            when = END - timedelta(hours=hours - i)
            for probe, data in (
                ("iperf3", {"throughput_bps": level * float(rng.lognormal(0, 0.15))}),
                ("ping", {"rtt_avg_ms": 20.0 + k + float(rng.exponential(1.0))}),
            ):
                out.append(
                    Result(
                        probe=probe,
                        tool=probe,
                        tool_version="bench",
                        monitor="mon",
                        target=f"t{k:02d}",
                        target_address="198.18.0.1",
                        started_at=when,
                        duration_s=1.0,
                        diags=probe,
                        raw_token=new_result_id(),
                        params={},
                        data=data,
                    )
                )
    return out


def timed(
    client: TestClient, url: str, params: dict[str, object], repeat: int
) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds (this process, all threads: the app runs in it) per request."""
    wall, cpu = [], []
    for _ in range(repeat):
        predict._WALKS.clear()  # Table 1 reuses walks of the same runs: measure computing them
        t0, c0 = time.perf_counter(), time.process_time()
        res = client.get(url, params=params)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if res.status_code != 200:
            raise SystemExit(f"{url}: {res.status_code} {res.text[:200]}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    until = format_time(END)
    with tempfile.TemporaryDirectory(prefix="iepm-bench-predict-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'archive.db'}"
        with Archive.open(url) as archive:
            archive.add_many(results(args.targets))
        with TestClient(create_app(url, cache_ttl_s=0)) as client:
            path = {"target": "t00", "until": until}
            cases = {
                "health": ("/api/v1/health", {}),
                "aggregates": (
                    "/api/v1/aggregates",
                    {**path, "metric": "iperf3.throughput_bps", "period": "day"},
                ),
                "forecast": (
                    "/api/v1/forecast",
                    {**path, "metric": "iperf3.throughput_bps", "horizon": "6h"},
                ),
                "diurnal": ("/api/v1/diurnal", {**path, "metric": "iperf3.throughput_bps"}),
                "advice_all_targets": (
                    "/api/v1/advice",
                    {"destination": [f"t{k:02d}" for k in range(args.targets)], "until": until},
                ),
                "forecasts_page_28d": ("/forecasts", {"window": "28d", "until": until}),
            }
            timed(client, "/api/v1/health", {}, 3)  # warm-up: imports, first connections
            seconds = {name: timed(client, u, p, args.repeat) for name, (u, p) in cases.items()}
    # CPU time is the figure (a busy machine stretches wall time, not the work); wall beside it.
    base = statistics.median(seconds["health"][1])
    agg = statistics.median(seconds["aggregates"][1])
    figures = {
        name: {
            "cpu_median_ms": 1e3 * statistics.median(cpu),
            "wall_median_ms": 1e3 * statistics.median(wall),
            "wall_p90_ms": 1e3 * float(np.quantile(wall, 0.9)),
            "cpu_ratio_to_health": statistics.median(cpu) / base,
            "cpu_ratio_to_aggregates": statistics.median(cpu) / agg,
        }
        for name, (wall, cpu) in seconds.items()
    }
    print(
        json.dumps(
            {
                "figure": "prediction endpoints, in-process request latency",
                "targets": args.targets,
                "runs_per_path_and_probe": 28 * 24,
                "repeat": args.repeat,
                "baseline": "health (no archive access); aggregates (one path from the archive)",
                "endpoints": figures,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

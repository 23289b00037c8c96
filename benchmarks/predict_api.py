"""Latency of the prediction endpoints on a seeded archive, against /api/v1/health (no archive
access) and /api/v1/aggregates (one path's figures from the archive) in the same run.

A synthetic SQLite archive: ``--targets`` targets measured hourly for 28 days by one monitor
(iperf3 throughput with lognormal noise on a level per target, and ping). Requests go through
the ASGI app in process (no network, one client, cache off): the figures are the server's
work per request. For each endpoint: median and P90 over ``--repeat`` requests, and the ratio
of the median to the baseline's.

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


def timed(client: TestClient, url: str, params: dict[str, object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = client.get(url, params=params)
        out.append(time.perf_counter() - t0)
        if res.status_code != 200:
            raise SystemExit(f"{url}: {res.status_code} {res.text[:200]}")
    return out


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
    base = statistics.median(seconds["health"])
    agg = statistics.median(seconds["aggregates"])
    figures = {
        name: {
            "median_ms": 1e3 * statistics.median(s),
            "p90_ms": 1e3 * float(np.quantile(s, 0.9)),
            "ratio_to_health": statistics.median(s) / base,
            "ratio_to_aggregates": statistics.median(s) / agg,
        }
        for name, s in seconds.items()
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

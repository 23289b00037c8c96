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

``--lab`` (needs root) measures instead how well the forecast API's 80% intervals cover the next
run in the WAN lab: the scheduler measures four lab paths (ping; iperf3 on two of them) with the
real tools, then the RTT interval the API gives for each path before a cycle is checked against
what that cycle measures, over ``--checked`` cycles (30 by default, after ``--warm`` 30 cycles
of history). JSON: ``coverage`` (share of runs inside the interval given before them),
``ratio_to_nominal`` (coverage / 0.8), ``in_band`` (0.70 ≤ coverage ≤ 0.90, the lab's
expectation), ``per_target``, ``checks``. ``tests/analysis/test_lab_predict.py`` runs the same
code with few cycles.

    .venv/bin/python benchmarks/predict_api.py --lab [--warm 30] [--checked 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient

from iepm.analysis import predict
from iepm.config import load_config_text
from iepm.lab import Lab
from iepm.lab.testing import LabFactory
from iepm.results import Result, format_time, new_result_id
from iepm.scheduler import Scheduler
from iepm.store import Archive
from iepm.web.app import create_app
from testkit.net import iperf3_server

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


# --- the lab's forecasts ----------------------------------------------------------------------

LAB_PORT = 5201
# mon reaches four targets over r1, each link with its own delay and jitter; fast and slow
# also have bottlenecks (20 and 8 Mbit/s) and are measured by iperf3 too. Levels are known,
# the noise is real.
TWO_PATHS = {
    "lab": {"name": "pr", "seed": 15, "time_compression": 60},
    "hosts": [
        {"name": "mon", "role": "monitor"},
        {"name": "r1", "role": "router"},
        {"name": "fast", "role": "target"},
        {"name": "slow", "role": "target"},
        {"name": "near", "role": "target"},
        {"name": "far", "role": "target"},
    ],
    "links": [
        {"name": "access", "a": "mon", "b": "r1", "delay_ms": 1},
        {"name": "f", "a": "r1", "b": "fast", "delay_ms": 5, "rate_mbit": 20, "jitter_ms": 0.5},
        {"name": "s", "a": "r1", "b": "slow", "delay_ms": 15, "rate_mbit": 8, "jitter_ms": 0.5},
        {"name": "n", "a": "r1", "b": "near", "delay_ms": 2, "jitter_ms": 0.3},
        {"name": "d", "a": "r1", "b": "far", "delay_ms": 25, "jitter_ms": 1.0},
    ],
}
RATE_BPS = {"fast": 20e6, "slow": 8e6}
RTT_MS = {"fast": 12.0, "slow": 32.0, "near": 6.0, "far": 52.0}
RTT = "ping.rtt_avg_ms"
THROUGHPUT = "iperf3.throughput_bps"
FULL_CYCLES = 6  # ping and iperf3: the API answers for every path and metric (START + 1 runs)
WARM_CYCLES = 30  # then ping only (a cycle takes a fraction of a second): history
CHECKED_CYCLES = 30  # and the intervals given before each of these are checked
COVERAGE_BAND = (0.70, 0.90)  # of the nominal 80%, on ~100 checks


def lab_config_text(lab: Lab, tmp: Path, *, iperf3: bool) -> str:
    targets = "".join(
        f'\n[[targets]]\nname = "{t}"\naddress = "{lab.address(t)}"\n'
        f"probes = {['ping', 'iperf3'] if iperf3 and t in RATE_BPS else ['ping']!r}\n"
        for t in RTT_MS
    )
    return f"""
[monitor]
name = "labmon"
cycle_interval_s = 60
archive = "sqlite:///{tmp}/archive.db"
log_dir = "{tmp}/raw"
netns = "{lab.netns("mon")}"

[defaults.ping]
count = 3
interval_s = 0.1

[defaults.iperf3]
duration_s = 1
port = {LAB_PORT}
{targets}"""


@dataclass
class LabForecasts:
    # (target, metric) → the API's answer after the full cycles
    answers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # target, interval's lower end, RTT the next cycle measured, upper end
    checks: list[tuple[str, float, float, float]] = field(default_factory=list)
    seconds: float = 0.0

    def coverage(self, target: str | None = None) -> float:
        mine = [c for c in self.checks if target is None or c[0] == target]
        return sum(lo <= rtt <= hi for _t, lo, rtt, hi in mine) / len(mine)


def lab_forecasts(
    factory: LabFactory,
    tmp: Path,
    *,
    full_cycles: int = FULL_CYCLES,
    warm_cycles: int = WARM_CYCLES,
    checked_cycles: int = CHECKED_CYCLES,
    prefix: str = "serve",
) -> LabForecasts:
    """The scheduler measures the lab's four paths ``full_cycles`` times (ping, and iperf3 where
    there is a bottleneck), the API is asked for every path and metric; then ping only,
    ``warm_cycles`` of history and ``checked_cycles`` whose RTTs are checked against the
    intervals the API gave for them just before."""
    t0 = time.monotonic()
    lab = factory(TWO_PATHS, prefix=prefix)
    full = load_config_text(lab_config_text(lab, tmp, iperf3=True))
    ping_only = load_config_text(lab_config_text(lab, tmp, iperf3=False))
    url = full.monitor.archive
    out = LabForecasts()
    with contextlib.ExitStack() as stack:
        for t in RATE_BPS:
            stack.enter_context(iperf3_server(lab.address(t), LAB_PORT, netns=lab.netns(t)))
        archive = stack.enter_context(Archive.open(url))
        client = stack.enter_context(TestClient(create_app(url, cache_ttl_s=0)))

        def forecast(target: str, metric: str) -> dict[str, Any]:
            res = client.get("/api/v1/forecast", params={"target": target, "metric": metric})
            if res.status_code != 200:
                raise AssertionError((target, metric, res.status_code, res.text))
            return res.json()  # type: ignore[no-any-return]

        async def run() -> None:
            scheduler = Scheduler(full, archive, watchers=[])
            for _ in range(full_cycles):
                report = await scheduler.run_cycle()
                if not all(r.succeeded for r in report.results):
                    raise AssertionError([r.error for r in report.results if not r.succeeded])
            await asyncio.to_thread(scheduler.close)
            for target in RTT_MS:
                for metric in (RTT, THROUGHPUT) if target in RATE_BPS else (RTT,):
                    out.answers[(target, metric)] = await asyncio.to_thread(
                        forecast, target, metric
                    )
            scheduler = Scheduler(ping_only, archive, watchers=[])
            for _ in range(warm_cycles):
                await scheduler.run_cycle()
            for _ in range(checked_cycles):
                given = {t: (await asyncio.to_thread(forecast, t, RTT))["now"] for t in RTT_MS}
                report = await scheduler.run_cycle()
                for r in report.results:
                    if not r.succeeded:
                        raise AssertionError((r.target, r.error))
                    f = given[r.target]
                    out.checks.append((r.target, f["lower"], r.data["rtt_avg_ms"], f["upper"]))
            await asyncio.to_thread(scheduler.close)

        asyncio.run(run())
    out.seconds = time.monotonic() - t0
    return out


def lab_main(warm: int, checked: int) -> None:
    with tempfile.TemporaryDirectory(prefix="iepm-bench-predict-lab-") as tmp, LabFactory() as f:
        run = lab_forecasts(f, Path(tmp), warm_cycles=warm, checked_cycles=checked, prefix="bpr")
    covered = run.coverage()
    print(
        json.dumps(
            {
                "figure": "lab RTT 80% interval coverage of the next run",
                "coverage": covered,
                "nominal": predict.COVERAGE,
                "ratio_to_nominal": covered / predict.COVERAGE,
                "band": COVERAGE_BAND,
                "in_band": COVERAGE_BAND[0] <= covered <= COVERAGE_BAND[1],
                "per_target": {t: run.coverage(t) for t in RTT_MS},
                "checks": len(run.checks),
                "cycles": {"full": FULL_CYCLES, "warm": warm, "checked": checked},
                "seconds": round(run.seconds, 1),
            },
            indent=1,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--lab", action="store_true", help="the lab's interval coverage instead")
    parser.add_argument("--warm", type=int, default=WARM_CYCLES)
    parser.add_argument("--checked", type=int, default=CHECKED_CYCLES)
    args = parser.parse_args()
    if args.lab:
        lab_main(args.warm, args.checked)
        return
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

"""Scheduler overhead: the wall time of one cycle of ping + traceroute + iperf3 to N lab targets,
against the time its probes themselves took, measured in the same run.

Within a target the background probes (ping, traceroute) run side by side and the bandwidth
test runs after them, alone; targets follow one another. So the least a perfect scheduler can
take is the *critical path*: for each target, the longest background probe plus the bandwidth
test. ``ratio`` = wall / critical path (aim < 1.05); ``ratio_to_sum`` = wall / plain sum of
every probe's duration (below 1 because ping and traceroute overlap).

Needs root (a lab). Prints JSON.

    .venv/bin/python benchmarks/cycle.py [--targets 4] [--iperf3-seconds 10] [--cycles 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from iepm.config import load_config_text
from iepm.lab import Lab
from iepm.results import Result
from iepm.scheduler import CycleReport, Scheduler
from iepm.store import Archive

PORT = 5201


def topology(n: int) -> dict[str, Any]:
    # Targets at 10, 30, 50, ... ms RTT behind one router, each with a 100 Mbit/s bottleneck.
    targets = [f"t{i}" for i in range(n)]
    return {
        "lab": {"name": "cyc"},
        "hosts": [
            {"name": "mon", "role": "monitor"},
            {"name": "r1", "role": "router"},
            *({"name": t, "role": "target"} for t in targets),
        ],
        "links": [
            {"a": "mon", "b": "r1", "delay_ms": 1.0},
            *(
                {"a": "r1", "b": t, "delay_ms": 4.0 + 10 * i, "rate_mbit": 100}
                for i, t in enumerate(targets)
            ),
        ],
    }


def config_text(lab: Lab, workdir: Path, n: int, iperf3_s: float) -> str:
    targets = "".join(
        f'\n[[targets]]\nname = "t{i}"\naddress = "{lab.address(f"t{i}")}"\n' for i in range(n)
    )
    return f"""
[monitor]
name = "bench-mon"
cycle_interval_s = 3600
archive = "sqlite:///{workdir}/archive.db"
log_dir = "{workdir}/raw"
netns = "{lab.netns("mon")}"

[defaults.ping]
count = 10
interval_s = 0.5

[defaults.traceroute]
max_hops = 8

[defaults.iperf3]
duration_s = {iperf3_s}
port = {PORT}
streams = 2
{targets}"""


def critical_path(results: list[Result]) -> float:
    by_target: dict[str, list[Result]] = defaultdict(list)
    for result in results:
        by_target[result.target].append(result)
    total = 0.0
    for rs in by_target.values():
        background = [r.duration_s for r in rs if r.probe in ("ping", "traceroute", "load")]
        exclusive = [r.duration_s for r in rs if r.probe not in ("ping", "traceroute", "load")]
        total += max(background, default=0.0) + sum(exclusive)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=4)
    parser.add_argument("--iperf3-seconds", type=float, default=10.0)
    parser.add_argument("--cycles", type=int, default=2)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"benchmark": "cycle", "skipped": "needs root for the lab"}))
        return 0

    reports: list[CycleReport] = []
    with (
        tempfile.TemporaryDirectory(prefix="iepm-bench-cycle-") as tmp,
        Lab.up(topology(args.targets), name=f"cyc{os.getpid()}") as lab,
    ):
        servers = [
            lab.popen(f"t{i}", ["iperf3", "-s", "-p", str(PORT), "-B", lab.address(f"t{i}")])
            for i in range(args.targets)
        ]
        try:
            time.sleep(0.5)
            config = load_config_text(
                config_text(lab, Path(tmp), args.targets, args.iperf3_seconds)
            )
            with Archive.open(config.monitor.archive) as archive:
                scheduler = Scheduler(config, archive)
                for _ in range(args.cycles):
                    reports.append(asyncio.run(scheduler.run_cycle()))
        finally:
            for server in servers:
                lab.stop(server)

    cycles = []
    for report in reports:
        path = critical_path(report.results)
        cycles.append(
            {
                "wall_s": round(report.duration_s, 3),
                "critical_path_s": round(path, 3),
                "sum_of_probes_s": round(report.probe_time_s, 3),
                "ratio": round(report.duration_s / path, 4),
                "ratio_to_sum": round(report.duration_s / report.probe_time_s, 4),
                "outcomes": dict(report.outcomes),
            }
        )
    print(
        json.dumps(
            {
                "benchmark": "cycle",
                "targets": args.targets,
                "probes": ["ping 10 x 0.5 s", "traceroute", f"iperf3 {args.iperf3_seconds} s"],
                "figure": "wall time of one cycle, s (median over cycles)",
                "value": statistics.median(c["wall_s"] for c in cycles),
                "baseline": "critical path of the probes' own durations, s",
                "baseline_value": statistics.median(c["critical_path_s"] for c in cycles),
                "ratio": statistics.median(c["ratio"] for c in cycles),
                "cycles": cycles,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

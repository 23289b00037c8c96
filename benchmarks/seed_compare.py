"""The seed's comparison (IEPM-BW's Fig. 8 as a table) on lab paths: tuned iperf3 and a
memory-to-memory copy by each tool (xrdcp with and without page CRCs and GridFTP through the
target's agent; rsync over SSH to a private sshd there: aes128-gcm on one and on parallel
connections, chacha20-poly1305), each copy about ``--seconds`` at the path's rate.

Needs root (a lab). Prints the Markdown table on stderr and one JSON object: per run the copy's
throughput, the ``baseline`` (tuned iperf3 on the same path in the same run, the mean of the
runs before and after the copies), ``ratio`` = copy ÷ baseline, the tool's and the delay line's
CPU seconds per GB, and the load average when it ended; per tool the lowest ratio against the
floor tests/lab/test_lab_gridftp.py asserts (on the near path only).

    .venv/bin/python benchmarks/seed_compare.py [--seconds 8] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.lab import Lab
from iepm.lab.testing import host_timer, unique_lab_name
from testkit.copylab import FLOORS, comparison_table, comparison_topology, seed_comparison

# name: (one-way delay ms, rate Mbit/s); modest rates, the delay lines share two busy cores.
PATHS = {"near": (5.0, 200), "far": (20.0, 100)}
AGENT_PORT = 8741


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="iepm-bench-gc-") as tmp,
        Lab.up(comparison_topology(PATHS), name=unique_lab_name("bgc")) as lab,
        host_timer() as timer,
    ):
        rows = seed_comparison(lab, PATHS, Path(tmp), AGENT_PORT, seconds=args.seconds)
    print(comparison_table(rows), file=sys.stderr)
    runs: list[dict[str, Any]] = [
        {
            "path": r.path,
            "rtt_ms": r.rtt_ms,
            "rate_mbit": r.rate_mbit,
            "tool": r.tool,
            "settings": r.how,
            "figure_bps": r.result.data["throughput_bps"],
            "tool_own_bps": r.result.data.get("tool_throughput_bps"),
            "baseline_bps": r.iperf_bps,
            "ratio": round(r.ratio, 3),
            "tool_cpu_s_per_gb": round(r.tool_cpu_s_per_gb, 3),
            "delay_line_cpu_s_per_gb": round(r.delay_line_cpu_s_per_gb, 2),
            "load1": r.load1,
        }
        for r in rows
    ]
    lowest = {
        tool: min(r.ratio for r in rows if r.tool == tool) for tool in FLOORS
    }  # per tool over every path and setting
    report = {
        "benchmark": "seed_compare",
        "seconds": args.seconds,
        "runs": runs,
        "lowest_ratio": {tool: round(v, 3) for tool, v in lowest.items()},
        "floors": FLOORS,
        "host_timer_us": timer,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""Commit at the end: does a small disk copy predict a large one? (needs root: loop device,
mount, blkio cgroup).

On a target whose disk is slower than its network (ext4 on a loop device, write-back throttled
to ``--disk-mib-s``; see testkit/slowdisk.py), through the target's iepm agent
on loopback, in one run:

* ``figure``: xrdcp_disk 64 MB with ``commit = "at_end"``, committed throughput;
* ``baseline``: xrdcp_disk 1 GB with ``commit = "at_end"``, committed throughput;
* ``ratio`` = figure ÷ baseline — the goal is within 10% (0.9–1.1);
* ``uncommitted_64M_bps`` and its ratio to the baseline: the same 64 MB without commit (the
  page cache's rate, the figure the seed warned about);
* ``dd_fsync_bps``: a plain ``dd conv=fsync`` of 64 MB on that disk (its rate).

    .venv/bin/python benchmarks/commit_at_end.py [--disk-mib-s 16] [--json-out FILE]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from iepm.config import AgentAccess
from iepm.probes import xrdcp_disk
from iepm.probes.base import ProbeContext
from iepm.remote.lease import server_source
from testkit.agent import running_agent
from testkit.slowdisk import slow_disk


def copy(ctx: ProbeContext, size: str, commit: str, source_dir: str) -> dict[str, Any]:
    spec = xrdcp_disk.Spec(size=size, commit=commit, duration_s=600, source_dir=source_dir)
    result = asyncio.run(xrdcp_disk.run(spec, ctx))
    if not result.succeeded:
        raise SystemExit(f"{size} commit={commit} failed: {result.error}\n{result.diags[-2000:]}")
    return result.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--disk-mib-s", type=int, default=16, help="write throttle, MiB/s")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="iepm-commit-src-", dir="/var/tmp") as sources,
        slow_disk(args.disk_mib_s << 20, size_mb=1400) as disk,
        running_agent(disk.mount / "agent", kinds=("xrootd",)) as agent,
    ):
        for path in (disk.mount / "agent", disk.mount / "agent" / "state"):
            path.chmod(0o755)  # xrootd runs as nobody
        assert agent.proc is not None
        dd_bps = disk.dd_rate(64 << 20, "conv=fsync") * 8
        access = AgentAccess(url=agent.url, credential_file=str(agent.token_file("bulk")))
        ctx = ProbeContext(target="slow", address="127.0.0.1", servers=server_source(access))
        small = copy(ctx, "64M", "at_end", sources)
        big = copy(ctx, "1G", "at_end", sources)
        # Last: its dirty pages would slow the next fsync on this file system.
        loose = copy(ctx, "64M", "none", sources)
    figure = small["committed_throughput_bps"]
    baseline = big["committed_throughput_bps"]
    report = {
        "figure": "xrdcp_disk 64M commit=at_end committed_throughput_bps",
        "figure_bps": figure,
        "baseline": "xrdcp_disk 1G commit=at_end committed_throughput_bps",
        "baseline_bps": baseline,
        "ratio": round(figure / baseline, 4),
        "goal": "ratio within 0.9-1.1",
        "uncommitted_64M_bps": loose["throughput_bps"],
        "uncommitted_ratio_to_baseline": round(loose["throughput_bps"] / baseline, 2),
        "dd_fsync_bps": round(dd_bps, 1),
        "throttle_bps": (args.disk_mib_s << 20) * 8,
        "timers": {
            name: {k: d[k] for k in ("setup_s", "transfer_s", "commit_s")}
            for name, d in (("64M", small), ("1G", big), ("64M_none", loose))
        },
        "wall_s": round(time.monotonic() - t0, 1),
    }
    text = json.dumps(report, indent=1)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

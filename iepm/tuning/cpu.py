"""CPU cost of throughput: MHz per Mbit/s (the seeds' "1 MHz per Mbit/s"), from the archive.

The sender's figure is ``mhz_per_mbps`` of every successful TCP iperf3 result (the local iperf3's
CPU share × this host's clock ÷ Mbit/s; the sender is the monitor unless the test ran
reversed). The receiver's clock is not known to the monitor, so its cost is given as percent of
one CPU per Gbit/s. Grouped per host and per kernel (the ``kernel_release`` of the monitor's
latest ``load`` result).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from datetime import datetime
from typing import Any

from iepm.store import Archive
from iepm.tuning.measure import percentiles


def kernels(archive: Archive) -> dict[str, str]:
    """Monitor → kernel release, from the newest load result of each monitor."""
    found: dict[str, str] = {}
    for r in archive.results(probe="load", order="desc"):
        release = r.data.get("kernel_release")
        if release and r.monitor not in found:
            found[r.monitor] = str(release)
    return found


def _stats(values: list[float]) -> dict[str, Any]:
    q = percentiles(values, (25, 50, 75))
    return {
        "n": len(values),
        "median": q["p50"],
        "q1": q["p25"],
        "q3": q["p75"],
        "mean": round(statistics.fmean(values), 4) if values else None,
    }


def summary(
    archive: Archive, *, since: datetime | None = None, until: datetime | None = None
) -> dict[str, Any]:
    release = kernels(archive)
    local: dict[tuple[str, str], list[float]] = defaultdict(list)
    remote: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_kernel: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in archive.results(probe="iperf3", since=since, until=until):
        d = r.data
        bps = d.get("throughput_bps")
        if not r.succeeded or d.get("protocol") == "UDP" or not bps:
            continue
        # -R: the monitor received and the target sent.
        local_role, remote_role = (
            ("receiver", "sender") if d.get("reverse") else ("sender", "receiver")
        )
        if d.get("mhz_per_mbps") is not None:
            local[(r.monitor, local_role)].append(float(d["mhz_per_mbps"]))
            by_kernel[(release.get(r.monitor, "unknown"), local_role)].append(
                float(d["mhz_per_mbps"])
            )
        if d.get("remote_cpu_percent") is not None:
            remote[(r.target, remote_role)].append(float(d["remote_cpu_percent"]) / (bps / 1e9))
    return {
        "mhz_per_mbps": [
            {"host": h, "role": role, "kernel": release.get(h)} | _stats(v)
            for (h, role), v in sorted(local.items())
        ],
        "mhz_per_mbps_by_kernel": [
            {"kernel": k, "role": role} | _stats(v) for (k, role), v in sorted(by_kernel.items())
        ],
        "remote_cpu_percent_per_gbps": [
            {"host": h, "role": role} | _stats(v) for (h, role), v in sorted(remote.items())
        ],
    }

"""One study point: an iperf3 transfer with pings during it and after it, all stored as results.

The probes run through their public ``Spec``/``run``; the results go into the archive like any
scheduled measurement, and the point keeps their ids and the figures the studies need.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from iepm.probes import iperf3, ping
from iepm.probes.base import ProbeContext
from iepm.results import Result

# iperf3 spends about this long on connecting and exchanging parameters and results.
IPERF3_OVERHEAD_S = 1.0
BUSY_RETRY_S = 1.0


@dataclass
class Transfer:
    iperf3: Result
    ping_during: Result | None
    ping_after: Result | None


async def run_iperf3(spec: iperf3.Spec, ctx: ProbeContext) -> Result:
    """One iperf3 run; retried once, a second later, when the server was still busy with the
    previous test of the study (iperf3 serves one test at a time and needs a moment to
    reset). The retry's ``diags`` keeps what the first attempt said."""
    result = await iperf3.run(spec, ctx)
    if not result.succeeded and "busy" in (result.error or ""):
        await asyncio.sleep(BUSY_RETRY_S)
        retry = await iperf3.run(spec, ctx)
        retry.diags = f"{retry.diags}\n[retried: first attempt said: {result.error}]"
        return retry
    return result


def ping_during_spec(duration_s: float, count: int) -> tuple[float, ping.Spec]:
    """(delay before the first ping, spec): ``count`` pings spread over the transfer's middle
    80%, so that none lands in the connection set-up or after the end."""
    span = 0.8 * duration_s
    interval = max(0.01, span / max(count, 1))
    return 0.1 * duration_s + 0.3, ping.Spec(count=count, interval_s=round(interval, 3))


async def transfer_with_pings(
    spec: iperf3.Spec,
    ctx: ProbeContext,
    *,
    pings_during: int,
    pings_after: int,
    after_interval_s: float,
) -> Transfer:
    """Run the transfer, ``pings_during`` pings while it runs and ``pings_after`` once it ended."""
    during: Result | None = None
    transfer_task = asyncio.create_task(run_iperf3(spec, ctx))
    if pings_during:
        delay, during_spec = ping_during_spec(spec.duration_s, pings_during)
        try:
            await asyncio.sleep(delay)
            during = await ping.run(during_spec, ctx)
        except BaseException:
            transfer_task.cancel()
            await asyncio.gather(transfer_task, return_exceptions=True)
            raise
    result = await transfer_task
    after = None
    if pings_after:
        after = await ping.run(ping.Spec(count=pings_after, interval_s=after_interval_s), ctx)
    return Transfer(result, during, after)


def rtts(result: Result | None) -> list[float]:
    if result is None:
        return []
    return [float(v) for v in result.data.get("rtts_ms") or []]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def iperf3_figures(result: Result) -> dict[str, Any]:
    data = result.data
    return {
        "succeeded": result.succeeded,
        "error": result.error,
        "throughput_bps": data.get("throughput_bps") if result.succeeded else None,
        "sender_throughput_bps": data.get("sender_throughput_bps"),
        "bytes_sent": data.get("bytes_sent"),
        "retransmits": data.get("retransmits"),
        "mean_rtt_ms": data.get("mean_rtt_ms"),
        "local_cpu_percent": data.get("local_cpu_percent"),
        "remote_cpu_percent": data.get("remote_cpu_percent"),
        "mhz_per_mbps": data.get("mhz_per_mbps"),
        "iperf3_result_id": result.id,
    }


def ping_figures(prefix: str, result: Result | None) -> dict[str, Any]:
    values = rtts(result)
    return {
        f"rtt_{prefix}_ms": values,
        f"rtt_{prefix}_median_ms": median(values),
        f"loss_{prefix}_percent": result.data.get("loss_percent") if result else None,
        f"ping_{prefix}_result_id": result.id if result else None,
    }


def percentiles(values: list[float], qs: tuple[float, ...]) -> dict[str, float | None]:
    """Percentiles by linear interpolation (numpy's default), keyed ``p10``, ``p50``…"""
    out: dict[str, float | None] = {}
    ordered = sorted(values)
    for q in qs:
        key = f"p{q:g}"
        if not ordered:
            out[key] = None
            continue
        pos = (len(ordered) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        out[key] = round(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo), 4)
    return out

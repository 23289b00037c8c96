"""Impact on others (``iepm study impact``): what a heavy test does to everyone's RTT.

Ping RTTs without load, then during transfers at increasing load levels (iperf3 paced with
``-b``, the last level unpaced); percentiles and CDFs per level; the knee: the throughput above
which the median RTT rises sharply (by more than ``knee_ms`` over the unloaded median). On a
drop-tail bottleneck the unpaced transfer fills the queue, so the loaded median exceeds the
unloaded one by roughly the queue's delay.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from iepm.probes import iperf3, ping
from iepm.probes.base import ProbeContext
from iepm.results import utcnow
from iepm.store import Archive
from iepm.tuning.measure import (
    IPERF3_OVERHEAD_S,
    iperf3_figures,
    percentiles,
    ping_figures,
    transfer_with_pings,
)
from iepm.tuning.store import Study, StudyRecorder
from iepm.tuning.sweep import StudyRefused

KIND = "impact"
QUANTILES = (5, 10, 25, 50, 75, 90, 95, 99)


@dataclass(frozen=True)
class ImpactPlan:
    # Total rates of the load (bit/s, iperf3 -b syntax); None is an unpaced transfer.
    rates: list[str | None] = field(default_factory=lambda: ["10M", "50M", "100M", None])
    streams: int = 4
    window: str | None = None
    duration_s: int = 10
    pings: int = 40
    unloaded_interval_s: float = 0.2
    knee_ms: float | None = None  # default: max(2 ms, 20% of the unloaded median)
    max_total_s: float = 1800.0

    def estimate_s(self) -> float:
        return self.pings * self.unloaded_interval_s + len(self.rates) * (
            self.duration_s + IPERF3_OVERHEAD_S
        )


def rate_label(rate: str | None) -> str:
    return "unpaced" if rate is None else f"{rate}bit/s"


def per_stream_rate(rate: str | None, streams: int) -> str | None:
    if rate is None:
        return None
    return str(max(1, round(iperf3.size_bytes(rate, base=1000) / streams)))


def check_plan(plan: ImpactPlan) -> None:
    problems = []
    if not plan.rates:
        problems.append("give at least one load level")
    for rate in plan.rates:
        if rate is not None:
            try:
                iperf3.Spec(rate=rate)
            except ValueError as exc:
                problems.append(str(exc))
    if not 1 <= plan.streams <= 128:
        problems.append(f"streams {plan.streams} outside 1…128")
    if plan.estimate_s() > plan.max_total_s:
        problems.append(
            f"about {plan.estimate_s():.0f} s exceeds the limit of {plan.max_total_s:.0f} s"
        )
    if problems:
        raise StudyRefused("impact study refused before it started: " + "; ".join(problems))


def summarise(points: list[dict[str, Any]], plan: ImpactPlan) -> dict[str, Any]:
    unloaded = next((p for p in points if p["level"] == "unloaded"), None)
    base_rtts = unloaded["rtt_ms"] if unloaded else []
    base = percentiles(base_rtts, QUANTILES)
    base_median = base["p50"]
    knee_ms = plan.knee_ms
    if knee_ms is None:
        knee_ms = max(2.0, 0.2 * (base_median or 0.0))
    levels = []
    for p in points:
        if p["level"] == "unloaded":
            continue
        stats = percentiles(p["rtt_ms"], QUANTILES)
        increase = (
            stats["p50"] - base_median
            if stats["p50"] is not None and base_median is not None
            else None
        )
        levels.append(
            {
                "level": p["level"],
                "rate": p.get("rate"),
                "throughput_bps": p.get("throughput_bps"),
                "rtt_percentiles_ms": stats,
                "median_increase_ms": increase,
                "sharp_rise": increase is not None and increase > knee_ms,
            }
        )
    ordered = sorted(
        (lv for lv in levels if lv["throughput_bps"]), key=lambda lv: lv["throughput_bps"]
    )
    knee_bps = None
    first_sharp = next((lv for lv in ordered if lv["sharp_rise"]), None)
    if first_sharp is not None:
        below = [lv for lv in ordered if lv["throughput_bps"] < first_sharp["throughput_bps"]]
        knee_bps = below[-1]["throughput_bps"] if below else 0.0
    heaviest = max(ordered, key=lambda lv: lv["throughput_bps"]) if ordered else None
    return {
        "unloaded_rtt_percentiles_ms": base,
        "levels": levels,
        "knee_ms": knee_ms,
        # RTT stays within knee_ms of the unloaded median up to this throughput (None: never
        # rose sharply; 0: rose even at the lightest load).
        "knee_throughput_bps": knee_bps,
        "sharp_rise_at_bps": first_sharp["throughput_bps"] if first_sharp else None,
        "heaviest_median_increase_ms": heaviest["median_increase_ms"] if heaviest else None,
        "heaviest_throughput_bps": heaviest["throughput_bps"] if heaviest else None,
    }


async def run_impact_study(
    archive: Archive,
    ctx: ProbeContext,
    plan: ImpactPlan,
    *,
    base: iperf3.Spec | None = None,
    on_point: Any = None,
) -> Study:
    base = base or iperf3.Spec()
    check_plan(plan)
    params = {
        "plan": asdict(plan),
        "base_spec": base.model_dump(mode="json"),
        "address": ctx.address,
    }
    recorder = StudyRecorder(archive, Study(KIND, ctx.monitor, ctx.target, params))
    total = 1 + len(plan.rates)
    try:
        started = utcnow()
        quiet = await ping.run(
            ping.Spec(count=plan.pings, interval_s=plan.unloaded_interval_s), ctx
        )
        recorder.store_result(quiet)
        figures = ping_figures("unloaded", quiet)
        point = {
            "level": "unloaded",
            "started_at": started.isoformat(),
            "rtt_ms": figures["rtt_unloaded_ms"],
            "loss_percent": figures["loss_unloaded_percent"],
            "ping_result_id": quiet.id,
        }
        recorder.add_point(point)
        if on_point is not None:
            on_point(point, 1, total)
        for i, rate in enumerate(plan.rates):
            spec = base.model_copy(
                update={
                    "window": plan.window,
                    "streams": plan.streams,
                    "duration_s": float(plan.duration_s),
                    # iperf3 paces each stream at -b: split the level's total among them.
                    "rate": per_stream_rate(rate, plan.streams),
                    "udp": False,
                }
            )
            started = utcnow()
            transfer = await transfer_with_pings(
                spec, ctx, pings_during=plan.pings, pings_after=0, after_interval_s=0.2
            )
            recorder.store_result(transfer.iperf3)
            recorder.store_result(transfer.ping_during)
            during = ping_figures("during", transfer.ping_during)
            point = {
                "level": rate_label(rate),
                "rate": rate,
                "started_at": started.isoformat(),
                "rtt_ms": during["rtt_during_ms"],
                "loss_percent": during["loss_during_percent"],
                "ping_result_id": during["ping_during_result_id"],
                **iperf3_figures(transfer.iperf3),
            }
            recorder.add_point(point)
            if on_point is not None:
                on_point(point, i + 2, total)
    except (asyncio.CancelledError, KeyboardInterrupt):
        reason = f"interrupted after {len(recorder.study.points)} of {total} levels"
        recorder.finish(
            summarise(recorder.study.points, plan) | {"partial_reason": reason}, partial=True
        )
        raise
    summary = summarise(recorder.study.points, plan) | {"partial_reason": None}
    return recorder.finish(summary, partial=False)

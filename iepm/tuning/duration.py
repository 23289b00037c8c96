"""Duration study (``iepm study duration``): how long must an iperf3 test run on this path?

Repeated single-stream tests for each duration (2…320 s) and window, in shuffled order; median
and IQR per duration; the recommendation is the shortest duration whose median is within
``tolerance`` (10%) of the longest duration's median. Slow start makes short tests read low on
paths with a large bandwidth × RTT, so long paths need longer tests.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.results import utcnow
from iepm.store import Archive
from iepm.tuning.measure import IPERF3_OVERHEAD_S, iperf3_figures, percentiles, run_iperf3
from iepm.tuning.store import Study, StudyRecorder
from iepm.tuning.sweep import StudyRefused, window_label

KIND = "duration"
DEFAULT_DURATIONS = [2, 5, 10, 20, 40, 80, 160, 320]


@dataclass(frozen=True)
class DurationPlan:
    durations: list[int] = field(default_factory=lambda: list(DEFAULT_DURATIONS))
    windows: list[str | None] = field(default_factory=lambda: [None])
    repeats: int = 3
    tolerance: float = 0.10
    seed: int = 1
    max_total_s: float = 4 * 3600.0

    def runs(self) -> list[tuple[str | None, int, int]]:
        runs = [
            (w, d, r) for w in self.windows for d in self.durations for r in range(self.repeats)
        ]
        random.Random(self.seed).shuffle(runs)
        return runs

    def estimate_s(self) -> float:
        per_window = sum(d + IPERF3_OVERHEAD_S for d in self.durations) * self.repeats
        return per_window * len(self.windows)


def check_plan(plan: DurationPlan) -> None:
    problems = []
    if len(plan.durations) < 2:
        problems.append("give at least two durations to compare")
    bad = [d for d in plan.durations if not 1 <= d <= 3600]
    if bad:
        problems.append(f"durations {bad} are outside 1…3600 s")
    if plan.repeats < 1:
        problems.append("repeats must be at least 1")
    if plan.estimate_s() > plan.max_total_s:
        problems.append(
            f"{len(plan.windows)} windows × {plan.repeats} repeats × {sum(plan.durations)} s of "
            f"tests ≈ {plan.estimate_s():.0f} s exceeds the limit of {plan.max_total_s:.0f} s "
            "(use fewer durations, repeats or windows, or raise --max-total)"
        )
    if problems:
        raise StudyRefused("duration study refused before it started: " + "; ".join(problems))


def recommend(points: list[dict[str, Any]], tolerance: float) -> dict[str, Any]:
    """Per window: median and IQR per duration, and the recommended duration."""
    per_window: dict[str, Any] = {}
    labels = sorted({p["window_label"] for p in points})
    for label in labels:
        by_duration: dict[int, list[float]] = {}
        for p in points:
            if p["window_label"] == label and p.get("throughput_bps"):
                by_duration.setdefault(int(p["duration_s"]), []).append(p["throughput_bps"])
        stats = {
            d: percentiles(v, (25, 50, 75)) | {"n": len(v)} for d, v in sorted(by_duration.items())
        }
        recommended = None
        if stats:
            longest = max(stats)
            reference = stats[longest]["p50"] or 0.0
            recommended = next(
                d
                for d, s in stats.items()
                if reference and abs((s["p50"] or 0) - reference) <= tolerance * reference
            )
        per_window[label] = {
            "by_duration": {
                str(d): {
                    "median_bps": s["p50"],
                    "q1_bps": s["p25"],
                    "q3_bps": s["p75"],
                    "iqr_bps": (s["p75"] or 0) - (s["p25"] or 0),
                    "n": s["n"],
                }
                for d, s in stats.items()
            },
            "recommended_duration_s": recommended,
        }
    choices = [w["recommended_duration_s"] for w in per_window.values()]
    known = [c for c in choices if c is not None]
    return {
        "windows": per_window,
        # The longest of the per-window answers is enough for every window studied.
        "recommended_duration_s": max(known) if known else None,
        "tolerance": tolerance,
    }


async def run_duration_study(
    archive: Archive,
    ctx: ProbeContext,
    plan: DurationPlan,
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
    runs = plan.runs()
    reason = None
    try:
        for i, (window, duration, repeat) in enumerate(runs):
            spec = base.model_copy(
                update={"window": window, "streams": 1, "duration_s": float(duration)}
            )
            started = utcnow()
            result = await run_iperf3(spec, ctx)
            recorder.store_result(result)
            point = {
                "order": i,
                "window": window,
                "window_label": window_label(window),
                "duration_s": duration,
                "repeat": repeat,
                "started_at": started.isoformat(),
                **iperf3_figures(result),
            }
            recorder.add_point(point)
            if on_point is not None:
                on_point(point, i + 1, len(runs))
    except (asyncio.CancelledError, KeyboardInterrupt):
        reason = f"interrupted after {len(recorder.study.points)} of {len(runs)} runs"
        recorder.finish(
            recommend(recorder.study.points, plan.tolerance) | {"partial_reason": reason},
            partial=True,
        )
        raise
    summary = recommend(recorder.study.points, plan.tolerance) | {"partial_reason": None}
    return recorder.finish(summary, partial=False)

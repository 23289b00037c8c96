"""Windows × streams sweep (``iepm tune``): find the TCP window and stream count a path needs.

The seeds' method: iperf3 for each window and stream count, visited in a shuffled (non-monotonic)
order so that a change in cross traffic during the sweep shows up as scatter rather than as a
false trend; ten pings during each transfer and ten after it (RTT with and without our load);
then the combination reaching ``fraction`` (default 80%) of the best throughput with the fewest
streams — beyond it more streams only cost CPU and loss. A 1-stream run with the system's
default window is measured first: the improvement the tuning brings is relative to it.

The sweep is refused before it starts when it would exceed its limits (total time, streams,
window). Interrupted (Ctrl-C, cancellation) or stopped because the target stopped answering,
it keeps every point measured so far and is marked partial; a partial sweep chooses nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.results import utcnow
from iepm.store import Archive
from iepm.tuned import save_tuned
from iepm.tuning.measure import iperf3_figures, median, ping_figures, transfer_with_pings
from iepm.tuning.plan import (
    DEAD_AFTER_FAILURES,
    SweepLimits,
    SweepPlan,
    check_plan,
    visit_order,
    window_label,
)
from iepm.tuning.plan import DEFAULT_STREAMS as DEFAULT_STREAMS
from iepm.tuning.plan import DEFAULT_WINDOWS as DEFAULT_WINDOWS
from iepm.tuning.plan import StudyRefused as StudyRefused
from iepm.tuning.plan import parse_window as parse_window
from iepm.tuning.store import Study, StudyRecorder

KIND = "sweep"


def choose(points: list[dict[str, Any]], fraction: float) -> dict[str, Any]:
    """The seeds' rule: fewest streams reaching ``fraction`` of the best throughput (ties: the
    higher throughput). Returns ``{"best", "chosen", "threshold_bps"}`` (points or None)."""
    ok = [p for p in points if p.get("succeeded") and p.get("throughput_bps")]
    if not ok:
        return {"best": None, "chosen": None, "threshold_bps": None}
    best = max(ok, key=lambda p: p["throughput_bps"])
    threshold = fraction * best["throughput_bps"]
    candidates = [p for p in ok if p["throughput_bps"] >= threshold]
    chosen = min(candidates, key=lambda p: (p["streams"], -p["throughput_bps"]))
    return {"best": best, "chosen": chosen, "threshold_bps": threshold}


def summarise(points: list[dict[str, Any]], plan: SweepPlan) -> dict[str, Any]:
    pick = choose(points, plan.fraction)
    baseline = next((p for p in points if p.get("baseline")), None)
    base_bps = baseline.get("throughput_bps") if baseline else None

    def brief(p: dict[str, Any] | None) -> dict[str, Any] | None:
        if p is None:
            return None
        keys = ("window", "window_bytes", "streams", "throughput_bps", "retransmits", "order")
        return {k: p.get(k) for k in keys} | {
            "rtt_loaded_median_ms": p.get("rtt_during_median_ms"),
            "iperf3_result_id": p.get("iperf3_result_id"),
        }

    chosen, best = pick["chosen"], pick["best"]
    unloaded = [v for p in points for v in p.get("rtt_after_ms") or []]
    loaded = [v for p in points for v in p.get("rtt_during_ms") or []]
    summary: dict[str, Any] = {
        "points_planned": plan.n_points(),
        "points_measured": len(points),
        "points_failed": sum(1 for p in points if not p.get("succeeded")),
        "fraction": plan.fraction,
        "threshold_bps": pick["threshold_bps"],
        "best": brief(best),
        "chosen": brief(chosen),
        "baseline": brief(baseline),
        "improvement": None,
        "improvement_best": None,
        "chosen_fraction_of_best": None,
        "rtt_unloaded_median_ms": median(unloaded),
        "rtt_loaded_median_ms": median(loaded),
    }
    if chosen and best:
        summary["chosen_fraction_of_best"] = chosen["throughput_bps"] / best["throughput_bps"]
    if chosen and base_bps:
        summary["improvement"] = chosen["throughput_bps"] / base_bps
        summary["improvement_best"] = best["throughput_bps"] / base_bps if best else None
    return summary


def tuned_params(chosen: dict[str, Any]) -> dict[str, Any]:
    """What the scheduler should use: the chosen window (None: the system default) and streams."""
    return {"window": chosen["window"], "streams": chosen["streams"]}


ProgressCallback = Callable[[dict[str, Any], int, int], None]


async def run_sweep(
    archive: Archive,
    ctx: ProbeContext,
    plan: SweepPlan,
    *,
    base: iperf3.Spec | None = None,
    limits: SweepLimits | None = None,
    save: bool = True,
    on_point: ProgressCallback | None = None,
    extra_params: dict[str, Any] | None = None,
) -> Study:
    """Measure the sweep, store it (point by point) and, if it completed, the tuned parameters.

    ``base`` carries the target's other iperf3 settings (port, congestion…); its window,
    streams and duration are replaced point by point. Cancellation (Ctrl-C) stops the sweep,
    finishes the study as partial and re-raises.
    """
    base = base or iperf3.Spec()
    limits = limits or SweepLimits()
    check_plan(plan, limits, base)
    params = {
        "plan": asdict(plan),
        "limits": asdict(limits),
        "base_spec": base.model_dump(mode="json"),
        "address": ctx.address,
        "estimate_s": plan.estimate_s(),
        **(extra_params or {}),
    }
    recorder = StudyRecorder(archive, Study(KIND, ctx.monitor, ctx.target, params))
    todo: list[tuple[str | None, int, bool]] = [(w, n, False) for w, n in visit_order(plan)]
    if plan.baseline:
        todo.insert(0, (None, 1, True))
    stop_reason: str | None = None
    failures = 0
    try:
        for order, (window, streams, is_baseline) in enumerate(todo):
            spec = base.model_copy(
                update={"window": window, "streams": streams, "duration_s": float(plan.duration_s)}
            )
            started = utcnow()
            transfer = await transfer_with_pings(
                spec,
                ctx,
                pings_during=plan.pings_during,
                pings_after=plan.pings_after,
                after_interval_s=plan.after_interval_s,
            )
            for result in (transfer.iperf3, transfer.ping_during, transfer.ping_after):
                recorder.store_result(result)
            point = {
                "order": order,
                "baseline": is_baseline,
                "window": window,
                "window_label": window_label(window),
                "window_bytes": spec.window_bytes,
                "streams": streams,
                "duration_s": plan.duration_s,
                "started_at": started.isoformat(),
                **iperf3_figures(transfer.iperf3),
                **ping_figures("during", transfer.ping_during),
                **ping_figures("after", transfer.ping_after),
            }
            recorder.add_point(point)
            if on_point is not None:
                on_point(point, order + 1, len(todo))
            failures = 0 if point["succeeded"] else failures + 1
            if failures >= DEAD_AFTER_FAILURES:
                stop_reason = (
                    f"stopped after {order + 1} of {len(todo)} points: the last {failures} "
                    f"transfers failed, the target seems to have stopped answering "
                    f"({transfer.iperf3.error})"
                )
                break
    except (asyncio.CancelledError, KeyboardInterrupt):
        measured = len(recorder.study.points)
        _finish(recorder, plan, f"interrupted after {measured} of {len(todo)} points", save)
        raise
    return _finish(recorder, plan, stop_reason, save)


def _finish(recorder: StudyRecorder, plan: SweepPlan, stop_reason: str | None, save: bool) -> Study:
    study = recorder.study
    summary = summarise(study.points, plan)
    partial = stop_reason is not None
    summary["partial_reason"] = stop_reason
    summary["tuned_saved"] = False
    chosen = summary["chosen"]
    if partial:
        summary["note"] = "partial sweep: nothing chosen for the scheduler"
    elif chosen is not None and save:
        summary["tuned"] = tuned_params(chosen)
        save_tuned(
            recorder.archive,
            monitor=study.monitor,
            target=study.target,
            probe="iperf3",
            params=summary["tuned"],
            study_id=study.id,
        )
        summary["tuned_saved"] = True
    return recorder.finish(summary, partial=partial)


def table_rows(points: list[dict[str, Any]]) -> tuple[list[str], list[int], dict[Any, Any]]:
    """Windows (in sweep order of size), stream counts and ``{(window, streams): point}`` of the
    successful grid points (the baseline is shown separately)."""
    grid = [p for p in points if not p.get("baseline")]
    windows = sorted(
        {p["window_label"] for p in grid},
        key=lambda w: -1 if w == "default" else iperf3.size_bytes(w, base=1024),
    )
    streams = sorted({int(p["streams"]) for p in grid})
    cells = {(p["window_label"], int(p["streams"])): p for p in grid}
    return windows, streams, cells

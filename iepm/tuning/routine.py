"""Re-tuning as a routine mode of the scheduler (``[monitor] retune = true``).

Before a path's scheduled bandwidth test (the probe a sweep tunes, :data:`PROBE`), the scheduler
asks :func:`decide` whether the path needs a new sweep (:func:`iepm.tuning.retune.retune_reasons`:
never tuned, tuned too long ago, a step change or a route change since) and whether the budget
allows one now; if so it runs :func:`run` — the same sweep as ``iepm tune`` — in the probe's
exclusive slot, under its host lease, and the run that follows uses the parameters it stored.

What the scheduler decides is read from the archive, so it holds across restarts: its sweeps are
studies whose ``params.retune`` says ``by: scheduler`` and why they ran (``reasons``). The budget:
at most ``retune_per_cycle`` sweeps per cycle and none within ``retune_gap_h`` of the monitor's
last scheduled sweep. A sweep that fails (refused, partial, or an error) is stored as a partial
study with its reason, and that path waits ``retune_backoff_h`` × 2^(failures in a row − 1)
(at most ``retune_after_days``) before it is tried again: never a retry loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from iepm.config import MonitorConfig
from iepm.errors import IepmError
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext, ProbeSpec
from iepm.results import utcnow
from iepm.store import Archive
from iepm.tuning.plan import SweepLimits, SweepPlan
from iepm.tuning.retune import latest_route, retune_reasons
from iepm.tuning.store import Study, StudyRecorder, list_studies, save_study
from iepm.tuning.sweep import KIND, run_sweep

log = logging.getLogger(__name__)
T = TypeVar("T")

# The probe whose parameters a sweep chooses: the scheduler re-tunes before its runs.
PROBE = iperf3.NAME
BY = "scheduler"
# A sweep's deadline beyond its own estimate (a busy host, servers started over SSH).
DEADLINE_FACTOR = 1.5
DEADLINE_SLACK_S = 60.0
# The monitor's latest sweeps the budget and back-off look at.
LOOK_BACK = 200


@dataclass(frozen=True)
class Policy:
    """When and how much the scheduler may sweep (from ``[monitor] retune_*``)."""

    after_s: float
    per_cycle: int
    gap_s: float
    backoff_s: float
    plan: SweepPlan
    limits: SweepLimits

    @classmethod
    def of(cls, monitor: MonitorConfig) -> Policy:
        return cls(
            after_s=monitor.retune_after_days * 86400.0,
            per_cycle=monitor.retune_per_cycle,
            gap_s=monitor.retune_gap_h * 3600.0,
            backoff_s=monitor.retune_backoff_h * 3600.0,
            plan=monitor.retune_plan(),
            limits=SweepLimits(max_total_s=monitor.retune_max_total_s),
        )

    def deadline_s(self) -> float:
        return self.plan.estimate_s() * DEADLINE_FACTOR + DEADLINE_SLACK_S


@dataclass(frozen=True)
class Decision:
    """``reasons``: why the path needs a sweep (empty: it does not); ``wait``: why not now
    (budget or back-off), None when the sweep may run now."""

    target: str
    reasons: list[str]
    wait: str | None = None

    @property
    def run(self) -> bool:
        return bool(self.reasons) and self.wait is None


def scheduled(study: Study) -> bool:
    """Whether the scheduler ran this sweep (not ``iepm tune``)."""
    retune = study.params.get("retune")
    return isinstance(retune, dict) and retune.get("by") == BY


def decide(
    archive: Archive,
    policy: Policy,
    *,
    monitor: str,
    target: str,
    swept_this_cycle: int,
    now: datetime | None = None,
) -> Decision:
    """Whether the scheduler sweeps ``target`` now (reads the archive: call it off the loop)."""
    now = now or utcnow()
    reasons = retune_reasons(
        archive, monitor=monitor, target=target, period_s=policy.after_s, now=now
    )
    if not reasons:
        return Decision(target, [])
    if swept_this_cycle >= policy.per_cycle:
        return Decision(
            target, reasons, f"budget: {swept_this_cycle} sweep(s) this cycle already "
            f"(retune_per_cycle = {policy.per_cycle})"
        )  # fmt: skip
    mine = [
        s
        for s in list_studies(archive, kind=KIND, monitor=monitor, limit=LOOK_BACK)
        if scheduled(s)
    ]
    if mine and policy.gap_s > 0 and now - mine[0].started_at < timedelta(seconds=policy.gap_s):
        return Decision(
            target, reasons, f"budget: last scheduled sweep ({mine[0].target}) at "
            f"{mine[0].started_at:%Y-%m-%d %H:%M:%S}Z, less than retune_gap_h = "
            f"{policy.gap_s / 3600:g} h ago"
        )  # fmt: skip
    failed: list[Study] = []
    for study in (s for s in mine if s.target == target):
        if not study.partial:
            break
        failed.append(study)
    if failed:
        wait_s = min(policy.backoff_s * 2 ** (len(failed) - 1), policy.after_s)
        until = failed[0].started_at + timedelta(seconds=wait_s)
        if now < until:
            last = failed[0].summary.get("partial_reason")
            wait = (
                f"back-off: {len(failed)} failed sweep(s) in a row (the last: {last}); "
                f"next try after {until:%Y-%m-%d %H:%M:%S}Z"
            )
            return Decision(target, reasons, wait)
    return Decision(target, reasons)


def failure_reason(study: Study | None) -> str | None:
    """Why a scheduled sweep gave no tuned parameters (None: it stored them)."""
    if study is None:
        return "no study"
    if study.partial:
        return str(study.summary.get("partial_reason") or "partial")
    if not study.summary.get("tuned_saved"):
        return "no combination succeeded: nothing chosen"
    return None


async def run(
    archive: Archive,
    ctx: ProbeContext,
    policy: Policy,
    reasons: list[str],
    *,
    base: ProbeSpec,
) -> Study:
    """The sweep of ``ctx.target`` with ``reasons`` recorded; on success its choice is the
    path's tuned parameters. Failures are data: a refused, failed or overrun sweep is returned
    (and stored) as a partial study with its reason; only cancellation propagates."""
    if not isinstance(base, iperf3.Spec):
        raise TypeError(f"a sweep tunes {PROBE}, not {type(base).__module__}")
    marker = {"by": BY, "reasons": reasons}
    started = utcnow()
    try:
        route = latest_route(archive, ctx.target)
        extra = {"route": route, "retune": marker}
        return await asyncio.wait_for(
            run_sweep(
                archive, ctx, policy.plan, base=base, limits=policy.limits, extra_params=extra
            ),
            policy.deadline_s(),
        )
    except TimeoutError:
        reason = f"the sweep overran its deadline of {policy.deadline_s():.0f} s and was stopped"
        log.error("re-tuning %s failed: %s", ctx.target, reason)
        stopped = _own_study(archive, ctx, started)
        if stopped is not None:  # its study, kept partial by the sweep: say why it stopped
            stopped.summary["partial_reason"] = (
                f"{reason} ({stopped.summary.get('partial_reason')})"
            )
            save_study(archive, stopped)
            return stopped
    except IepmError as exc:  # refused before it started, or the archive failed mid-way
        reason = str(exc)
        log.error("re-tuning %s failed: %s", ctx.target, reason)
    except Exception as exc:  # a bug: recorded, so the back-off applies rather than a loop
        reason = f"internal error: {type(exc).__name__}: {exc}"
        log.exception("re-tuning %s failed", ctx.target)
    return _failed(archive, ctx, policy, base, marker, reason)


def _own_study(archive: Archive, ctx: ProbeContext, started: datetime) -> Study | None:
    latest = list_studies(archive, kind=KIND, target=ctx.target, monitor=ctx.monitor, limit=1)
    if latest and scheduled(latest[0]) and latest[0].started_at >= started:
        return latest[0]
    return None


def _failed(
    archive: Archive,
    ctx: ProbeContext,
    policy: Policy,
    base: iperf3.Spec,
    marker: dict[str, Any],
    reason: str,
) -> Study:
    """A partial study standing for a sweep that failed as a whole (so back-off sees it); an
    overrun sweep's own study (partial, "interrupted") stays beside it."""
    params = {
        "plan": asdict(policy.plan),
        "limits": asdict(policy.limits),
        "base_spec": base.model_dump(mode="json"),
        "address": ctx.address,
        "retune": marker,
    }
    recorder = StudyRecorder(archive, Study(KIND, ctx.monitor, ctx.target, params))
    summary = {"partial_reason": reason, "tuned_saved": False, "note": "failed scheduled sweep"}
    return recorder.finish(summary, partial=True)


async def off_loop(make: Callable[[], Awaitable[T]]) -> T:
    """Await ``make()`` run on an event loop of its own in a worker thread: the sweep writes its
    study point by point, and those archive calls must not hold up the scheduler's loop (light
    probes, live samples). Cancelling the caller cancels the sweep there (it stores what it
    measured, marked partial) and waits for it to finish."""
    started = threading.Event()
    stop = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> T:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        if stop.is_set():
            raise asyncio.CancelledError
        return await make()

    done = asyncio.ensure_future(asyncio.to_thread(asyncio.run, main()))
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        stop.set()
        if started.is_set():
            box["loop"].call_soon_threadsafe(box["task"].cancel)
        with contextlib.suppress(BaseException):
            await done
        raise

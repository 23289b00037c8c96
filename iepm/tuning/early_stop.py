"""Adaptive early stop as a study: an early-stopped iperf3 test and the full test it replaces.

The detector, the TCP_INFO sampling and the early-stopped run itself live in the probes layer
(:mod:`iepm.probes.convergence`, ``iperf3.run_early``): scheduled iperf3 uses them as a routine
mode (``early_stop = true``). This module keeps the study around it — ``adaptive_run`` (one
test, stopped or in ``shadow`` mode run to its end while recording when it would have stopped)
and ``run_early_stop_study`` — and re-exports the detector's names for its callers.

The stopped run is a successful iperf3 result marked ``early_stopped`` whose ``throughput_bps``
is the full test's estimate; ``benchmarks/early_stop.py`` measures both modes.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from iepm.errors import ConfigError
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext
from iepm.probes.convergence import (
    DATA_START_BYTES,
    Decision,
    Detector,
    EarlyStopConfig,
    Sample,
    parse_ss,
)
from iepm.results import Result
from iepm.store import Archive
from iepm.tuning.measure import iperf3_figures
from iepm.tuning.store import Study, StudyRecorder

__all__ = [
    "DATA_START_BYTES",
    "KIND",
    "Decision",
    "Detector",
    "EarlyStopConfig",
    "EarlyStopRun",
    "Sample",
    "adaptive_run",
    "parse_ss",
    "run_early_stop_study",
]

KIND = "early_stop"


@dataclass
class EarlyStopRun:
    result: Result
    decision: Decision | None
    stopped_early: bool
    samples: list[Sample] = field(default_factory=list)
    final_acked_bytes: int | None = None

    @property
    def reported_bps(self) -> float | None:
        """What this run reports: the early estimate, or iperf3's figure when it ran out."""
        if self.stopped_early and self.decision is not None:
            return self.decision.estimate_bps
        value = self.result.data.get("throughput_bps")
        return float(value) if value else None

    def as_json(self) -> dict[str, Any]:
        return {
            "stopped_early": self.stopped_early,
            "decision": asdict(self.decision) if self.decision else None,
            "reported_bps": self.reported_bps,
            "iperf3_result_id": self.result.id,
            "iperf3_outcome": self.result.outcome.value,
            "iperf3_throughput_bps": self.result.data.get("throughput_bps"),
            "iperf3_sender_throughput_bps": self.result.data.get("sender_throughput_bps"),
            "measured_throughput_bps": self.result.data.get("measured_throughput_bps"),
            "bytes_saved": self.result.data.get("bytes_saved"),
            "bytes_sent": self.result.data.get("bytes_sent"),
            "final_acked_bytes": self.final_acked_bytes,
            "samples": len(self.samples),
        }


async def adaptive_run(
    spec: iperf3.Spec,
    ctx: ProbeContext,
    cfg: EarlyStopConfig | None = None,
    *,
    shadow: bool = False,
) -> EarlyStopRun:
    """One iperf3 test that stops itself once its result is known (or, ``shadow``, runs to the
    end and records when it would have stopped)."""
    cfg = cfg or EarlyStopConfig()
    if spec.udp or spec.reverse:
        raise ConfigError("adaptive early stop needs a TCP test sent by this host (no udp/reverse)")
    spec = spec.model_copy(
        update={"duration_s": float(cfg.full_duration_s), "early_stop": not shadow, "omit_s": 0}
    )
    result, detail = await iperf3.run_early(spec, ctx, cfg, shadow=shadow)
    final = result.data.get("bytes_received") or result.data.get("bytes_sent")
    return EarlyStopRun(
        result=result,
        decision=detail.decision if detail else None,
        stopped_early=bool(result.data.get("early_stopped")),
        samples=detail.samples if detail else [],
        final_acked_bytes=int(final) if final else None,
    )


async def run_early_stop_study(
    archive: Archive,
    ctx: ProbeContext,
    base: iperf3.Spec,
    cfg: EarlyStopConfig | None = None,
    *,
    compare: bool = True,
) -> Study:
    """An early-stopped test, and (``compare``) the full test it replaces, stored as a study."""
    cfg = cfg or EarlyStopConfig()
    params = {"config": asdict(cfg), "base_spec": base.model_dump(mode="json"), "compare": compare}
    recorder = StudyRecorder(archive, Study(KIND, ctx.monitor, ctx.target, params))
    try:
        early = await adaptive_run(base, ctx, cfg)
        recorder.store_result(early.result)
        recorder.add_point({"run": "early_stop", **early.as_json()})
        full = None
        if compare:
            full = await iperf3.run(
                base.model_copy(update={"duration_s": float(cfg.full_duration_s)}), ctx
            )
            recorder.store_result(full)
            recorder.add_point({"run": "full", **iperf3_figures(full)})
    except (asyncio.CancelledError, KeyboardInterrupt):
        recorder.finish({"partial_reason": "interrupted"}, partial=True)
        raise
    d = early.decision
    early_bytes = early.result.data.get("bytes_sent")
    summary: dict[str, Any] = {
        "stopped_early": early.stopped_early,
        "stopped_after_s": d.t_stop_s if d and early.stopped_early else None,
        "slow_start_end_s": d.slow_start_end_s if d else None,
        "slow_start_by": d.slow_start_by if d else None,
        "early_bps": early.reported_bps,
        "early_bytes": early_bytes,
        "full_bps": None,
        "full_bytes": None,
        "difference": None,
        "traffic_share": None,
        "partial_reason": None,
    }
    if full is not None and full.succeeded:
        full_bps = full.data.get("throughput_bps")
        full_bytes = full.data.get("bytes_sent")
        summary.update(full_bps=full_bps, full_bytes=full_bytes)
        if full_bps and early.reported_bps:
            summary["difference"] = early.reported_bps / full_bps - 1
        if full_bytes and early_bytes:
            summary["traffic_share"] = early_bytes / full_bytes
    return recorder.finish(summary, partial=False)

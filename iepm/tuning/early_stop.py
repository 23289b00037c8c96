"""Adaptive early stop: end an iperf3 test once slow start is over and throughput is stable.

While iperf3 runs (as the probe builds it, with the full duration), the sender's TCP_INFO —
the kernel's successor of Web100 — is sampled with ``ss -ti`` in the sender's namespace every
``sample_s``: bytes acknowledged, smoothed RTT, cwnd, and whether ``ssthresh`` is set (it is
once the connection has left slow start: HyStart or a loss). The detector then

1. marks the end of slow start when ``ssthresh`` appears, or when the rate over the last window
   (``W = max(min_window_s, rtts_per_window × RTT)``) grew by less than 10% over the window
   before (window-limited flows never set ``ssthresh``);
2. stops once the latest ``windows`` consecutive windows after that agree within ``tolerance``
   (spread ÷ mean) and the rest of the estimate is known well enough: the standard error of
   their mean rate, times the time left, is at most ``uncertainty_tolerance`` of the
   estimated total, and so is the drift their least-squares slope would add if it went on
   (``trend_tolerance``; after slow start the rate often keeps creeping up on long paths as
   the receive window autotunes: stopping then, or averaging since slow start, reads low);
3. reports what the full test would have said: the bytes so far plus the mean rate of those
   latest windows for the rest of the full duration, divided by the full duration plus one
   RTT (iperf3's receiver clock). The clock starts when the data connection's first bytes
   are acknowledged, not the control connection's (seconds earlier on long paths).

iperf3 is stopped with SIGINT, so it still prints its report (marked interrupted: the stored
result says so); the traffic saved is the untransmitted rest. ``shadow`` mode lets the test run
to its end while recording when it would have stopped — the estimator's accuracy on the same
transfer (``benchmarks/early_stop.py`` uses both).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import signal
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from iepm.errors import ConfigError
from iepm.probes import iperf3
from iepm.probes.base import ProbeContext, result_from_raw
from iepm.results import Result
from iepm.runner import RawRun, run_command, start_process, tool_version
from iepm.store import Archive
from iepm.tuning.measure import iperf3_figures
from iepm.tuning.store import Study, StudyRecorder

KIND = "early_stop"
SS_TIMEOUT_S = 2.0
DATA_START_BYTES = 4096  # more than iperf3's control exchange, less than TCP's first flight
_TOKEN_RE = re.compile(r"(\w+):(\S+)")


@dataclass(frozen=True)
class EarlyStopConfig:
    full_duration_s: int = 10
    sample_s: float = 0.2
    # Chosen by replaying recorded series from the "tune" path set of benchmarks/early_stop.py
    # (other paths and lab seed than the "report" set its figures come from).
    tolerance: float = 1.0
    windows: int = 5
    uncertainty_tolerance: float = 0.1
    trend_tolerance: float = 0.08
    min_window_s: float = 0.25
    rtts_per_window: float = 2.0
    growth_plateau: float = 0.10


@dataclass
class Sample:
    t: float  # seconds since iperf3 started
    acked_bytes: int
    srtt_ms: float | None
    cwnd: int | None
    ssthresh_seen: bool
    retrans: int


@dataclass
class Decision:
    t_stop_s: float  # since the first data was acknowledged
    slow_start_end_s: float
    slow_start_by: str
    steady_bps: float
    estimate_bps: float
    acked_bytes: int


def parse_ss(text: str) -> list[dict[str, Any]]:
    """``ss -tinH`` output → one dict per connection (acked bytes, RTT, cwnd, ssthresh…)."""
    conns: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # the socket line; its TCP_INFO follows, indented
            conns.append({"socket": line.split()})
            continue
        if not conns:
            continue
        info = conns[-1]
        for key, value in _TOKEN_RE.findall(line):
            if key == "rtt":
                with contextlib.suppress(ValueError):
                    info["srtt_ms"] = float(value.split("/")[0])
            elif key in ("bytes_acked", "bytes_sent", "bytes_retrans", "cwnd", "ssthresh"):
                with contextlib.suppress(ValueError):
                    info[key] = int(value)
            elif key == "retrans":
                with contextlib.suppress(ValueError, IndexError):
                    info["retrans_total"] = int(value.split("/")[1])
    return conns


def _slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` against their index."""
    n = len(values)
    if n < 2:
        return 0.0
    x_mean, y_mean = (n - 1) / 2, sum(values) / n
    num = sum((i - x_mean) * (v - y_mean) for i, v in enumerate(values))
    return num / sum((i - x_mean) ** 2 for i in range(n))


class Detector:
    """Pure decision logic over samples (unit tested on recorded series)."""

    def __init__(self, cfg: EarlyStopConfig) -> None:
        self.cfg = cfg
        self.samples: list[Sample] = []
        self.t0: float | None = None
        self.slow_start_end: float | None = None
        self.slow_start_by = ""
        self.decision: Decision | None = None

    def _acked_at(self, t: float) -> float:
        """Acknowledged bytes at time ``t``, linearly interpolated between samples."""
        s = self.samples
        if t <= s[0].t:
            return float(s[0].acked_bytes)
        for a, b in itertools.pairwise(s):
            if a.t <= t <= b.t:
                if b.t == a.t:
                    return float(b.acked_bytes)
                return a.acked_bytes + (b.acked_bytes - a.acked_bytes) * (t - a.t) / (b.t - a.t)
        return float(s[-1].acked_bytes)

    def _rate(self, t1: float, t2: float) -> float:
        return (self._acked_at(t2) - self._acked_at(t1)) * 8 / (t2 - t1) if t2 > t1 else 0.0

    def _min_rtt_s(self) -> float:
        return min((s.srtt_ms for s in self.samples if s.srtt_ms), default=0.0) / 1000

    def window_s(self) -> float:
        srtt = next((s.srtt_ms for s in reversed(self.samples) if s.srtt_ms), None)
        rtt_s = (srtt or 0.0) / 1000
        return max(self.cfg.min_window_s, self.cfg.rtts_per_window * rtt_s)

    def add(self, sample: Sample) -> Decision | None:
        if self.decision is not None:
            return self.decision
        if self.t0 is None:
            # The control connection acknowledges a few hundred bytes (and, on long paths,
            # seconds) before the test's data flows; the full-duration clock starts with data.
            if sample.acked_bytes <= DATA_START_BYTES:
                return None
            # Data began somewhere in the last sampling interval: take its middle.
            prev_t = self.samples[-1].t if self.samples else sample.t - self.cfg.sample_s
            self.t0 = (prev_t + sample.t) / 2
            self.samples = [Sample(self.t0, 0, None, None, False, 0)]
        if sample.acked_bytes < self.samples[-1].acked_bytes:
            return None  # the connection is gone (test over): not a rate
        self.samples.append(sample)
        t = sample.t
        w = self.window_s()
        if self.slow_start_end is None:
            if sample.ssthresh_seen:
                self.slow_start_end, self.slow_start_by = t, "ssthresh set (left slow start)"
            elif t - self.t0 >= 2 * w:
                now, before = self._rate(t - w, t), self._rate(t - 2 * w, t - w)
                if before > 0 and now < (1 + self.cfg.growth_plateau) * before:
                    self.slow_start_end, self.slow_start_by = t, "rate stopped growing"
            return None
        n = max(2, self.cfg.windows)
        if t - self.slow_start_end < n * w:
            return None
        rates = [self._rate(t - (n - i) * w, t - (n - i - 1) * w) for i in range(n)]
        steady = sum(rates) / n
        if steady <= 0 or (max(rates) - min(rates)) / steady > self.cfg.tolerance:
            return None
        elapsed = t - self.t0
        full = self.cfg.full_duration_s
        remaining = max(0.0, full - elapsed)
        total_bits = sample.acked_bytes * 8 + steady * remaining
        # How wrong the rest of the estimate may be: the standard error of the windows' mean
        # (the lab's and real paths' rates are bursty), plus the drift if the trend went on —
        # the mean belongs to the middle of the span, n·w/2 ago, and the rest of the test
        # would average slope × (n·w/2 + remaining/2) more.
        sd = statistics.stdev(rates)
        drift_bps = abs(_slope(rates)) / w * (n * w / 2 + remaining / 2)
        if sd / n**0.5 * remaining > self.cfg.uncertainty_tolerance * total_bits:
            return None
        if drift_bps * remaining > self.cfg.trend_tolerance * total_bits:
            return None
        self.decision = Decision(
            t_stop_s=round(elapsed, 3),
            slow_start_end_s=round(self.slow_start_end - self.t0, 3),
            slow_start_by=self.slow_start_by,
            steady_bps=steady,
            # iperf3's receiver divides by its own clock, about one RTT longer than the test.
            estimate_bps=total_bits / (full + self._min_rtt_s()),
            acked_bytes=sample.acked_bytes,
        )
        return self.decision


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
            "bytes_sent": self.result.data.get("bytes_sent"),
            "final_acked_bytes": self.final_acked_bytes,
            "samples": len(self.samples),
        }


def _ss_argv(ctx: ProbeContext, port: int) -> list[str]:
    return ctx.wrap(
        ["ss", "-tinH", "state", "established", "dst", ctx.address, "dport", "=", f":{port}"]
    )


async def sample_tcp_info(ctx: ProbeContext, port: int, t: float) -> Sample:
    raw = await run_command(_ss_argv(ctx, port), SS_TIMEOUT_S)
    conns = parse_ss(raw.stdout)
    srtts = [c["srtt_ms"] for c in conns if c.get("srtt_ms") and c.get("bytes_acked", 0) > 0]
    cwnds = [c["cwnd"] for c in conns if c.get("cwnd")]
    return Sample(
        t=t,
        acked_bytes=sum(int(c.get("bytes_acked", 0)) for c in conns),
        srtt_ms=max(srtts) if srtts else None,
        cwnd=sum(cwnds) if cwnds else None,
        # The control connection never leaves slow start; a data connection that has counts.
        ssthresh_seen=any("ssthresh" in c and c.get("bytes_acked", 0) > 65536 for c in conns),
        retrans=sum(int(c.get("retrans_total", 0)) for c in conns),
    )


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
    spec = spec.model_copy(update={"duration_s": float(cfg.full_duration_s)})
    version = await tool_version(ctx.wrap(iperf3.META.version_argv or ()))
    argv = ctx.wrap(iperf3.build_argv(spec, ctx.address))
    tool = await start_process(argv)
    proc = tool.process
    t_start = tool.t0
    readers = asyncio.gather(proc.stdout.read(), proc.stderr.read())  # type: ignore[union-attr]
    detector = Detector(cfg)
    samples: list[Sample] = []
    stopped = False
    timed_out = False
    deadline = t_start + spec.deadline_s()
    try:
        while proc.returncode is None and time.monotonic() < deadline:
            t_next = time.monotonic() + cfg.sample_s
            sample = await sample_tcp_info(ctx, spec.port, time.monotonic() - t_start)
            if proc.returncode is not None:
                break
            samples.append(sample)
            decision = detector.add(sample)
            if decision is not None and not shadow and not stopped:
                tool.signal(signal.SIGINT)  # iperf3 still prints its (interrupted) report
                stopped = True
                break
            await tool.wait(max(0.0, t_next - time.monotonic()))
        if await tool.wait(max(1.0, deadline - time.monotonic())) is None:
            timed_out = True
            await tool.terminate()
    finally:
        await tool.stop(grace_s=0.0)  # the tool has ended or been told to: sweep its group
    out, err = await asyncio.wait_for(readers, 5.0)
    raw = RawRun(
        argv=tuple(argv),
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        returncode=proc.returncode,
        timed_out=timed_out,
        started_at=tool.started_at,
        duration_s=time.monotonic() - t_start,
        pid=proc.pid,
    )
    if ctx.raw_log is not None:
        ctx.raw_log.append(ctx.target, iperf3.NAME, raw, params=spec.model_dump(mode="json"))
    result = result_from_raw(iperf3, spec, ctx, raw, version)
    final = result.data.get("bytes_received") or result.data.get("bytes_sent")
    return EarlyStopRun(
        result=result,
        decision=detector.decision,
        stopped_early=stopped,
        samples=samples,
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

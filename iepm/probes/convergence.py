"""Convergence of a TCP transfer: stop a test once its result is known (iperf3's early stop).

While the tool runs (with its full duration), the sender's TCP_INFO — the kernel's successor of
Web100 — is sampled with ``ss -tinH`` in the sender's namespace every ``sample_s``: bytes
acknowledged, smoothed RTT, cwnd, and whether ``ssthresh`` is set (it is once the connection
has left slow start: HyStart or a loss). :class:`Detector` then

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

:func:`run_converging` runs a probe's tool through the one supervisor (``runner``), samples,
and sends SIGINT at the decision (iperf3 still prints its report). The samples are what the
estimate is made of and iperf3's report does not contain them (its per-interval bytes are
bytes *written*, which include the send buffer: up to several MB, 5% of a 10 s test at
50 Mbit/s), so they are appended to the raw record's stdout after the tool's own output, as one
line ``% iepm-convergence {json}`` naming the sampler (:func:`samples_line`). ``parse()``
replays them through the detector (:func:`replay`): pure, and ``iepm extract`` reproduces the
estimate from the raw log. This module knows no probe: the probe passes in its command and
the sampler's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import signal
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from iepm.errors import ToolNotFound
from iepm.runner import RawRun, new_token, run_command, start_process

SS_TIMEOUT_S = 2.0
DATA_START_BYTES = 4096  # more than iperf3's control exchange, less than TCP's first flight
SAMPLES_PREFIX = "% iepm-convergence "
SAMPLER = "ss -tinH (sender's TCP_INFO)"
# How long the tool has, after SIGINT, to print its report before the deadline kill.
REPORT_WAIT_S = 5.0
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

    @classmethod
    def from_json(cls, value: Any) -> EarlyStopConfig:
        """The config a raw record names (unknown keys ignored, missing ones default)."""
        known = {f.name for f in fields(cls)}
        items = value.items() if isinstance(value, dict) else ()
        return cls(**{k: v for k, v in items if k in known and isinstance(v, int | float)})


@dataclass
class Sample:
    t: float  # seconds since the tool started
    acked_bytes: int
    srtt_ms: float | None
    cwnd: int | None
    ssthresh_seen: bool
    retrans: int

    def row(self) -> list[Any]:
        return [round(self.t, 4), self.acked_bytes, self.srtt_ms, self.cwnd,
                int(self.ssthresh_seen), self.retrans]  # fmt: skip

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Sample:
        t, acked, srtt, cwnd, ssthresh, retrans = row
        return cls(float(t), int(acked), srtt, cwnd, bool(ssthresh), int(retrans))


@dataclass
class Decision:
    t_stop_s: float  # since the first data was acknowledged
    slow_start_end_s: float
    slow_start_by: str
    steady_bps: float
    estimate_bps: float
    acked_bytes: int

    def full_bytes(self, full_duration_s: float) -> int:
        """Bytes the full test would have carried: so far, plus the steady rate for the rest."""
        return int(
            self.acked_bytes + self.steady_bps * max(0.0, full_duration_s - self.t_stop_s) / 8
        )


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


def replay(cfg: EarlyStopConfig, samples: Sequence[Sample]) -> Decision | None:
    """The detector's decision over a recorded series (what ``parse()`` uses)."""
    detector = Detector(cfg)
    for sample in samples:
        if detector.add(sample) is not None:
            break
    return detector.decision


# --- the record kept beside the tool's output -------------------------------------------------


@dataclass(frozen=True)
class Convergence:
    """What the sampler recorded during one run: its config, samples, and when the tool was
    sent SIGINT (None: it ran to its end, or shadow mode)."""

    cfg: EarlyStopConfig
    samples: list[Sample]
    stop_signal_s: float | None
    shadow: bool = False
    sampler_error: str | None = None


def samples_line(conv: Convergence) -> str:
    body = {
        "sampler": SAMPLER,
        "config": asdict(conv.cfg),
        "shadow": conv.shadow,
        "stop_signal_s": conv.stop_signal_s,
        "sampler_error": conv.sampler_error,
        "columns": ["t_s", "acked_bytes", "srtt_ms", "cwnd", "ssthresh_seen", "retrans"],
        "samples": [s.row() for s in conv.samples],
    }
    return SAMPLES_PREFIX + json.dumps(body, separators=(",", ":")) + "\n"


def read_samples(stdout: str) -> Convergence | None:
    """The ``% iepm-convergence`` line of a raw record's stdout (the last one), or None.

    Raises ValueError when the line is there but unreadable."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(SAMPLES_PREFIX)), None)
    if line is None:
        return None
    try:
        body = json.loads(line[len(SAMPLES_PREFIX) :])
        samples = [Sample.from_row(row) for row in body["samples"]]
        stop = body.get("stop_signal_s")
        return Convergence(
            EarlyStopConfig.from_json(body.get("config")),
            samples,
            None if stop is None else float(stop),
            bool(body.get("shadow")),
            body.get("sampler_error"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable convergence samples line: {exc}") from None


# --- sampling while the tool runs -------------------------------------------------------------


def ss_argv(wrap: Callable[[Sequence[str]], list[str]], address: str, port: int) -> list[str]:
    return wrap(["ss", "-tinH", "state", "established", "dst", address, "dport", "=", f":{port}"])


async def sample_tcp_info(argv: Sequence[str], t_start: float) -> Sample:
    """One ``ss`` reading, stamped (seconds after ``t_start``) when the call returns, not when
    it was asked for: ``ss`` reads the kernel at the end of its run, and on a busy host starting
    it (through ``ip netns exec``) alone can take a good part of a sampling interval."""
    raw = await run_command(argv, SS_TIMEOUT_S)
    read_at = time.monotonic()
    conns = parse_ss(raw.stdout)
    srtts = [c["srtt_ms"] for c in conns if c.get("srtt_ms") and c.get("bytes_acked", 0) > 0]
    cwnds = [c["cwnd"] for c in conns if c.get("cwnd")]
    sample = Sample(
        t=read_at - t_start,
        acked_bytes=sum(int(c.get("bytes_acked", 0)) for c in conns),
        srtt_ms=max(srtts) if srtts else None,
        cwnd=sum(cwnds) if cwnds else None,
        # The control connection never leaves slow start; a data connection that has counts.
        ssthresh_seen=any("ssthresh" in c and c.get("bytes_acked", 0) > 65536 for c in conns),
        retrans=sum(int(c.get("retrans_total", 0)) for c in conns),
    )
    return sample


@dataclass
class ConvergedRun:
    raw: RawRun  # stdout: the tool's own output, then the samples line
    convergence: Convergence
    decision: Decision | None
    stopped: bool
    samples: list[Sample] = field(default_factory=list)


async def run_converging(
    argv: Sequence[str],
    ss: Sequence[str],
    deadline_s: float,
    cfg: EarlyStopConfig,
    *,
    shadow: bool = False,
) -> ConvergedRun:
    """Run ``argv`` (the whole test) sampling ``ss`` every ``cfg.sample_s``; at the detector's
    decision send SIGINT (not in ``shadow`` mode: it then runs to its end, and the decision
    says when it would have stopped). The tool is killed at ``deadline_s`` like any other."""
    token = new_token()
    tool = await start_process(argv)
    proc = tool.process
    t_start = tool.t0
    readers = asyncio.gather(proc.stdout.read(), proc.stderr.read())  # type: ignore[union-attr]
    detector = Detector(cfg)
    samples: list[Sample] = []
    stop_signal_s: float | None = None
    sampler_error: str | None = None
    timed_out = False
    deadline = t_start + deadline_s
    try:
        while proc.returncode is None and time.monotonic() < deadline:
            t_next = time.monotonic() + cfg.sample_s
            try:
                sample = await sample_tcp_info(ss, t_start)
            except ToolNotFound as exc:
                # No ss: the test runs to its end, and the record says why it did.
                sampler_error = str(exc)
                break
            if proc.returncode is not None:
                break
            samples.append(sample)
            decision = detector.add(sample)
            if decision is not None and not shadow:
                tool.signal(signal.SIGINT)  # iperf3 still prints its (interrupted) report
                stop_signal_s = round(time.monotonic() - t_start, 3)
                break
            await tool.wait(max(0.0, t_next - time.monotonic()))
        if stop_signal_s is not None:
            deadline = min(deadline, time.monotonic() + REPORT_WAIT_S)
        if await tool.wait(max(0.0, deadline - time.monotonic())) is None:
            timed_out = True
            await tool.terminate()
    except asyncio.CancelledError:
        await tool.terminate()
        raise
    finally:
        await tool.sweep()  # the tool has ended or been told to: sweep its group
    try:
        out, err = await asyncio.wait_for(readers, REPORT_WAIT_S)
    except TimeoutError:
        readers.cancel()
        out, err = b"", b"(output not readable after the tool ended)"
    conv = Convergence(cfg, samples, stop_signal_s, shadow, sampler_error)
    stdout = out.decode("utf-8", errors="replace")
    if stdout and not stdout.endswith("\n"):
        stdout += "\n"
    raw = RawRun(
        argv=tuple(argv),
        stdout=stdout + samples_line(conv),
        stderr=err.decode("utf-8", errors="replace"),
        returncode=proc.returncode,
        timed_out=timed_out,
        started_at=tool.started_at,
        duration_s=time.monotonic() - t_start,
        token=token,
        pid=proc.pid,
    )
    return ConvergedRun(raw, conv, detector.decision, stop_signal_s is not None, samples)

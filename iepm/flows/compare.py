"""Active against passive: each active test matched to its own flows, and per host × probe the
error err = (passive − active) / passive and the correlation R, by formula.

A test's flows are those from the monitor to the target's address (reversed for a reverse test)
to the test's server port, starting from just before the test began until a little after: the
test's client ports are not in the Result (iperf3's ``-J`` report has them; the probe does not
keep them yet), so address, server port and time are the key.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from iepm.flows.instances import FORMULAS, Instance, group
from iepm.flows.records import Flow
from iepm.results import Result

# Flows may be stamped a little before the test's recorded start (the exporter's clock is not
# ours) and their start lags it by the connection set-up: candidates start in this span...
BEFORE_S = 2.0
AFTER_S = 5.0
# ...and one test's streams all open within this of each other (iperf3 on a short path: a few
# ms), so tests run back to back stay apart. On a long path a test's streams open one round trip
# after another (iperf3 connects them in turn after its control exchange), so the window grows to
# that span (see _stream_span_s), never beyond half the test's own duration: the next test
# cannot start before this one ends.
TEST_WINDOW_S = 1.0
SET_UP_ROUND_TRIPS = 3  # control connection, parameter exchange, start: before the first stream
# A lost SYN (or set-up segment) waits TCP's initial retransmission timeout, 1 s (RFC 6298), and
# every later stream with it: on the demo's 1 % loss path one of a test's five connections
# often does (its streams opened 2.8 s after the control connection where 7 round trips are 2.2).
SET_UP_RTO_S = 1.0
MIN_TESTS_FOR_R = 50


@dataclass
class Match:
    """One active test and the instance of its flows."""

    result: Result
    instance: Instance
    active_bps: float

    def passive_bps(self, formula: int) -> float | None:
        return self.instance.throughput_bps(formula)

    def err(self, formula: int) -> float | None:
        passive = self.passive_bps(formula)
        if passive is None or passive <= 0:
            return None
        return (passive - self.active_bps) / passive


@dataclass
class Row:
    """The comparison for one target × probe × formula."""

    target: str
    probe: str
    formula: int
    n: int
    long_flows: int  # matched instances with a long flow flagged
    err_p25: float | None
    err_median: float | None
    err_p75: float | None
    r: float | None  # None below min_tests or with no variance
    passive: list[float] = field(default_factory=list, repr=False)
    active: list[float] = field(default_factory=list, repr=False)


def _window(result: Result) -> tuple[int, int]:
    start = int(result.started_at.timestamp() * 1000)
    return start - int(BEFORE_S * 1000), start + int(AFTER_S * 1000)


def _stream_span_s(result: Result, window_s: float) -> float:
    """How far apart one test's streams may open: (streams + set-up) round trips on the test's
    own path and one retransmission timeout, at least ``window_s``, at most half its duration
    and AFTER_S."""
    rtt_ms = result.data.get("mean_rtt_ms")
    streams = result.params.get("streams", 1)
    duration_s = result.params.get("duration_s")
    if not isinstance(rtt_ms, int | float) or rtt_ms <= 0 or not isinstance(streams, int):
        return window_s
    span_s = (streams + SET_UP_ROUND_TRIPS) * rtt_ms / 1000 + SET_UP_RTO_S
    ceiling_s = AFTER_S
    if isinstance(duration_s, int | float) and duration_s > 0:
        ceiling_s = min(ceiling_s, duration_s / 2)
    return max(window_s, min(span_s, ceiling_s))


def match(
    results: Iterable[Result],
    flows: Sequence[Flow],
    *,
    metric: str = "throughput_bps",
    by_port: bool = True,
    window_s: float = TEST_WINDOW_S,
) -> tuple[list[Match], int]:
    """Match each succeeded result with ``data[metric]`` to the flows to its target's address
    (and server port, if ``by_port``: the refinement that keeps an unrelated connection
    between the same hosts out) starting in its window. Returns the matches and how many
    results found no flows."""
    by_dst: dict[tuple[str, int], list[Flow]] = {}
    by_src: dict[tuple[str, int], list[Flow]] = {}
    for f in flows:
        by_dst.setdefault((f.dst, f.dport if by_port else 0), []).append(f)
        by_src.setdefault((f.src, f.sport if by_port else 0), []).append(f)
    matches: list[Match] = []
    unmatched = 0
    for result in results:
        active = result.data.get(metric)
        if not result.succeeded or not isinstance(active, int | float) or active <= 0:
            continue
        address = result.target_address or result.target
        port = int(result.params.get("port", 5201)) if by_port else 0
        lo, hi = _window(result)
        if result.params.get("reverse"):
            candidates = [f for f in by_src.get((address, port), []) if lo <= f.start_ms <= hi]
        else:
            candidates = [f for f in by_dst.get((address, port), []) if lo <= f.start_ms <= hi]
        if not candidates:
            unmatched += 1
            continue
        # The instance that began nearest the test's start (the largest if two are as near).
        start = lo + int(BEFORE_S * 1000)
        instances = group(candidates, window_s=_stream_span_s(result, window_s), by_port=False)
        best = min(instances, key=lambda i: (abs(i.start_ms - start), -i.bytes))
        matches.append(Match(result, best, float(active)))
    return matches, unmatched


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 2 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return statistics.correlation(xs, ys)


def table(matches: Iterable[Match], min_tests: int = MIN_TESTS_FOR_R) -> list[Row]:
    """Per target × probe × formula: count, err quartiles, R (from ``min_tests`` tests)."""
    grouped: dict[tuple[str, str], list[Match]] = {}
    for m in matches:
        grouped.setdefault((m.result.target, m.result.probe), []).append(m)
    rows = []
    for (target, probe), items in sorted(grouped.items()):
        long_count = sum(1 for m in items if m.instance.long_flows())
        for formula in FORMULAS:
            pairs = [
                (p, m.active_bps, e)
                for m in items
                if (p := m.passive_bps(formula)) is not None and (e := m.err(formula)) is not None
            ]
            errs = [e for _, _, e in pairs]
            passive = [p for p, _, _ in pairs]
            active = [a for _, a, _ in pairs]
            rows.append(
                Row(
                    target, probe, formula, len(pairs), long_count,
                    _percentile(errs, 0.25) if errs else None,
                    _percentile(errs, 0.5) if errs else None,
                    _percentile(errs, 0.75) if errs else None,
                    pearson(passive, active) if len(pairs) >= min_tests else None,
                    passive, active,
                )
            )  # fmt: skip
    return rows


def over_hosts(rows: Iterable[Row]) -> dict[int, dict[str, float | int | None]]:
    """The seed's summary: per formula, the 25–75 percentile range of hosts' median err and
    of their R, and how many hosts."""
    out: dict[int, dict[str, float | int | None]] = {}
    for formula in FORMULAS:
        mine = [r for r in rows if r.formula == formula and r.err_median is not None]
        medians = [r.err_median for r in mine if r.err_median is not None]
        rs = [r.r for r in mine if r.r is not None]
        out[formula] = {
            "hosts": len(mine),
            "err_median_p25": _percentile(medians, 0.25) if medians else None,
            "err_median_p75": _percentile(medians, 0.75) if medians else None,
            "r_p25": _percentile(rs, 0.25) if rs else None,
            "r_p75": _percentile(rs, 0.75) if rs else None,
        }
    return out

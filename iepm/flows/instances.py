"""Application instances: the flows of one transfer, and its throughput by three formulas.

IEPM-BW's method: flows with the same source and destination that start within a few seconds of
each other belong to one application instance (a multi-stream transfer); the server port can
refine it. The instance's throughput is then

1. Σ (bytes_i / time_i): each stream's own rate, summed;
2. Σ bytes_i / mean(time_i);
3. Σ bytes_i / max(time_i) — how tools that time the whole transfer (bbftp) measure.

A *long flow* — a stream reported open far longer than its siblings (an idle connection that
began with the transfer, a stream the exporter did not expire) — barely moves formula 1 (its
rate is small) but drags 2 and 3 down; it is flagged on the instance, never silently dropped.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from iepm.flows.records import Flow

FORMULAS = (1, 2, 3)
DEFAULT_WINDOW_S = 5.0
# A stream this many times longer than the median of its siblings is a long flow.
LONG_FACTOR = 3.0
# A stream shorter than this has no measurable rate (exporters round to ms).
MIN_DURATION_MS = 1


@dataclass
class Instance:
    """The flows of one application instance, in start order."""

    src: str
    dst: str
    dport: int | None
    flows: list[Flow] = field(default_factory=list)

    @property
    def start_ms(self) -> int:
        return self.flows[0].start_ms

    @property
    def end_ms(self) -> int:
        return max(f.end_ms for f in self.flows)

    @property
    def bytes(self) -> int:
        return sum(f.bytes * f.sampling for f in self.flows)

    def timed(self) -> list[Flow]:
        """The streams with a duration (a zero-length record has no rate)."""
        return [f for f in self.flows if f.end_ms - f.start_ms >= MIN_DURATION_MS]

    def throughput_bps(self, formula: int) -> float | None:
        """Bits per second by formula 1, 2 or 3 (sampled counts scaled up); None when no
        stream has a duration."""
        streams = self.timed()
        if not streams:
            return None
        seconds = [(f.end_ms - f.start_ms) / 1000 for f in streams]
        octets = [f.bytes * f.sampling for f in streams]
        if formula == 1:
            return 8 * sum(b / s for b, s in zip(octets, seconds, strict=True))
        if formula == 2:
            return 8 * sum(octets) / statistics.fmean(seconds)
        if formula == 3:
            return 8 * sum(octets) / max(seconds)
        raise ValueError(f"formula must be 1, 2 or 3, not {formula}")

    def long_flows(self, factor: float = LONG_FACTOR) -> list[Flow]:
        """Streams lasting more than ``factor`` × the median of the others."""
        streams = self.timed()
        if len(streams) < 2:
            return []
        found = []
        for i, f in enumerate(streams):
            others = [g.end_ms - g.start_ms for j, g in enumerate(streams) if j != i]
            if f.end_ms - f.start_ms > factor * statistics.median(others):
                found.append(f)
        return found


def group(
    flows: Iterable[Flow], window_s: float = DEFAULT_WINDOW_S, by_port: bool = True
) -> list[Instance]:
    """Instances from flows: same source and destination (and destination port, if
    ``by_port``), each flow starting within ``window_s`` of the instance's first flow."""
    window_ms = window_s * 1000
    by_key: dict[tuple[str, str, int | None], list[Flow]] = {}
    for f in flows:
        by_key.setdefault((f.src, f.dst, f.dport if by_port else None), []).append(f)
    out: list[Instance] = []
    for (src, dst, dport), members in by_key.items():
        members.sort(key=lambda f: (f.start_ms, f.sport))
        current: Instance | None = None
        for f in members:
            if current is None or f.start_ms - current.start_ms > window_ms:
                current = Instance(src, dst, dport)
                out.append(current)
            current.flows.append(f)
    out.sort(key=lambda i: (i.start_ms, i.src, i.dst))
    return out

"""Helpers for lab tests: parsing plain ping output, binomial intervals."""

from __future__ import annotations

import math
import re

_RTT = re.compile(r"time=([\d.]+) ms")
_STAMPED = re.compile(r"^\[(\d+\.\d+)\].*time=([\d.]+) ms", re.M)
_TRANSMITTED = re.compile(r"(\d+) packets transmitted, (\d+) received")


def ping_rtts(output: str) -> list[float]:
    return [float(x) for x in _RTT.findall(output)]


def ping_stamped(output: str) -> list[tuple[float, float]]:
    """(send time in Unix s, rtt ms) from ``ping -D`` output (stamp is the reply's arrival)."""
    return [(float(ts) - float(rtt) / 1000, float(rtt)) for ts, rtt in _STAMPED.findall(output)]


def ping_counts(output: str) -> tuple[int, int]:
    m = _TRANSMITTED.search(output)
    assert m, output[-500:]
    return int(m.group(1)), int(m.group(2))


def binomial_interval(n: int, p: float, level: float = 0.99) -> tuple[int, int]:
    """Smallest [lo, hi] with P(X < lo) <= a/2 and P(X > hi) <= a/2 for X ~ Bin(n, p)."""
    tail = (1 - level) / 2

    def pmf(k: int) -> float:
        if p in (0.0, 1.0):
            return float(k == round(n * p))
        log = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        return math.exp(log + k * math.log(p) + (n - k) * math.log1p(-p))

    cdf, lo = 0.0, 0
    for k in range(n + 1):
        if cdf + pmf(k) > tail:
            lo = k
            break
        cdf += pmf(k)
    cdf, hi = 0.0, n
    for k in range(n, -1, -1):
        if cdf + pmf(k) > tail:
            hi = k
            break
        cdf += pmf(k)
    return lo, hi

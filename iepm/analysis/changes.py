"""Step changes: an offline segmentation for history pages and an online alerting detector.

Offline (:func:`segment`): optimal partitioning (PELT pruning) with a Gaussian-kernel cost. A
bounded kernel makes the cost robust: an outlier adds at most one "sample" of cost wherever it
lands, so it cannot pay for a segment of its own, while a shift of the level or a change of the
spread (a congested period) does. The kernel bandwidth follows the series' own noise (a robust
scale of the first differences), so the penalty is in units of samples and carries across series
of any unit or size. By default the penalty grows with the log of the series' length, as BIC-type
penalties do (R's ``changepoint`` uses MBIC): a longer series offers more places for a spurious
split, so each change must pay a little more.

Online (:class:`KernelDetector`, used by :func:`detect_online`): the same kernel cost, asked one
sample at a time whether the samples since the last change are better described as two segments,
the newer one at least ``confirm`` samples long, than as one (a kernel scan statistic). It is the
offline criterion without hindsight, so it also sees the start and end of congestion bursts (a
change of spread) that a level band misses. One outlier never alerts (it cannot pay the penalty);
a clean level shift alerts at its ``confirm``-th sample. The alert reports where the change
began, its direction and its size.

:class:`OnlineDetector` is the older robust-band detector (median ± threshold·MAD, ``confirm``
consecutive deviant samples); the forecaster's level-shift predictor keeps using it.

Missing samples (NaN, inf) are skipped by both; indices always refer to the input.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from iepm.analysis.statistics import exact_unit

FloatArray = npt.NDArray[np.float64]

# Chosen on the tune half of rtt-changes/ (see benchmarks/changes.py), never on the test half.
# Penalty per change = DEFAULT_PENALTY_PER_LOG_N · ln(n) samples (n: finite samples), 3.7 for
# 1,600 samples, 4.6 for 10,000. 0.5 won leave-one-file-out CV on the tune half (0.799 against
# 0.768 for the best fixed penalty, 4); see benchmarks/changes.py --penalty-rules.
DEFAULT_PENALTY_PER_LOG_N = 0.5
DEFAULT_BANDWIDTH = 12.0
DEFAULT_MIN_SIZE = 2
DEFAULT_MIN_CHANGE = 0.006
# Online (chosen on the tune half too): a change seen in the first 3 samples of a new level has a
# kernel gain of at most 2·3·R/(R+3) < 6 (R: samples of the reference; one outlier gains < 1,
# two ~2.5). 5 asks nearly all of it, so any larger penalty could not alert by the 3rd sample.
ONLINE_PENALTY = 5.0
# A change is "suspected" (pending) from this share of the penalty: two deviant samples, not one.
PENDING_SHARE = 0.4


@dataclass(frozen=True)
class ChangePoint:
    """A level change at ``index`` (first sample of the new level)."""

    index: int
    before: float  # median of the segment before
    after: float  # median of the segment after
    change_percent: float  # (after - before) / |before| * 100; nan when before == 0
    direction: str  # "up" or "down"
    alert_index: int | None = None  # online only: the sample at which the alert was raised

    @property
    def size(self) -> float:
        return self.after - self.before

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _percent(before: float, after: float) -> float:
    return (after - before) / abs(before) * 100.0 if before != 0 else math.nan


def noise_scale(y: FloatArray) -> float:
    """Robust noise standard deviation: MAD of the first differences / √2 (ignores steps)."""
    if y.size < 3:
        return 0.0
    d = np.diff(y)
    mad = float(np.median(np.abs(d - np.median(d))))
    if mad == 0.0:
        # Quantised or mostly-constant data: fall back to the mean absolute difference.
        mad = float(np.mean(np.abs(d))) / 1.4826
    return 1.4826 * mad / math.sqrt(2.0)


def _bandwidth(y: FloatArray, factor: float) -> float:
    sigma = noise_scale(y)
    # A floor relative to the level keeps a near-constant series from making every wiggle a step.
    floor = 1e-3 * float(np.median(np.abs(y))) if y.size else 0.0
    h = factor * max(sigma, floor)
    # Below this the kernel underflows; callers pass data scaled to magnitudes near 1.
    return max(h, 1e-9) if math.isfinite(h) else 1.0


def kernel_pelt(x: FloatArray, penalty: float, bandwidth: float, min_size: int = 2) -> list[int]:
    """Change points (start indices of new segments) minimising Σ cost + penalty·#changes.

    Segment cost with the Gaussian kernel k(a, b) = exp(-(a-b)²/(2h²)):
    ``len - ΣΣ k / len`` (kernel "variance"), updated incrementally per candidate start.
    """
    return kernel_pelt_cost(x, penalty, bandwidth, min_size)[0]


def kernel_pelt_cost(
    x: FloatArray, penalty: float, bandwidth: float, min_size: int = 2
) -> tuple[list[int], float]:
    """:func:`kernel_pelt`'s change points and their Σ segment cost (without the penalties)."""
    n = int(x.size)
    if n < 2 * min_size:
        return [], 0.0
    inv = -0.5 / (bandwidth * bandwidth)
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    last = np.zeros(n + 1, dtype=np.int64)
    cands = np.zeros(1, dtype=np.int64)  # candidate segment starts, increasing
    within = np.zeros(1)  # ΣΣ k over [c, t) for each candidate
    for t in range(1, n + 1):
        lo = int(cands[0])
        k = np.exp(inv * (x[lo : t - 1] - x[t - 1]) ** 2)
        # Σ_{i in [c, t-1)} k(x_i, x_{t-1}) for each candidate c: suffix sums of k.
        suffix = np.concatenate((np.cumsum(k[::-1])[::-1], [0.0]))
        within += 2.0 * suffix[cands - lo] + 1.0
        length = t - cands
        cost = length - within / length
        total = best[cands] + cost
        ok = length >= min_size
        if np.any(ok):
            j = int(np.argmin(np.where(ok, total, np.inf)))
            best[t] = total[j] + penalty
            last[t] = cands[j]
            keep = ~ok | (total <= best[t])
            cands, within = cands[keep], within[keep]
        cands = np.append(cands, t)
        within = np.append(within, 0.0)
    cps: list[int] = []
    t = n
    while t > 0:
        t = int(last[t])
        if t > 0:
            cps.append(t)
    return sorted(cps), float(best[n] - penalty * len(cps))


def crops(
    x: FloatArray, bandwidth: float, low: float, high: float, min_size: int = 2
) -> dict[int, tuple[float, list[int]]]:
    """Every optimal segmentation for penalties in [``low``, ``high``] (CROPS: Haynes, Eckley &
    Fearnhead 2017): ``{number of changes: (Σ segment cost, change points)}``. ``x`` finite and
    scaled as :func:`unit_scaled` gives it, ``bandwidth`` in noise scales (as in :func:`segment`).

    Optimal segmentations as the penalty varies are the lower convex hull of cost against number
    of changes; between two found ones with more than one change apart, the penalty at which
    both cost the same is the only one that can reveal a third, so it is tried next.
    """
    found: dict[int, tuple[float, list[int]]] = {}
    h = _bandwidth(x, bandwidth)

    def run(penalty: float) -> tuple[int, float]:
        cps, cost = kernel_pelt_cost(x, penalty, h, min_size)
        found.setdefault(len(cps), (cost, cps))
        return len(cps), cost

    todo = [(low, run(low), high, run(high))]
    while todo:
        a, (ka, qa), b, (kb, qb) = todo.pop()
        if ka - kb <= 1:
            continue
        middle = (qb - qa) / (ka - kb)
        if not a < middle < b:
            continue
        km, qm = run(middle)
        if km not in (ka, kb):
            todo += [(a, (ka, qa), middle, (km, qm)), (middle, (km, qm), b, (kb, qb))]
    return found


def default_penalty(n_samples: int) -> float:
    """The offline penalty (in samples) for a series of ``n_samples`` finite samples."""
    return DEFAULT_PENALTY_PER_LOG_N * math.log(max(n_samples, 2))


def merge_small(x: FloatArray, cps: list[int], min_change: float) -> list[int]:
    """Merge adjacent segments whose medians differ by less than ``min_change`` of the level."""
    cps = list(cps)
    while cps and min_change > 0:
        bounds = [0, *cps, int(x.size)]
        med = [float(np.median(x[a:b])) for a, b in pairwise(bounds)]
        rel = [abs(med[i + 1] - med[i]) / max(abs(med[i]), 1e-300) for i in range(len(cps))]
        j = int(np.argmin(rel))
        if rel[j] >= min_change:
            break
        del cps[j]
    return cps


def finite_samples(y: Sequence[float] | FloatArray) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """The finite samples of ``y`` and their indices in it."""
    arr = np.asarray(y, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(arr))
    return arr[idx], idx


def unit_scaled(x: FloatArray) -> FloatArray:
    """``x`` divided by a power of two near its largest magnitude: exact, and squares of huge
    values stay finite (the kernel costs expect magnitudes near 1)."""
    return x / exact_unit(x)


def segment(
    y: Sequence[float] | FloatArray,
    *,
    penalty: float | None = None,
    bandwidth: float = DEFAULT_BANDWIDTH,
    min_size: int = DEFAULT_MIN_SIZE,
    min_change: float = DEFAULT_MIN_CHANGE,
) -> list[ChangePoint]:
    """Offline segmentation of a whole series into segments of stable level and spread.

    ``bandwidth`` is in units of the robust noise scale; ``penalty`` in samples (None:
    :func:`default_penalty` of the number of finite samples). Adjacent
    segments whose medians differ by less than ``min_change`` (a fraction of the level) are then
    merged, smallest difference first: on very quiet paths the kernel cost notices shifts of a
    fraction of a percent that nobody would call a change.
    """
    x, idx = finite_samples(y)
    if penalty is None:
        penalty = default_penalty(int(x.size))
    scaled = unit_scaled(x)
    with np.errstate(over="ignore", under="ignore"):
        cps = kernel_pelt(scaled, penalty, _bandwidth(scaled, bandwidth), min_size)
        cps = merge_small(scaled, cps, min_change)
    bounds = [0, *cps, int(x.size)]
    out = []
    for a, b, c in zip(bounds, bounds[1:], bounds[2:], strict=False):
        before = float(np.median(x[a:b]))
        after = float(np.median(x[b:c]))
        out.append(
            ChangePoint(
                index=int(idx[b]),
                before=before,
                after=after,
                change_percent=_percent(before, after),
                direction="up" if after >= before else "down",
            )
        )
    return out


class OnlineDetector:
    """Alerting step detector, fed one sample at a time (no look-ahead).

    A sample is *deviant* when it is further than ``threshold`` robust standard deviations (and
    ``min_relative`` of the level) from the median of the current segment. ``confirm``
    consecutive deviant samples on the same side raise an alert; the segment then restarts at
    the first of them. Scale: MAD of the current segment, never below the noise scale of the
    recent history (so a new, short segment is not judged on two or three samples).

    A confirmed run must also be *consistent*: its spread at most ``consistency`` times its
    distance from the reference (0 turns this off). A burst of noise is scattered; a new level
    is not. The defaults were chosen on the tune half of rtt-changes/.

    ``min_absolute`` is the smallest change worth an alert in the series' own unit (e.g. 2
    percentage points of loss, whose level is usually 0 so that no relative floor applies).
    """

    def __init__(
        self,
        *,
        threshold: float = 4.0,
        confirm: int = 3,
        min_relative: float = 0.01,
        window: int = 50,
        warmup: int = 5,
        consistency: float = 0.6,
        min_absolute: float = 0.0,
    ) -> None:
        if confirm < 1 or window < 3 or warmup < 2:
            raise ValueError("confirm >= 1, window >= 3 and warmup >= 2 are required")
        self.threshold = threshold
        self.confirm = confirm
        self.min_relative = min_relative
        self.window = window
        self.warmup = warmup
        self.consistency = consistency
        self.min_absolute = min_absolute
        self._segment: deque[float] = deque(maxlen=window)
        self._recent: deque[float] = deque(maxlen=4 * window)
        self._pending: list[tuple[int, float]] = []
        self._index = -1
        self._noise = 0.0
        self._noise_age = 0

    @property
    def pending(self) -> bool:
        """True while deviant samples wait for confirmation (a possible change or outlier)."""
        return bool(self._pending)

    def _scale(self, med: float) -> float:
        seg = np.fromiter(self._segment, dtype=np.float64)
        mad = 1.4826 * float(np.median(np.abs(seg - med)))
        # The noise scale of the recent history changes slowly: refresh it every 10 samples.
        if self._noise_age <= 0:
            self._noise = noise_scale(np.fromiter(self._recent, dtype=np.float64))
            self._noise_age = 10
        self._noise_age -= 1
        recent = self._noise
        floor = max(self.min_relative * abs(med), self.min_absolute) / self.threshold
        return max(mad, recent, floor, 1e-12)

    def update(self, value: float) -> ChangePoint | None:
        """Feed the next sample; returns a :class:`ChangePoint` when an alert is raised."""
        self._index += 1
        if not math.isfinite(value):
            return None
        i = self._index
        if len(self._segment) < self.warmup:
            self._segment.append(value)
            self._recent.append(value)
            return None
        # Overflow on absurd values (±1e308) gives inf, and inf is simply "deviant".
        with np.errstate(all="ignore"):
            med = float(np.median(np.fromiter(self._segment, dtype=np.float64)))
            dev = (value - med) / self._scale(med)
        if abs(dev) > self.threshold:
            sign = 1.0 if dev > 0 else -1.0
            if self._pending and (self._pending[0][1] - med) * sign <= 0:
                self._pending = []  # a deviant run on the other side starts afresh
            self._pending.append((i, value))
            if len(self._pending) >= self.confirm:
                start = self._pending[0][0]
                values = [v for _, v in self._pending]
                after = float(np.median(values))
                if self.consistency > 0 and (max(values) - min(values)) > self.consistency * abs(
                    after - med
                ):
                    self._pending.pop(0)  # a burst of noise, not a new level (yet)
                    return None
                self._segment.clear()
                self._segment.extend(values)
                self._recent.extend(values)
                self._pending = []
                return ChangePoint(
                    index=start,
                    before=med,
                    after=after,
                    change_percent=_percent(med, after),
                    direction="up" if after >= med else "down",
                    alert_index=i,
                )
            return None
        # An isolated deviant sample was an outlier: it never enters the reference.
        self._pending = []
        self._segment.append(value)
        self._recent.append(value)
        return None


class KernelDetector:
    """Alerting step detector on the offline kernel cost, fed one sample at a time (no look-ahead).

    The samples since the last change (at most ``window``) are split at the best point that
    leaves at least ``min_reference`` samples before and ``confirm`` after; when the kernel cost
    of the whole exceeds the cost of the two parts by more than ``penalty``, an alert is raised
    and the newer part becomes the reference. ``bandwidth`` is in units of the recent noise scale
    (as in :func:`segment`). A change smaller than ``min_relative`` of the level or
    ``min_absolute`` (the series' own unit) is not reported.

    One outlier never alerts, a clean shift alerts at its ``confirm``-th sample, and a burst of
    scattered samples (congestion) alerts when it has lasted long enough to be more than noise.
    """

    def __init__(
        self,
        *,
        penalty: float = ONLINE_PENALTY,
        bandwidth: float = DEFAULT_BANDWIDTH,
        confirm: int = 3,
        min_reference: int = 5,
        window: int = 100,
        min_relative: float = DEFAULT_MIN_CHANGE,
        min_absolute: float = 0.0,
    ) -> None:
        if confirm < 1 or min_reference < 2 or window < min_reference + confirm:
            raise ValueError("confirm >= 1, min_reference >= 2, window >= min_reference + confirm")
        if not (penalty > 0 and bandwidth > 0):
            raise ValueError("penalty and bandwidth must be > 0")
        self.penalty = penalty
        self.bandwidth = bandwidth
        self.confirm = confirm
        self.min_reference = min_reference
        self.min_relative = min_relative
        self.min_absolute = min_absolute
        self._values: deque[float] = deque(maxlen=window)
        self._indices: deque[int] = deque(maxlen=window)
        self._recent: deque[float] = deque(maxlen=4 * window)
        self._index = -1
        self._scale = 0.0
        self._scale_age = 0
        self._pending = False

    @property
    def pending(self) -> bool:
        """True while the newest samples look like the start of a change not yet confirmed."""
        return self._pending

    def _noise(self) -> float:
        # The noise scale of the recent history changes slowly: refresh it every 10 samples.
        if self._scale_age <= 0:
            recent = np.fromiter(self._recent, dtype=np.float64)
            unit = exact_unit(recent)
            with np.errstate(all="ignore"):
                self._scale = _bandwidth(recent / unit, 1.0) * unit
            self._scale_age = 10
        self._scale_age -= 1
        return self._scale

    def update(self, value: float) -> ChangePoint | None:
        """Feed the next sample; returns a :class:`ChangePoint` when an alert is raised."""
        self._index += 1
        if not math.isfinite(value):
            return None
        self._values.append(value)
        self._indices.append(self._index)
        self._recent.append(value)
        h = self.bandwidth * self._noise()
        n = len(self._values)
        self._pending = False
        if n < self.min_reference + self.confirm or not (h > 0 and math.isfinite(h)):
            return None
        x = np.fromiter(self._values, dtype=np.float64)
        with np.errstate(all="ignore"):
            z = (x / h)[:, None] - (x / h)[None, :]  # divided first: no overflow near 1e308
            gram = np.exp(-0.5 * np.nan_to_num(z, nan=np.inf) ** 2)
        # 2-D prefix sums: the kernel sum over any block [a, b)² in O(1).
        p = np.zeros((n + 1, n + 1))
        p[1:, 1:] = gram.cumsum(axis=0).cumsum(axis=1)
        split = np.arange(self.min_reference, n - self.confirm + 1)
        inner_before = p[split, split]
        inner_after = p[n, n] - p[split, n] - p[n, split] + p[split, split]
        after_len = n - split
        whole = n - p[n, n] / n
        gain = whole - (split - inner_before / split) - (after_len - inner_after / after_len)
        best = int(np.argmax(gain))
        self._pending = bool(gain[best] > PENDING_SHARE * self.penalty)
        if gain[best] <= self.penalty:
            return None
        at = int(split[best])
        before = float(np.median(x[:at]))
        after = float(np.median(x[at:]))
        if abs(after - before) < max(self.min_relative * abs(before), self.min_absolute):
            return None
        start = self._indices[at]
        for _ in range(at):
            self._values.popleft()
            self._indices.popleft()
        self._pending = False
        return ChangePoint(
            index=start,
            before=before,
            after=after,
            change_percent=_percent(before, after),
            direction="up" if after >= before else "down",
            alert_index=self._index,
        )


def detect_online(y: Iterable[float], **options: Any) -> list[ChangePoint]:
    """Run :class:`KernelDetector` (``options`` are its parameters) over a series; the alerts it
    would have raised, in order."""
    det = KernelDetector(**options)
    alerts = []
    for v in y:
        cp = det.update(float(v))
        if cp is not None:
            alerts.append(cp)
    return alerts

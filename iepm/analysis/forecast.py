"""One-step-ahead forecasts with calibrated 80% prediction intervals.

Every predictor sees only the past: walk-forward, one step ahead, irregular spacing allowed
(time enters only where it matters: Holt's smoothing and same-time-last-week).

Baselines, as the IEPM-BW seeds define them:

- ``ma5``: mean of the last 5 measurements; interval mean ± 1.28·stdev of those 5 (the seeds'
  "± stdev", scaled to a nominal 80%).
- ``ewma``: F(t+1) = w·F(t) + (1 − w)·O(t), w = 0.7 (w weighs the previous average); interval
  ± 1.28·stdev of the last 5 measurements, as for ``ma5``.

Better predictors:

- ``median5``: median of the last 5 — robust to the single outliers throughput series are full of.
- ``holt``: Holt's level and damped trend, with smoothing scaled by the time since the previous
  sample (Wright's treatment of irregular spacing: a long gap forgets more of the past).
- ``levelshift``: He, Dovrolis & Ammar's level-shift-aware history: the median of the last 20
  samples of the *current* level only. Outliers are kept out, and the history restarts when the
  online step detector (:mod:`iepm.analysis.changes`) confirms a shift.
- ``lastweek``: the median of the measurements within ±1 h of the same time of day one and two
  weeks back, and one day back; for diurnal paths. Absent when no such measurement exists.
- ``levelmode`` and ``levelrel``: forecasts chosen for the loss they are scored by, the relative
  error |f − o|/o. Over the current level's samples (as ``levelshift`` keeps them), the value f
  that minimises Σ min(|f − oᵢ|/oᵢ, c) — the sample distribution's best point forecast under the
  relative error, with errors beyond c counted as c (truncated, so the near-zero observations
  every throughput series has cannot drag it down, as they do the plain 1/o-weighted median).
  ``levelmode``: last 40 samples, c = 0.3 — the most typical value, for steady paths (most of
  the points in the P90). ``levelrel``: last 100 samples, c = 1 — for noisy paths, where the
  best point lies below the median (relative errors punish over-forecasts more).

- ``mean10``: mean of the last 10 — the smoothest member; on paths whose throughput dips often
  (uploads from home links) a mean sits below the typical value, where the relative error of the
  dips (which sets the P90) is smallest.

``auto`` is the NWS-style ensemble: at every step it uses the member with the lowest recent
error (exponentially weighted mean of the relative error, each error capped so a few near-zero
observations cannot decide). Its members (:data:`ENSEMBLE`) include the baselines MA(5) and EWMA
themselves, so on a path where the level-based predictors lose to them the ensemble falls back to
them instead of being worse. Two more safeguards, each optional (:class:`EnsembleConfig`):
``blend`` shrinks the chosen member's forecast toward MA(5)'s (a forecast combination), and
``guard`` makes the ensemble fall back to MA(5) itself while, over its last ``guard`` forecasts
of this series (measured online, causally), it was worse than MA(5) on both P90 and mean
(:class:`_Guard`). The ``method`` of each forecast names the member chosen, or ``ma5`` while the
guard holds. A predictor that cannot forecast yet (``lastweek`` without a day of history) falls
back to ``median5`` and says so in ``method``. Members, error cap, decay, blend and guard
(:data:`ENSEMBLE_CONFIG`) are chosen by ``benchmarks/forecast.py --folds clients``:
leave-clients-out cross-validation on ../shared/data/ndt/, where each fold chooses among the
candidates on its training clients only and is scored on the held-out client; the default is
that same rule's choice on all clients.

Intervals for everything but the baselines are conformal: empirical quantiles of the method's
last relative errors (o − f)/|f|, with the miscoverage level adapted online (Gibbs & Candès'
adaptive conformal inference) so coverage stays near 80% when the error distribution drifts.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from iepm.analysis.changes import OnlineDetector
from iepm.analysis.methods import BASELINES, METHODS, START
from iepm.analysis.series import AnalysisError
from iepm.analysis.statistics import exact_unit

FloatArray = npt.NDArray[np.float64]

Z80 = 1.2816  # standard normal 90% quantile: mean ± Z80·sd is a nominal 80% interval
GUARD_MIN = 20  # forecasts the guard needs before it judges (and the smallest window)
GUARD_CAP = 3.0  # the guard's relative errors are capped here, as the selector's


@dataclass(frozen=True)
class EnsembleConfig:
    """What ``auto`` chooses among and how: its members, the one used until the others have a
    record, and the selector's error cap, decay and hysteresis margin."""

    members: tuple[str, ...]
    default: str = "levelshift"
    decay: float = 0.97
    cap: float = 0.5
    margin: float = 0.0
    # The forecast is (1 − blend)·(chosen member's) + blend·MA(5): shrunk toward the baseline.
    blend: float = 0.0
    # > 0: the guard's window (forecasts); the ensemble falls back to MA(5) while, over that
    # many of its latest forecasts, it was worse than MA(5) on both P90 and mean (:class:`_Guard`).
    guard: int = 0
    # > 0: the window (forecasts) of the relative-error correction (:class:`_RelativeScale`):
    # the forecast is multiplied by the factor that would have minimised the summed relative
    # error of the series' latest forecasts.
    rescale: int = 0
    # Weaker corrections (rescale > 0): the factor m, clipped to [1/limit, limit], is used as
    # m**power (power < 1 shrinks it toward 1), and only where a sign test over the window says
    # m beats 1 on more of its forecasts than chance allows (evidence: the z needed; 0 always).
    rescale_power: float = 1.0
    rescale_limit: float = 1.0 + GUARD_CAP
    rescale_evidence: float = 0.0
    # True: the correction is used only while, over its window, the corrected forecasts were no
    # worse than the uncorrected ones on both P90 and mean relative error (both kept, causally).
    rescale_check: bool = False

    def __post_init__(self) -> None:
        unknown = [m for m in (*self.members, self.default) if m not in METHODS or m == "auto"]
        if unknown:
            raise AnalysisError(f"ensemble member {unknown[0]!r} is not a predictor")
        if self.default not in self.members:
            raise AnalysisError(f"ensemble default {self.default!r} is not one of its members")
        if not (0 < self.decay < 1 and self.cap > 0 and 0 <= self.margin < 1):
            raise AnalysisError("ensemble decay must be in (0, 1), cap > 0, margin in [0, 1)")
        if not (0 <= self.blend < 1 and (self.guard == 0 or self.guard >= GUARD_MIN)):
            raise AnalysisError(f"ensemble blend must be in [0, 1), guard 0 or >= {GUARD_MIN}")
        if not (self.rescale == 0 or self.rescale >= GUARD_MIN):
            raise AnalysisError(f"ensemble rescale must be 0 or >= {GUARD_MIN}")
        if not (
            0 < self.rescale_power <= 1
            and 1 < self.rescale_limit <= 1 + GUARD_CAP
            and self.rescale_evidence >= 0
        ):
            raise AnalysisError(
                f"ensemble rescale_power must be in (0, 1], rescale_limit in (1, {1 + GUARD_CAP}],"
                " rescale_evidence >= 0"
            )

    @property
    def needs_baseline(self) -> bool:
        return self.blend > 0 or self.guard > 0

    @property
    def selector_key(self) -> tuple[object, ...]:
        """What the member choice depends on: ensembles alike in these choose alike."""
        return (self.members, self.default, self.decay, self.cap, self.margin)


# The level-based predictors (Holt and same-time-last-week only added noise to the choice).
LEVEL_MEMBERS: tuple[str, ...] = ("median5", "levelshift", "levelmode", "levelrel")
# Chosen by benchmarks/forecast.py --folds clients (minimax over training clients' paths, among
# 108 candidates: member sets × cap × decay × blend × guard): the rule chooses it on all four
# clients and in three of the four folds. The ensemble as it was before (LEVEL_MEMBERS
# alone, cap 0.5, unguarded) is among the candidates it rejects: on the client whose uploads dip
# often it was worse than MA(5) on P90 and on the raw mean.
ENSEMBLE_CONFIG = EnsembleConfig(
    members=(*LEVEL_MEMBERS, "ma5", "ewma", "mean10"), decay=0.97, cap=3.0, guard=100
)
ENSEMBLE: tuple[str, ...] = ENSEMBLE_CONFIG.members
ENSEMBLE_DEFAULT = ENSEMBLE_CONFIG.default

HOUR = 3600.0
DAY = 86400.0

# Chosen on the tune half of ../shared/data/ndt/ (benchmarks/forecast.py), never the test half:
# a shift must be 7 robust standard deviations and 20% of the level, for 3 samples in a row.
LEVEL_SHIFT_DETECTOR: dict[str, float] = {"threshold": 7.0, "confirm": 3, "min_relative": 0.2}
# No hysteresis (margin 0): with it, whichever member came first stayed in use too long.
SELECTOR: dict[str, float] = {
    "decay": ENSEMBLE_CONFIG.decay,
    "cap": ENSEMBLE_CONFIG.cap,
    "margin": ENSEMBLE_CONFIG.margin,
}
# Samples of the current level kept for the level-based predictors (the longest window they use).
LEVEL_HISTORY = 100


@dataclass(frozen=True)
class Forecast:
    """The forecast of measurement ``index`` made from the measurements before it."""

    index: int
    t: float
    observed: float
    forecast: float
    lower: float
    upper: float
    method: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Predictor:
    name = ""

    def __init__(self) -> None:
        self.t: list[float] = []
        self.y: list[float] = []

    def predict(self, t_next: float) -> float | None:
        raise NotImplementedError

    def update(self, t: float, y: float) -> None:
        self.t.append(t)
        self.y.append(y)


class MovingAverage(_Predictor):
    name = "ma5"

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = k

    def predict(self, t_next: float) -> float | None:
        return float(np.mean(self.y[-self.k :])) if self.y else None


class Ewma(_Predictor):
    name = "ewma"

    def __init__(self, w: float = 0.7) -> None:
        super().__init__()
        self.w = w
        self.level: float | None = None

    def predict(self, t_next: float) -> float | None:
        return self.level

    def update(self, t: float, y: float) -> None:
        super().update(t, y)
        self.level = y if self.level is None else self.w * self.level + (1 - self.w) * y


class MeanK(MovingAverage):
    name = "mean10"

    def __init__(self, k: int = 10) -> None:
        super().__init__(k)


class MedianK(_Predictor):
    name = "median5"

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = k

    def predict(self, t_next: float) -> float | None:
        return float(np.median(self.y[-self.k :])) if self.y else None


class Holt(_Predictor):
    """Damped-trend Holt; α and β apply per typical spacing, compounded over longer gaps."""

    name = "holt"

    def __init__(self, alpha: float = 0.5, beta: float = 0.05, phi: float = 0.9) -> None:
        super().__init__()
        self.alpha, self.beta, self.phi = alpha, beta, phi
        self.level: float | None = None
        self.trend = 0.0  # per unit of typical spacing
        self.spacing: float | None = None

    def _steps(self, dt: float) -> float:
        if self.spacing is None or self.spacing <= 0:
            return 1.0
        return min(max(dt / self.spacing, 0.0), 50.0)

    def predict(self, t_next: float) -> float | None:
        if self.level is None:
            return None
        h = self._steps(t_next - self.t[-1])
        damp = self.phi * (1 - self.phi**h) / (1 - self.phi) if h > 0 else 0.0
        return self.level + damp * self.trend

    def update(self, t: float, y: float) -> None:
        if self.level is None:
            super().update(t, y)
            self.level = y
            return
        gaps = np.diff([*self.t[-20:], t])
        gaps = gaps[gaps > 0]
        self.spacing = float(np.median(gaps)) if gaps.size else self.spacing
        h = self._steps(t - self.t[-1])
        a = 1 - (1 - self.alpha) ** max(h, 1e-3)
        b = 1 - (1 - self.beta) ** max(h, 1e-3)
        prev = self.level
        guess = self.predict(t)
        assert guess is not None
        self.level = a * y + (1 - a) * guess
        self.trend = b * (self.level - prev) / max(h, 1e-3) + (1 - b) * self.trend * self.phi
        super().update(t, y)


class LevelSegment:
    """The samples of the current level: restarted when the online step detector confirms a
    shift, with deviant samples awaiting confirmation kept out (He, Dovrolis & Ammar)."""

    def __init__(self, history: int = LEVEL_HISTORY) -> None:
        self.detector = OnlineDetector(**LEVEL_SHIFT_DETECTOR)
        self.y: list[float] = []
        self.samples: deque[float] = deque(maxlen=history)

    def update(self, y: float) -> None:
        self.y.append(y)
        alert = self.detector.update(y)
        if alert is not None:
            self.samples.clear()
            self.samples.extend(self.y[alert.index :])
        elif not self.detector.pending:
            self.samples.append(y)

    def last(self, k: int) -> FloatArray:
        n = len(self.samples)
        return np.fromiter(
            (self.samples[j] for j in range(max(0, n - k), n)), dtype=np.float64, count=min(n, k)
        )


class LevelShift(_Predictor):
    """Median of the last ``k`` samples of the current level (He, Dovrolis & Ammar)."""

    name = "levelshift"

    def __init__(self, segment: LevelSegment, k: int = 20, owner: bool = True) -> None:
        super().__init__()
        self.k = k
        self.segment = segment
        self.owner = owner  # several predictors share one segment; one of them feeds it

    def predict(self, t_next: float) -> float | None:
        level = self.segment.last(self.k)
        return float(np.median(level)) if level.size else None

    def update(self, t: float, y: float) -> None:
        if self.owner:
            self.segment.update(y)


def relative_loss_point(values: FloatArray, cap: float) -> float:
    """The value f among ``values`` minimising Σ min(|f − vᵢ|/vᵢ, cap) over the positive vᵢ.

    The point forecast that is best, under the relative error, for a predictive distribution
    given by the samples; truncating each error at ``cap`` keeps near-zero samples (whose 1/v
    weight is huge) from dragging it down. Scale-invariant; the median if no sample is positive.
    """
    v = np.sort(values[values > 0])
    if v.size == 0:
        return float(np.median(values))
    loss = np.minimum(np.abs(v[:, None] - v[None, :]) / v[None, :], cap).sum(axis=1)
    # Near-ties (rounding) go to the lowest value, so scaling the series never flips the choice.
    return float(v[int(np.flatnonzero(loss <= loss.min() * (1 + 1e-9))[0])])


class LevelLoss(LevelShift):
    """The relative-error-optimal point of the last ``k`` samples of the current level."""

    def __init__(self, name: str, segment: LevelSegment, k: int, cap: float) -> None:
        super().__init__(segment, k, owner=False)
        self.name = name
        self.cap = cap

    def predict(self, t_next: float) -> float | None:
        level = self.segment.last(self.k)
        return relative_loss_point(level, self.cap) if level.size else None


class LastWeek(_Predictor):
    """Median of the measurements near the same time 1 day, 1 week and 2 weeks back."""

    name = "lastweek"

    def __init__(self, tolerance: float = HOUR) -> None:
        super().__init__()
        self.tolerance = tolerance

    def predict(self, t_next: float) -> float | None:
        near: list[float] = []
        for lag in (DAY, 7 * DAY, 14 * DAY):
            a = bisect_left(self.t, t_next - lag - self.tolerance)
            b = bisect_right(self.t, t_next - lag + self.tolerance)
            near.extend(self.y[a:b])
        return float(np.median(near)) if len(near) >= 2 else None


def _make_predictors() -> list[_Predictor]:
    segment = LevelSegment()
    return [
        MovingAverage(),
        Ewma(),
        MeanK(),
        MedianK(),
        Holt(),
        LevelShift(segment),
        # Parameters chosen on the tune half of ../shared/data/ndt/ only.
        LevelLoss("levelmode", segment, k=40, cap=0.3),
        LevelLoss("levelrel", segment, k=LEVEL_HISTORY, cap=1.0),
        LastWeek(),
    ]


def quantile_sorted(values: Sequence[float], q: float) -> float:
    """``np.quantile(values, q)`` (linear method) of an already sorted sequence, bit for bit.

    The bands ask for two quantiles of 100 errors at every step; numpy's per-call overhead made
    that most of a long walk's time (300,000 rows: minutes).
    """
    n = len(values)
    virtual = (n - 1) * q  # numpy's virtual index for the linear method
    below = math.floor(virtual)
    gamma = virtual - below
    a = values[min(max(below, 0), n - 1)]
    b = values[min(max(below + 1, 0), n - 1)]
    diff = b - a
    # numpy's _lerp: from the nearer end, for the same rounding.
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


class ConformalBand:
    """Adaptive conformal interval from the last ``window`` relative errors of one method."""

    def __init__(
        self, coverage: float = 0.8, window: int = 100, gamma: float = 0.01, min_errors: int = 10
    ) -> None:
        self.target = 1.0 - coverage
        self.alpha = self.target
        self.gamma = gamma
        self.min_errors = min_errors
        self.errors: deque[float] = deque(maxlen=window)
        self.sorted_errors: list[float] = []  # the same errors, kept sorted for the quantiles

    @staticmethod
    def scale(f: float, floor: float) -> float:
        return max(abs(f), floor)

    def interval(self, f: float, floor: float, fallback_sd: float) -> tuple[float, float]:
        if len(self.errors) < self.min_errors:
            return f - Z80 * fallback_sd, f + Z80 * fallback_sd
        a = min(max(self.alpha, 0.0), 1.0)
        lo = quantile_sorted(self.sorted_errors, a / 2)
        hi = quantile_sorted(self.sorted_errors, 1 - a / 2)
        s = self.scale(f, floor)
        return min(f + lo * s, f), max(f + hi * s, f)

    def update(self, f: float, observed: float, floor: float, inside: bool) -> None:
        if len(self.errors) >= self.min_errors:
            self.alpha += self.gamma * (self.target - (0.0 if inside else 1.0))
        # Clipped: one error a million times the forecast says all there is to say.
        error = min(max((observed - f) / self.scale(f, floor), -1e6), 1e6)
        if len(self.errors) == self.errors.maxlen:
            del self.sorted_errors[bisect_left(self.sorted_errors, self.errors[0])]
        self.errors.append(error)
        insort(self.sorted_errors, error)


class _Selector:
    """NWS-style choice: the available predictor with the lowest recent (capped) relative error."""

    def __init__(
        self, names: Sequence[str], decay: float = 0.97, cap: float = 1.0, margin: float = 0.1
    ) -> None:
        self.decay = decay
        self.cap = cap
        self.margin = margin
        self.score = dict.fromkeys(names, math.nan)
        self.current: str | None = None

    def choose(self, forecasts: dict[str, float | None], default: str) -> str:
        best, best_score = default, math.inf
        for name, f in forecasts.items():
            s = self.score.get(name, math.nan)
            if f is not None and not math.isnan(s) and s < best_score:
                best, best_score = name, s
        cur = self.current
        # Hysteresis: switch only for a clear gain, since recent errors are noisy estimates.
        if (
            cur is not None
            and forecasts.get(cur) is not None
            and best != cur
            and not best_score < (1.0 - self.margin) * self.score[cur]
        ):
            best = cur
        self.current = best
        return best

    def update(self, forecasts: dict[str, float | None], observed: float, floor: float) -> None:
        for name, f in forecasts.items():
            if f is None or name not in self.score:
                continue
            err = min(abs(observed - f) / max(abs(observed), floor), self.cap)
            old = self.score[name]
            self.score[name] = err if math.isnan(old) else self.decay * old + (1 - self.decay) * err


class _ErrorWindow:
    """The last ``window`` errors, kept sorted too (for quantiles) and summed (for the mean)."""

    def __init__(self, window: int) -> None:
        self.errors: deque[float] = deque(maxlen=window)
        self.sorted: list[float] = []
        self.total = 0.0

    def __len__(self) -> int:
        return len(self.errors)

    def add(self, error: float) -> None:
        if len(self.errors) == self.errors.maxlen:
            old = self.errors[0]
            del self.sorted[bisect_left(self.sorted, old)]
            self.total -= old
        self.errors.append(error)
        insort(self.sorted, error)
        self.total += error

    def quantile(self, q: float) -> float:
        return quantile_sorted(self.sorted, q)

    def mean(self) -> float:
        return self.total / len(self.errors)


class _Guard:
    """Falls back to MA(5) while the ensemble's own recent record is worse than MA(5)'s.

    Online and causal, per series: over the last ``window`` forecasts (both the ensemble's and
    MA(5)'s, relative errors capped at :data:`GUARD_CAP`), the ensemble gives way when its P90
    *and* its mean error were both worse than MA(5)'s. Either alone was a noisy verdict; when it
    loses on both, the path is one where the level-based predictors do not work (uploads that
    dip often) and the baseline is the better forecast until the record says otherwise.
    """

    def __init__(self, window: int) -> None:
        self.mine = _ErrorWindow(window)
        self.base = _ErrorWindow(window)

    def holds(self) -> bool:
        if len(self.mine) < GUARD_MIN:
            return False
        return (
            self.mine.quantile(0.9) > self.base.quantile(0.9)
            and self.mine.mean() > self.base.mean()
        )

    def update(self, mine: float, base: float, observed: float, floor: float) -> None:
        scale = max(abs(observed), floor)
        self.mine.add(min(abs(observed - mine) / scale, GUARD_CAP))
        self.base.add(min(abs(observed - base) / scale, GUARD_CAP))


class _RelativeScale:
    """A multiplicative correction for the relative error |f − o|/o, learned online per series.

    |m·f − o|/o = (1/r)·|m − r| with r = o/f, so the factor m that minimises the summed relative
    error over past forecasts is the median of their ratios r weighted by 1/r: below the plain
    median where observations dip (over-forecasts cost more than under-forecasts). Ratios are
    clipped to [1/(1 + c), 1 + c], c = :data:`GUARD_CAP` (relative errors beyond c count as c,
    as the selector's and the guard's), so a near-zero observation weighs at most 1 + c times a
    typical one instead of deciding the factor alone.

    Weaker forms (:class:`EnsembleConfig`): the factor clipped to [1/limit, limit], raised to
    ``power`` ≤ 1 (shrunk toward 1), and used only when ``evidence`` > 0 is met by a sign test:
    of the window's forecasts, those m would have made better (|m − r| < |1 − r|) must exceed
    half by ``evidence`` binomial standard deviations; otherwise the factor is 1. With ``check``
    the factor is used only while the corrected forecasts, recorded beside the uncorrected ones
    over the window, were no worse on both P90 and mean (:meth:`trusted`).
    """

    def __init__(
        self,
        window: int,
        power: float = 1.0,
        limit: float = 1.0 + GUARD_CAP,
        evidence: float = 0.0,
        check: bool = False,
    ) -> None:
        self.ratios: deque[float] = deque(maxlen=window)
        self.power = power
        self.limit = limit
        self.evidence = evidence
        # With check: the record of the corrected and the uncorrected forecasts, side by side.
        self.record = (_ErrorWindow(window), _ErrorWindow(window)) if check else None

    def trusted(self) -> bool:
        """Whether to use the factor: always without check; with it, while the corrected
        forecasts' record over the window is no worse on P90 and mean (uncapped: the mean is
        the seeds' own metric, which the near-zero observations decide)."""
        if self.record is None:
            return True
        scaled, plain = self.record
        return (
            len(scaled) >= GUARD_MIN
            and scaled.quantile(0.9) <= plain.quantile(0.9)
            and scaled.mean() <= plain.mean()
        )

    def factor(self) -> float:
        n = len(self.ratios)
        if n < GUARD_MIN:
            return 1.0
        r = np.sort(np.fromiter(self.ratios, dtype=np.float64))
        weight = np.cumsum(1.0 / r)
        m = float(r[int(np.searchsorted(weight, 0.5 * weight[-1]))])
        m = min(max(m, 1.0 / self.limit), self.limit)
        if self.evidence > 0:
            # m beats 1 exactly where r lies beyond the midpoint (1 + m)/2 on m's side.
            mid = 0.5 * (1.0 + m)
            better = (
                int(np.searchsorted(r, mid)) if m < 1 else n - int(np.searchsorted(r, mid, "right"))
            )
            if better - 0.5 * n <= self.evidence * 0.5 * math.sqrt(n):
                return 1.0
        return m**self.power

    def update(self, f: float, scaled: float, observed: float, floor: float) -> None:
        """Learn from ``observed``: ``f`` was the uncorrected forecast, ``scaled`` the corrected."""
        if self.record is not None:
            scale = max(abs(observed), floor)
            for window, g in zip(self.record, (scaled, f), strict=True):
                window.add(min(abs(observed - g) / scale, 1e6))
        r = observed / max(f, floor)
        self.ratios.append(min(max(r, 1.0 / (1.0 + GUARD_CAP)), 1.0 + GUARD_CAP))


class _Choice:
    """One selector's member choice per step, shared by the ensembles that differ only in what
    they do with it (blend, guard): the choice does not depend on those."""

    def __init__(self, config: EnsembleConfig) -> None:
        self.config = config
        self.selector = _Selector(
            config.members, decay=config.decay, cap=config.cap, margin=config.margin
        )
        self.current = config.default
        self.members: dict[str, float | None] = {}

    def choose(self, fc: dict[str, float | None]) -> str:
        self.members = {n: fc[n] for n in self.config.members}
        self.current = self.selector.choose(self.members, self.config.default)
        return self.current

    def update(self, obs: float, floor: float) -> None:
        self.selector.update(self.members, obs, floor)


class _Ensemble:
    """``auto`` under one configuration: select a member, shrink toward MA(5), guard, band."""

    def __init__(self, config: EnsembleConfig, coverage: float, choice: _Choice) -> None:
        self.config = config
        self.choice = choice
        self.guard = _Guard(config.guard) if config.guard else None
        self.rescale = (
            _RelativeScale(
                config.rescale,
                config.rescale_power,
                config.rescale_limit,
                config.rescale_evidence,
                config.rescale_check,
            )
            if config.rescale
            else None
        )
        self.band = ConformalBand(coverage)

    def step(
        self, fc: dict[str, float | None], obs: float, floor: float, sd: float
    ) -> tuple[float, float, float, str]:
        """The forecast, its interval and the method used; then learns from ``obs``.

        The member was chosen (``_Choice.choose``) before; its selector learns after."""
        choice = self.choice.current
        f = fc[choice]
        assert f is not None
        base = fc["ma5"] if self.config.needs_baseline else None
        if base is not None:
            f = (1 - self.config.blend) * f + self.config.blend * base
        if self.rescale is not None:
            unscaled, scaled = f, f * self.rescale.factor()
            f = scaled if self.rescale.trusted() else unscaled
            self.rescale.update(unscaled, scaled, obs, floor)
        mine, method = f, choice
        if self.guard is not None and base is not None:
            if self.guard.holds():
                f, method = base, "ma5"
            self.guard.update(mine, base, obs, floor)
        lo, hi = self.band.interval(f, floor, sd)
        self.band.update(f, obs, floor, lo <= obs <= hi)
        return f, lo, hi, method


def _check(
    t: Sequence[float] | FloatArray, y: Sequence[float] | FloatArray
) -> tuple[FloatArray, FloatArray]:
    ta = np.asarray(t, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if ta.shape != ya.shape or ta.ndim != 1:
        raise AnalysisError("timestamps and values must be 1-d and of the same length")
    if not (np.all(np.isfinite(ta)) and np.all(np.isfinite(ya))):
        raise AnalysisError("timestamps and values must be finite")
    if ta.size > 1 and np.any(np.diff(ta) < 0):
        raise AnalysisError("timestamps must not go backwards")
    return ta, ya


def _needed_predictors(methods: Sequence[str], ensembles: Sequence[EnsembleConfig]) -> set[str]:
    """The predictors that ``methods`` and ``ensembles`` read: median5 is every method's
    fallback, and levelshift feeds the level segment the level-based predictors share."""
    needed = {"median5", "levelshift", *(m for m in methods if m != "auto")}
    for config in ensembles:
        needed.update(config.members)
        if config.needs_baseline:
            needed.add("ma5")
    return needed


def walk_forward_all(
    t: Sequence[float] | FloatArray,
    y: Sequence[float] | FloatArray,
    *,
    start: int = START,
    coverage: float = 0.8,
    methods: Sequence[str] = METHODS,
    ensemble: EnsembleConfig = ENSEMBLE_CONFIG,
    ensembles: Mapping[str, EnsembleConfig] | None = None,
) -> dict[str, list[Forecast]]:
    """Walk-forward one-step-ahead forecasts of ``methods`` (default: all), from index ``start``.

    Every method forecasts the same indices, so their errors compare point for point. A method's
    forecasts do not depend on which others are asked for; asking for fewer is only faster.
    ``ensemble`` configures ``auto``; ``ensembles`` adds more ensembles under their own names,
    walked over the same predictors at once (cross-validation tries its candidates so).
    """
    ta, ya = _check(t, y)
    if coverage <= 0 or coverage >= 1:
        raise AnalysisError("coverage must be between 0 and 1")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise AnalysisError(f"unknown method {unknown[0]!r}; choose one of {', '.join(METHODS)}")
    # Work in units of (a power of two near) the largest magnitude: no overflow in squares, and
    # scaling by a power of two is exact, so no forecast depends on a later value by rounding.
    unit = exact_unit(ya)
    yn = ya / unit
    configs = dict(ensembles or {})
    clash = [n for n in configs if n in METHODS]
    if clash:
        raise AnalysisError(f"ensemble name {clash[0]!r} is a method's name")
    if "auto" in methods:
        configs["auto"] = ensemble
    needed = _needed_predictors(methods, list(configs.values()))
    preds = [p for p in _make_predictors() if p.name in needed]
    names = [name for name in methods if name != "auto"]
    bands = {n: ConformalBand(coverage) for n in names if n not in BASELINES}
    choices: dict[tuple[object, ...], _Choice] = {}
    for config in configs.values():
        choices.setdefault(config.selector_key, _Choice(config))
    runs = {
        n: _Ensemble(config, coverage, choices[config.selector_key])
        for n, config in configs.items()
    }
    z = Z80 if math.isclose(coverage, 0.8) else _normal_quantile(0.5 + coverage / 2)
    out: dict[str, list[Forecast]] = {n: [] for n in (*names, *runs)}
    for i in range(ya.size):
        obs = float(yn[i])
        if i >= max(start, 1):
            recent = yn[max(0, i - 5) : i]
            sd = float(np.std(recent, ddof=1)) if recent.size > 1 else 0.0
            # Relative errors need a floor: 1% of the recent level, and never 0.
            floor = 0.01 * float(np.mean(np.abs(yn[max(0, i - 20) : i]))) or 1e-12
            fc: dict[str, float | None] = {p.name: p.predict(float(ta[i])) for p in preds}
            fallback = fc["median5"]
            assert fallback is not None
            for name in names:
                f = fc[name]
                if f is None:
                    f, method = fallback, "median5"
                else:
                    method = name
                if name in BASELINES:
                    lo, hi = f - z * sd, f + z * sd
                else:
                    lo, hi = bands[name].interval(f, floor, sd)
                    bands[name].update(f, obs, floor, lo <= obs <= hi)
                out[name].append(Forecast(i, float(ta[i]), obs, f, lo, hi, method))
            for choice in choices.values():
                choice.choose(fc)
            for name, run in runs.items():
                f, lo, hi, method = run.step(fc, obs, floor, sd)
                out[name].append(Forecast(i, float(ta[i]), obs, f, lo, hi, method))
            for choice in choices.values():
                choice.update(obs, floor)
        for p in preds:
            p.update(float(ta[i]), obs)
    return {name: [_rescale(fc, unit) for fc in fcs] for name, fcs in out.items()}


def _rescale(f: Forecast, unit: float) -> Forecast:
    # Bounds of a wild series may leave the float range: they saturate at the largest float.
    big = sys.float_info.max
    fc = min(max(f.forecast * unit, -big), big)  # Holt's trend can extrapolate past it too
    lower = max(min(f.lower * unit, fc), -big)
    upper = min(max(f.upper * unit, fc), big)
    return Forecast(f.index, f.t, f.observed * unit, fc, lower, upper, f.method)


def walk_forward(
    t: Sequence[float] | FloatArray,
    y: Sequence[float] | FloatArray,
    method: str = "auto",
    *,
    start: int = START,
    coverage: float = 0.8,
) -> list[Forecast]:
    """Walk-forward one-step-ahead forecasts of one method (``auto``: the ensemble)."""
    return walk_forward_all(t, y, start=start, coverage=coverage, methods=(method,))[method]


def forecast_next(
    t: Sequence[float] | FloatArray,
    y: Sequence[float] | FloatArray,
    t_next: float,
    method: str = "auto",
    *,
    coverage: float = 0.8,
) -> Forecast:
    """The forecast for a future time ``t_next`` (observed is NaN), using all of the history."""
    ta, ya = _check(t, y)
    if ta.size < 2:
        raise AnalysisError("at least 2 measurements are needed to forecast")
    if t_next < ta[-1]:
        raise AnalysisError("t_next must not be before the last measurement")
    # One dummy step at t_next: the walk forecasts it from the real history only.
    fcs = walk_forward(
        np.append(ta, t_next),
        np.append(ya, ya[-1]),
        method,
        start=min(START, ta.size),
        coverage=coverage,
    )
    f = fcs[-1]
    return Forecast(f.index, f.t, math.nan, f.forecast, f.lower, f.upper, f.method)


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)

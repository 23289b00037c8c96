"""Diurnal model, as the IEPM-BW seeds fitted it.

f(x) = |a|·sin(x + b) + c, with x the time of day in radians (0 at midnight, 2π at the next),
fitted by least squares (scipy ``curve_fit``) from the seeds' starting values c = mean,
a = stdev, b = π/2, to weekdays and weekends apart. δb is the standard error of b from the fit's
covariance; a path is *diurnal* when δb < 0.2 (the phase is well determined) and its samples
span the day: at least 6 of the day's 8 three-hour slots hold one (``day_coverage`` ≥ 0.75), since
a few hours of a trend fit a piece of sine just as well.

The *simple estimate* needs no fit: c = mean, a = √2·stdev (the amplitude of a sine with the
data's standard deviation) and b given — kept per site from an earlier fit. Both are reported
with their RMS error, so the two can be compared.

Time of day is UTC unless ``utc_offset_hours`` says otherwise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import numpy.typing as npt
from scipy.optimize import OptimizeWarning, curve_fit

from iepm.analysis.statistics import exact_unit

FloatArray = npt.NDArray[np.float64]

DAY = 86400.0
DIURNAL_DELTA_B = 0.2
MIN_POINTS = 5  # three parameters, and a margin for a meaningful covariance
DAY_SLOTS = 8
MIN_DAY_COVERAGE = 0.75


def model(x: FloatArray, a: float, b: float, c: float) -> FloatArray:
    return np.abs(a) * np.sin(x + b) + c


@dataclass(frozen=True)
class SineFit:
    """One fit of f(x) = |a|·sin(x + b) + c; b in [0, 2π)."""

    a: float
    b: float
    c: float
    delta_b: float  # standard error of b; inf when the fit could not determine it
    diurnal: bool
    n: int
    rmse: float
    peak_hour: float  # time of day of the maximum, hours
    day_coverage: float  # share of the day's three-hour slots that hold a sample
    simple_a: float
    simple_b: float
    simple_c: float
    simple_rmse: float

    def as_dict(self) -> dict[str, float | bool | int | None]:
        # JSON has no inf/nan: report them as null.
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }


def time_of_day(t: FloatArray, utc_offset_hours: float = 0.0) -> FloatArray:
    """Radians of the day for Unix times ``t``."""
    seconds = np.mod(t + utc_offset_hours * 3600.0, DAY)
    return 2.0 * math.pi * seconds / DAY


def _rmse(x: FloatArray, y: FloatArray, a: float, b: float, c: float) -> float:
    return float(np.sqrt(np.mean((model(x, a, b, c) - y) ** 2))) if y.size else math.nan


def fit_sine(x: FloatArray, y: FloatArray, site_b: float = math.pi / 2) -> SineFit:
    """Least-squares fit and simple estimate on times of day ``x`` (radians) and values ``y``."""
    top = float(np.max(np.abs(y))) if y.size else 0.0
    if not 0.0 < top < math.inf:
        return _fit_sine(x, y, site_b)
    # Fit in units of a power of two near the largest value (exact scaling): squares of values
    # near the float limit would overflow, and tiny ones would underflow.
    unit = exact_unit(y)
    f = _fit_sine(x, y / unit, site_b)
    return replace(
        f,
        a=f.a * unit,
        c=f.c * unit,
        rmse=f.rmse * unit,
        simple_a=f.simple_a * unit,
        simple_c=f.simple_c * unit,
        simple_rmse=f.simple_rmse * unit,
    )


def _fit_sine(x: FloatArray, y: FloatArray, site_b: float) -> SineFit:
    n = int(y.size)
    nan = math.nan
    if n == 0:
        return SineFit(nan, nan, nan, math.inf, False, 0, nan, nan, 0.0, nan, site_b, nan, nan)
    slots = np.unique(np.floor(np.mod(x, 2 * math.pi) / (2 * math.pi) * DAY_SLOTS))
    coverage = float(slots.size) / DAY_SLOTS
    mean = float(np.mean(y))
    sd = float(np.std(y, ddof=1)) if n > 1 else 0.0
    simple = (math.sqrt(2.0) * sd, site_b % (2 * math.pi), mean)
    simple_rmse = _rmse(x, y, *simple)
    a, b, c, delta_b = sd, math.pi / 2, mean, math.inf
    if n >= MIN_POINTS and sd > 0:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                popt, pcov = curve_fit(model, x, y, p0=[sd, math.pi / 2, mean], maxfev=2000)
            a, b, c = (float(v) for v in popt)
            var_b = float(pcov[1, 1])
            delta_b = math.sqrt(var_b) if math.isfinite(var_b) and var_b >= 0 else math.inf
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            pass  # no convergence: keep the starting values, δb = inf (not diurnal)
    a = abs(a)
    b = b % (2 * math.pi)
    peak = ((math.pi / 2 - b) % (2 * math.pi)) / (2 * math.pi) * 24.0
    return SineFit(
        a=a,
        b=b,
        c=c,
        delta_b=delta_b,
        diurnal=delta_b < DIURNAL_DELTA_B and coverage >= MIN_DAY_COVERAGE,
        n=n,
        rmse=_rmse(x, y, a, b, c),
        peak_hour=peak,
        day_coverage=coverage,
        simple_a=simple[0],
        simple_b=simple[1],
        simple_c=simple[2],
        simple_rmse=simple_rmse,
    )


def fit_diurnal(
    t: Sequence[float] | FloatArray,
    y: Sequence[float] | FloatArray,
    *,
    utc_offset_hours: float = 0.0,
    site_b: float = math.pi / 2,
) -> dict[str, SineFit]:
    """Fits for ``weekdays`` (Mon–Fri) and ``weekends`` (Sat, Sun) of a series."""
    ta = np.asarray(t, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    ok = np.isfinite(ta) & np.isfinite(ya)
    ta, ya = ta[ok], ya[ok]
    local = ta + utc_offset_hours * 3600.0
    # 1970-01-01 was a Thursday: day 0 → weekday 3 (Monday = 0).
    weekday = (np.floor(local / DAY).astype(np.int64) + 3) % 7
    x = time_of_day(ta, utc_offset_hours)
    out = {}
    for name, mask in (("weekdays", weekday < 5), ("weekends", weekday >= 5)):
        out[name] = fit_sine(x[mask], ya[mask], site_b)
    return out

"""Diurnal model, as the IEPM-BW seeds fitted it.

f(x) = |a|·sin(x + b) + c, with x the time of day in radians (0 at midnight, 2π at the next),
fitted by least squares (scipy ``curve_fit``) from the seeds' starting values c = mean,
a = stdev, b = π/2, to weekdays and weekends apart. δb is the standard error of b from the fit's
covariance; a path is *diurnal* when δb < 0.2 (the phase is well determined).

The *simple estimate* needs no fit: c = mean, a = √2·stdev (the amplitude of a sine with the
data's standard deviation) and b given — kept per site from an earlier fit. Both are reported
with their RMS error, so the two can be compared.

Time of day is UTC unless ``utc_offset_hours`` says otherwise.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import OptimizeWarning, curve_fit

FloatArray = npt.NDArray[np.float64]

DAY = 86400.0
DIURNAL_DELTA_B = 0.2
MIN_POINTS = 5  # three parameters, and a margin for a meaningful covariance


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
    n = int(y.size)
    nan = math.nan
    if n == 0:
        return SineFit(nan, nan, nan, math.inf, False, 0, nan, nan, nan, site_b, nan, nan)
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
        diurnal=delta_b < DIURNAL_DELTA_B,
        n=n,
        rmse=_rmse(x, y, a, b, c),
        peak_hour=peak,
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

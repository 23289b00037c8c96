"""Descriptive statistics over numpy columns: what the report pages and the REST API show.

Pure functions of arrays (no archive, no web): quartiles, a fit through the origin, calendar
buckets (UTC hours, days, ISO weeks, months) and their count/min/mean/max/median.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Period = Literal["hour", "day", "week", "month"]
PERIOD_S = {"hour": 3600, "day": 86400, "week": 7 * 86400}
# Unix day 0 (1970-01-01) was a Thursday: shift so that weeks start on Monday (ISO).
MONDAY_SHIFT_DAYS = 3
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


class Description(NamedTuple):
    """Median, quartiles (linear interpolation), IQR, mean and sample stdev (None: no value,
    or one value for the stdev)."""

    median: float | None
    p25: float | None
    p75: float | None
    iqr: float | None
    mean: float | None
    stdev: float | None


class Group(NamedTuple):
    count: int
    min: float
    mean: float
    max: float


class Bucket(NamedTuple):
    start: datetime
    count: int
    min: float
    mean: float
    max: float
    median: float


def exact_unit(x: FloatArray) -> float:
    """A power of two near the largest magnitude of ``x`` (1 when it is empty or all zeros):
    dividing by it is exact, keeps squares of huge values finite and tiny ones from vanishing."""
    top = float(np.max(np.abs(x))) if x.size else 0.0
    return math.ldexp(1.0, math.frexp(top)[1] - 1) if top > 0 else 1.0


def at(t: float) -> datetime:
    """Epoch seconds → aware UTC datetime."""
    return datetime.fromtimestamp(t, UTC)


def describe(values: FloatArray) -> Description:
    """The description of the finite values."""
    v = values[np.isfinite(values)]
    if len(v) == 0:
        return Description(None, None, None, None, None, None)
    p25, median, p75 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    stdev = float(v.std(ddof=1)) if len(v) > 1 else None
    return Description(median, p25, p75, p75 - p25, float(v.mean()), stdev)


def through_origin(x: FloatArray, y: FloatArray) -> tuple[float | None, float | None]:
    """Least squares y = b·x (no intercept) and R² = 1 − SSE / Σ(y − ȳ)² (the centred form:
    the uncentred one Excel prints for a zero intercept flatters any fit away from zero)."""
    sxx = float(np.dot(x, x))
    if len(x) < 2 or sxx == 0:
        return None, None
    slope = float(np.dot(x, y)) / sxx
    sst = float(np.sum((y - y.mean()) ** 2))
    sse = float(np.sum((y - slope * x) ** 2))
    return slope, (1.0 - sse / sst) if sst > 0 else None


def bucket_starts(t: FloatArray, period: Period) -> FloatArray:
    """The start (epoch seconds, UTC) of the hour/day/ISO week/month each moment falls in."""
    if period == "month":
        months = t.astype("datetime64[s]").astype("datetime64[M]")
        return months.astype("datetime64[s]").astype(float)
    if period == "week":
        days = np.floor(t / 86400) + MONDAY_SHIFT_DAYS
        return (days - days % 7 - MONDAY_SHIFT_DAYS) * 86400.0
    step = PERIOD_S[period]
    return np.floor(t / step) * step


def weekday(t: FloatArray) -> FloatArray:
    """0 = Monday … 6 = Sunday (UTC) of each moment."""
    return (np.floor(t / 86400) + MONDAY_SHIFT_DAYS) % 7


def group(keys: FloatArray, values: FloatArray) -> dict[float, Group]:
    """key → count, min, mean, max of the finite values."""
    ok = np.isfinite(values)
    keys, values = keys[ok], values[ok]
    out: dict[float, Group] = {}
    if len(keys) == 0:
        return out
    uniq, inverse = np.unique(keys, return_inverse=True)
    counts = np.bincount(inverse)
    sums = np.bincount(inverse, weights=values)
    mins = np.full(len(uniq), np.inf)
    maxs = np.full(len(uniq), -np.inf)
    np.minimum.at(mins, inverse, values)
    np.maximum.at(maxs, inverse, values)
    for i, key in enumerate(uniq):
        out[float(key)] = Group(
            int(counts[i]), float(mins[i]), float(sums[i] / counts[i]), float(maxs[i])
        )
    return out


def aggregate(t: FloatArray, values: FloatArray, period: Period) -> list[Bucket]:
    """Per calendar period (UTC; weeks start on Monday) of the finite values, oldest first."""
    ok = np.isfinite(values)
    t, v = t[ok], values[ok]
    starts = bucket_starts(t, period)
    return [
        Bucket(at(start), g.count, g.min, g.mean, g.max, float(np.median(v[starts == start])))
        for start, g in sorted(group(starts, v).items())
    ]


def share_better(history: FloatArray, latest: float, better: str) -> float:
    """Share of the history that was better than the latest value: 0 = the best seen."""
    if better == "higher":
        return float(np.mean(history > latest))
    return float(np.mean(history < latest))

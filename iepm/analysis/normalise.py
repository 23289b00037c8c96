"""The light estimator normalised by the heavy tests (ABwE's use of iperf: the seed's Fig. 12).

Per path, each successful routine iperf3 run is paired with the available-bandwidth estimate
(``abw``) nearest to it in time, within ``MAX_GAP_S``; the pairs of the last ``WINDOW`` give a
fit through the origin, iperf3 ≈ slope × estimate, with its R² (of iperf3 about its mean, as a
correlation would be read). The normalised estimate is slope × raw: what iperf3 would report
now, from the light probe sent once a minute. A path with fewer than ``MIN_PAIRS`` pairs has no
fit: its estimates stay raw (never a guessed slope).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select

from iepm.store import Archive
from iepm.store.filters import result_conditions
from iepm.store.schema import results as RESULTS

ESTIMATOR = ("abw", "available_bps")
REFERENCE = ("iperf3", "throughput_bps")
MAX_GAP_S = 900.0  # an estimate more than 15 min from the iperf3 run says nothing of it
WINDOW = timedelta(days=60)  # as the seed's 60-day means
MIN_PAIRS = 3


@dataclass(frozen=True)
class Fit:
    slope: float  # iperf3 ÷ estimate
    r2: float | None  # None when iperf3 did not vary
    n: int

    def normalised(self, raw: float) -> float:
        return self.slope * raw


def pair(
    estimates: Sequence[tuple[float, float]],
    references: Iterable[tuple[float, float]],
    max_gap_s: float = MAX_GAP_S,
) -> list[tuple[float, float]]:
    """(estimate, reference) for each reference (time, value) with an estimate (time, value)
    within ``max_gap_s``: the nearest one. ``estimates`` sorted by time."""
    times = [t for t, _ in estimates]
    out = []
    for t, y in references:
        i = bisect.bisect_left(times, t)
        near = [j for j in (i - 1, i) if 0 <= j < len(times)]
        if not near:
            continue
        j = min(near, key=lambda k: abs(times[k] - t))
        if abs(times[j] - t) <= max_gap_s:
            out.append((estimates[j][1], y))
    return out


def fit(pairs: Sequence[tuple[float, float]]) -> Fit | None:
    """Least squares through the origin, y = slope·x; None below MIN_PAIRS or without x."""
    pairs = [(x, y) for x, y in pairs if math.isfinite(x) and math.isfinite(y) and x > 0]
    if len(pairs) < MIN_PAIRS:
        return None
    sxx = sum(x * x for x, _ in pairs)
    slope = sum(x * y for x, y in pairs) / sxx
    mean_y = sum(y for _, y in pairs) / len(pairs)
    ss_tot = sum((y - mean_y) ** 2 for _, y in pairs)
    ss_res = sum((y - slope * x) ** 2 for x, y in pairs)
    r2 = None if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return Fit(slope=slope, r2=r2, n=len(pairs))


def estimator_fits(archive: Archive, now: datetime) -> dict[str, Fit]:
    """Each path's fit over the last WINDOW, from the archive's routine results."""
    since = now - WINDOW
    series: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for probe, key in (ESTIMATOR, REFERENCE):
        query = (
            select(RESULTS.c.target, RESULTS.c.started_at, RESULTS.c.data)
            .where(*result_conditions(probe=probe, since=since, outcome="ok"))
            .order_by(RESULTS.c.started_at)
        )
        with archive.reading("cannot read results for the estimator fit") as conn:
            for target, started_at, data in conn.execute(query):
                value = data.get(key) if isinstance(data, dict) else None
                if isinstance(value, int | float) and not isinstance(value, bool):
                    series[(probe, str(target))].append((started_at.timestamp(), float(value)))
    fits = {}
    for (probe, target), estimates in series.items():
        if probe != ESTIMATOR[0]:
            continue
        found = fit(pair(estimates, series.get((REFERENCE[0], target), [])))
        if found is not None:
            fits[target] = found
    return fits

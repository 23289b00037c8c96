"""Per-day summaries of every path's results, kept in step with the results they summarise.

Views that span a year (weekly means on a target page, the monitors of a target) read one row
per path, day and metric instead of every result: a year of a 90-minute path is 5,840 results
but 365 days. They change in the same transaction as the results they summarise, so they cannot
disagree: a new result is added to its day's sums (:func:`accumulate`, an upsert: no read of the
day's results), and the day of a replaced result — a re-extracted run whose reading changed — is
recomputed from its results (:func:`refresh`), which running sums could not do.

Days are UTC days. Per day and metric: ``n`` successful results with a finite value, their
``total``, ``total_sq`` (for a standard deviation), ``minimum`` and ``maximum``. The pseudo-metric
``runs`` counts every result in ``n`` (any outcome) and the successful ones in ``total``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, time, timedelta
from functools import cache
from typing import Any

from sqlalchemy import Connection, Insert, delete, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite

from iepm.probes import metrics_of
from iepm.results import Purpose
from iepm.store.schema import daily as DAILY
from iepm.store.schema import results as RESULTS

RUNS = "runs"
PathDay = tuple[str, str, str, date]
# What ``summarise`` reads of each result, in its order.
SOURCE = (
    RESULTS.c.target,
    RESULTS.c.monitor,
    RESULTS.c.probe,
    RESULTS.c.started_at,
    RESULTS.c.outcome,
    RESULTS.c.data,
)
INSERT_CHUNK = 5000
# Only the routine series is summarised: a study's transfers are not the path's measurements.
ROLLED_UP_PURPOSE = Purpose.ROUTINE.value


def day_of(moment: datetime) -> date:
    return moment.astimezone(UTC).date()


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


class _Sums:
    __slots__ = ("maximum", "minimum", "n", "total", "total_sq")

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.total_sq = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.total_sq += value * value
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


def rollup_keys(probe: str) -> tuple[str, ...]:
    """The metrics of ``probe`` summarised per day: those its METRICS mark ``rollup`` (read
    from the registry at each call, so a probe registered later is rolled up too)."""
    return tuple(m.key for m in metrics_of(probe) if m.rollup)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def summarise(
    rows: Iterable[tuple[str, str, str, datetime, str, dict[str, Any] | None]],
    days: set[date] | None = None,
) -> Iterator[dict[str, Any]]:
    """Daily rows from results given as (target, monitor, probe, started_at, outcome, data),
    only for ``days`` when given."""
    sums: dict[tuple[str, str, str, date, str], _Sums] = {}
    keys: dict[str, tuple[str, ...]] = {}
    for target, monitor, probe, started_at, outcome, data in rows:
        day = day_of(started_at)
        if days is not None and day not in days:
            continue
        runs = sums.setdefault((target, monitor, probe, day, RUNS), _Sums())
        runs.n += 1
        if outcome != "ok":
            continue
        runs.total += 1
        if probe not in keys:
            keys[probe] = rollup_keys(probe)
        for key in keys[probe]:
            value = _number((data or {}).get(key))
            if value is not None:
                sums.setdefault((target, monitor, probe, day, key), _Sums()).add(value)
    for (target, monitor, probe, day, metric), s in sums.items():
        counted = metric != RUNS
        yield {
            "target": target,
            "monitor": monitor,
            "probe": probe,
            "day": day,
            "metric": metric,
            "n": s.n,
            "total": s.total,
            "total_sq": s.total_sq if counted else None,
            "minimum": s.minimum if counted else None,
            "maximum": s.maximum if counted else None,
        }


@cache
def _adding(dialect: str) -> Insert:
    """The upsert that adds a day's new sums to the stored ones (built once: building it costs
    more than running it)."""
    if dialect == "sqlite":
        statement, least, greatest = sqlite.insert(DAILY), func.min, func.max
    else:
        statement, least, greatest = postgresql.insert(DAILY), func.least, func.greatest
    new = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=list(DAILY.primary_key.columns),
        set_={
            # NULL stays NULL (the runs rows): + and both functions give NULL on NULL.
            "n": DAILY.c.n + new.n,
            "total": DAILY.c.total + new.total,
            "total_sq": DAILY.c.total_sq + new.total_sq,
            "minimum": least(DAILY.c.minimum, new.minimum),
            "maximum": greatest(DAILY.c.maximum, new.maximum),
        },
    )


def accumulate(
    conn: Connection, rows: Iterable[tuple[str, str, str, datetime, str, dict[str, Any] | None]]
) -> None:
    """Add results just inserted (as for :func:`summarise`) to their days, inside the caller's
    transaction. Only for new results: a replaced one would be counted twice (use refresh)."""
    deltas = list(summarise(rows))
    statement = _adding(conn.dialect.name)
    for start in range(0, len(deltas), INSERT_CHUNK):
        conn.execute(statement, deltas[start : start + INSERT_CHUNK])


def refresh(conn: Connection, keys: Iterable[PathDay]) -> None:
    """Recompute the daily rows of ``keys`` from the results, inside the caller's transaction."""
    by_path: dict[tuple[str, str, str], set[date]] = defaultdict(set)
    for target, monitor, probe, day in keys:
        by_path[(target, monitor, probe)].add(day)
    for (target, monitor, probe), days in by_path.items():
        same_path = (DAILY.c.target == target, DAILY.c.monitor == monitor, DAILY.c.probe == probe)
        query = select(*SOURCE).where(
            RESULTS.c.target == target,
            RESULTS.c.probe == probe,
            RESULTS.c.monitor == monitor,
            RESULTS.c.started_at >= day_start(min(days)),
            RESULTS.c.started_at < day_start(max(days) + timedelta(days=1)),
            RESULTS.c.purpose == ROLLED_UP_PURPOSE,
        )
        rows = list(summarise(conn.execute(query), days))
        conn.execute(delete(DAILY).where(*same_path, DAILY.c.day.in_(sorted(days))))
        if rows:
            conn.execute(insert(DAILY), rows)


def rebuild(conn: Connection, *, by_purpose: bool = True) -> int:
    """Recompute every daily row from all (routine) results (a migration, or results written
    around the archive); returns the number of rows written. ``by_purpose`` False: for a schema
    older than revision 0004, whose results have no purpose (all were routine then).
    It runs only in migrations that precede pruning (`iepm archive prune` keeps the summaries of
    removed results): a later migration calling it would lose the pruned days' summaries."""
    conn.execute(delete(DAILY))
    routine = [RESULTS.c.purpose == ROLLED_UP_PURPOSE] if by_purpose else []
    query = select(*SOURCE).where(*routine).order_by(*SOURCE[:4])  # path by path, oldest first
    written = 0
    batch: list[dict[str, Any]] = []
    path_rows: list[Any] = []
    path: tuple[str, str, str] | None = None
    # One path at a time: memory stays at one path's results whatever the archive's size.
    for row in conn.execute(query.execution_options(yield_per=20_000)):
        key = (row[0], row[1], row[2])
        if key != path and path_rows:
            batch.extend(summarise(path_rows))
            path_rows = []
            if len(batch) >= INSERT_CHUNK:
                conn.execute(insert(DAILY), batch)
                written += len(batch)
                batch = []
        path = key
        path_rows.append(tuple(row))
    batch.extend(summarise(path_rows))
    if batch:
        conn.execute(insert(DAILY), batch)
        written += len(batch)
    return written

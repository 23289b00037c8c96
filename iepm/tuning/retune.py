"""When a path should be tuned again: never tuned, tuned too long ago, a step change (alert)
or a route change since its last complete sweep."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from iepm.analysis.cause import ROUTE_PROBE, Route, route_of, same_route
from iepm.results import utcnow
from iepm.store import Archive
from iepm.store.schema import alerts
from iepm.tuning.store import list_studies

TUNING_CAUSE = "tuning"


def latest_route(archive: Archive, target: str) -> Route | None:
    """The route of the latest successful traceroute to ``target`` (among its last 20), if any."""
    for result in archive.results(probe=ROUTE_PROBE, target=target, limit=20, order="desc"):
        route = route_of(result)
        if route is not None:
            return route
    return None


def retune_reasons(
    archive: Archive,
    *,
    monitor: str,
    target: str,
    period_s: float,
    now: datetime | None = None,
) -> list[str]:
    """Why ``target`` needs a new sweep now (empty: it does not)."""
    now = now or utcnow()
    sweeps = [
        s
        for s in list_studies(archive, kind="sweep", target=target, monitor=monitor)
        if not s.partial
    ]
    if not sweeps:
        return ["never tuned (no complete sweep)"]
    last = sweeps[0]
    reasons = []
    age = now - last.started_at
    if age > timedelta(seconds=period_s):
        reasons.append(
            f"last tuned {age.total_seconds() / 86400:.1f} days ago "
            f"(period {period_s / 86400:g} days)"
        )
    # A change the new tuning itself explains (cause "tuning") is not a reason to tune again:
    # it would re-tune every path after each sweep.
    query = select(alerts).where(
        (alerts.c.target == target)
        & (alerts.c.monitor == monitor)
        & (alerts.c.detected_at > last.started_at)
        & (alerts.c.cause != TUNING_CAUSE)
    )
    with archive.reading(f"cannot read alerts for {target}") as conn:
        for row in conn.execute(query):
            reasons.append(
                f"{row.cause} change in {row.probe} {row.metric} at {row.change_at:%Y-%m-%d %H:%M}Z"
            )
    then: Any = last.params.get("route")
    current = latest_route(archive, target)
    # A silent hop (*) is not a new router: it matches any address (cause.same_route).
    if then is not None and current is not None and not same_route(list(then), current):
        reasons.append(f"route changed since the last sweep ({len(then)} → {len(current)} hops)")
    return reasons

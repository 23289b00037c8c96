"""Alerts: step changes found in a path's series, stored in the archive's ``alerts`` table.

An alert says which series changed (monitor, target, probe, metric), when it changed
(``change_at``: the first sample of the new level) and when that was noticed (``detected_at``),
the levels before and after, and the likely cause (``route``, ``host``, ``tuning`` or
``unknown``) with its evidence in ``details``.

A route change is an alert of its own: probe ``traceroute``, metric ``route``, direction
``changed``, no levels, cause ``route``; ``details`` has the routes before and after and
``hops_changed`` (silent hops never count). A step that the route caused is a second alert on
its own metric, whose ``details["route"]["alert_id"]`` names the route alert: the two are one
event (:func:`events`). ``delivered_at`` / ``delivery_attempts`` record the
webhook's progress (:mod:`iepm.analysis.webhook`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from iepm.results import format_time, new_result_id
from iepm.store import Archive
from iepm.store.schema import alerts as ALERTS

CAUSES = ("route", "host", "tuning", "unknown")
ALERT_SCHEMA = 1
ROUTE_METRIC = "route"


@dataclass(frozen=True)
class Alert:
    monitor: str
    target: str
    probe: str
    metric: str
    detected_at: datetime
    change_at: datetime
    direction: str  # "up" or "down"
    before: float | None
    after: float | None
    change_percent: float | None
    cause: str
    details: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_result_id)
    delivered_at: datetime | None = None
    delivery_attempts: int = 0

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"cause {self.cause!r} is not one of {', '.join(CAUSES)}")
        directions = ("changed",) if self.metric == ROUTE_METRIC else ("up", "down")
        if self.direction not in directions:
            raise ValueError(f"direction {self.direction!r} is not {' or '.join(directions)}")

    @property
    def summary(self) -> str:
        """One line for people: ``cern-1 ping rtt_avg_ms up 40.1 → 92.3 (+130%), cause route``."""
        if self.metric == ROUTE_METRIC:
            hops = ", ".join(
                f"hop {h['ttl']} {h['before'] or '(none)'} → {h['after'] or '(none)'}"
                for h in self.details.get("hops_changed", [])
            )
            return f"{self.target} route changed: {hops or 'hops differ'}"
        pct = f" ({self.change_percent:+.0f}%)" if self.change_percent is not None else ""
        return (
            f"{self.target} {self.probe} {self.metric} {self.direction} "
            f"{_g(self.before)} → {_g(self.after)}{pct}, likely cause: {self.cause}"
        )

    def payload(self) -> dict[str, Any]:
        """The webhook's JSON body (times ISO 8601 UTC; no NaN)."""
        return {
            "schema": ALERT_SCHEMA,
            "kind": "iepm.alert",
            "id": self.id,
            "monitor": self.monitor,
            "target": self.target,
            "probe": self.probe,
            "metric": self.metric,
            "detected_at": format_time(self.detected_at),
            "change_at": format_time(self.change_at),
            "direction": self.direction,
            "before": self.before,
            "after": self.after,
            "change_percent": self.change_percent,
            "cause": self.cause,
            "summary": self.summary,
            "details": self.details,
        }


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:.4g}"


def finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def store_alert(archive: Archive, alert: Alert) -> None:
    """Insert the alert (its id is new: a second insert of the same alert fails)."""
    row = {
        "id": alert.id,
        "monitor": alert.monitor,
        "target": alert.target,
        "probe": alert.probe,
        "metric": alert.metric,
        "detected_at": alert.detected_at,
        "change_at": alert.change_at,
        "direction": alert.direction,
        "before": finite_or_none(alert.before),
        "after": finite_or_none(alert.after),
        "change_percent": finite_or_none(alert.change_percent),
        "cause": alert.cause,
        "details": alert.details,
        "delivered_at": alert.delivered_at,
        "delivery_attempts": alert.delivery_attempts,
    }
    with archive.writing(f"cannot store alert {alert.id} for {alert.target}") as conn:
        conn.execute(insert(ALERTS), row)


def record_delivery(
    archive: Archive, alert_id: str, *, attempts: int, delivered_at: datetime | None
) -> None:
    """Add ``attempts`` to the alert's delivery attempts; set ``delivered_at`` when it arrived."""
    values: dict[str, Any] = {"delivery_attempts": ALERTS.c.delivery_attempts + attempts}
    if delivered_at is not None:
        values["delivered_at"] = delivered_at
    with archive.writing(f"cannot record the delivery of alert {alert_id}") as conn:
        conn.execute(update(ALERTS).where(ALERTS.c.id == alert_id).values(**values))


def _alert(row: Any) -> Alert:
    return Alert(**dict(row))


def load_alerts(
    archive: Archive,
    *,
    monitor: str | None = None,
    target: str | None = None,
    since: datetime | None = None,
    undelivered: bool = False,
    max_attempts: int | None = None,
    limit: int | None = None,
) -> list[Alert]:
    """Stored alerts, oldest first (``since`` compares ``detected_at``, inclusive).

    ``undelivered``: only those not yet delivered; ``max_attempts``: only those tried fewer times.
    """
    query = select(ALERTS)
    if monitor is not None:
        query = query.where(ALERTS.c.monitor == monitor)
    if target is not None:
        query = query.where(ALERTS.c.target == target)
    if since is not None:
        query = query.where(ALERTS.c.detected_at >= since)
    if undelivered:
        query = query.where(ALERTS.c.delivered_at.is_(None))
    if max_attempts is not None:
        query = query.where(ALERTS.c.delivery_attempts < max_attempts)
    query = query.order_by(ALERTS.c.detected_at, ALERTS.c.id).limit(limit)
    with archive.reading("cannot read alerts") as conn:
        return [_alert(r) for r in conn.execute(query).mappings()]


def events(alerts: list[Alert]) -> list[list[Alert]]:
    """Alerts grouped by the event behind them, oldest first: a step caused by a route change
    (``details["route"]["alert_id"]``) joins that route change's alert; any other alert is an
    event of its own."""
    groups: dict[str, list[Alert]] = {}
    for alert in alerts:
        route = alert.details.get("route") if isinstance(alert.details, dict) else None
        linked = route.get("alert_id") if isinstance(route, dict) else None
        groups.setdefault(linked if linked is not None else alert.id, []).append(alert)
    return list(groups.values())


def with_delivery(alert: Alert, attempts: int, delivered_at: datetime | None) -> Alert:
    return replace(
        alert,
        delivery_attempts=alert.delivery_attempts + attempts,
        delivered_at=delivered_at or alert.delivered_at,
    )

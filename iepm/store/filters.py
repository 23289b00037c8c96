"""The one place that turns result filters into SQL conditions.

Every reader of the ``results`` table (the archive's queries, the web pages, the daily rollup,
the alert watcher's history) builds its WHERE clause here, so that a filter means the same thing
everywhere — above all ``purpose``: routine views read routine results only, and a tuning or
impact study's transfers never enter a path's series, statistics, rollups or alerts.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import ColumnElement, FromClause

from iepm.results import Outcome, Purpose
from iepm.store.schema import results as RESULTS

__all__ = ["ROUTINE", "result_conditions"]

ROUTINE = Purpose.ROUTINE


def result_conditions(
    table: FromClause = RESULTS,
    *,
    probe: str | Sequence[str] | None = None,
    target: str | None = None,
    monitor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    outcome: Outcome | str | None = None,
    purpose: Purpose | str | None = ROUTINE,
) -> list[ColumnElement[bool]]:
    """Conditions on ``table`` (the results table, or an alias of it) for every filter given:
    ``probe`` one name or several, ``since`` inclusive, ``until`` exclusive, ``purpose`` the
    routine series by default (``None`` for results of every purpose)."""
    c = table.c
    conditions: list[ColumnElement[bool]] = []
    if isinstance(probe, str):
        conditions.append(c.probe == probe)
    elif probe is not None:
        conditions.append(c.probe.in_(list(probe)))
    if target is not None:
        conditions.append(c.target == target)
    if monitor is not None:
        conditions.append(c.monitor == monitor)
    if since is not None:
        conditions.append(c.started_at >= since)
    if until is not None:
        conditions.append(c.started_at < until)
    if outcome is not None:
        conditions.append(c.outcome == Outcome(outcome).value)
    if purpose is not None:
        conditions.append(c.purpose == Purpose(purpose).value)
    return conditions

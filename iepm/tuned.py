"""Tuned probe parameters per path: chosen by a study (``iepm tune``), used by the scheduler.

The scheduler builds each probe's spec from the config's ``[defaults]``, then the tuned
parameters stored for the path, then the target's own settings in the config — so what a user
wrote for a target always wins, and a tuned value replaces only a default.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, delete, insert, select

from iepm.results import utcnow
from iepm.store import Archive
from iepm.store.schema import tuned_params


def _path(monitor: str, target: str, probe: str) -> ColumnElement[bool]:
    return (
        (tuned_params.c.monitor == monitor)
        & (tuned_params.c.target == target)
        & (tuned_params.c.probe == probe)
    )


def save_tuned(
    archive: Archive,
    *,
    monitor: str,
    target: str,
    probe: str,
    params: dict[str, Any],
    study_id: str | None = None,
    set_at: datetime | None = None,
) -> None:
    """Store (replacing any earlier choice) the parameters ``probe`` should use on this path."""
    with archive.writing(f"cannot store tuned {probe} parameters for {target}") as conn:
        conn.execute(delete(tuned_params).where(_path(monitor, target, probe)))
        conn.execute(
            insert(tuned_params).values(
                monitor=monitor,
                target=target,
                probe=probe,
                params=params,
                study_id=study_id,
                set_at=set_at or utcnow(),
            )
        )


def load_tuned(archive: Archive, *, monitor: str, target: str, probe: str) -> dict[str, Any]:
    """The stored parameters for this path and probe, or ``{}`` when none were chosen."""
    query = select(tuned_params.c.params).where(_path(monitor, target, probe))
    with archive.reading(f"cannot read tuned {probe} parameters for {target}") as conn:
        params = conn.execute(query).scalar_one_or_none()
    return dict(params) if params else {}

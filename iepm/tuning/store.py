"""Studies in the archive's ``studies`` table, written point by point.

A study row is inserted (``partial`` true) before its first measurement and rewritten after
every point, so a Ctrl-C, a dead target or even a ``kill -9`` keeps everything measured so far;
``finish`` writes the summary and clears ``partial`` only when the study ran to its end.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update

from iepm.results import Purpose, Result, utcnow
from iepm.store import Archive
from iepm.store.schema import studies


@dataclass
class Study:
    kind: str
    monitor: str
    target: str
    params: dict[str, Any]
    data: dict[str, Any] = field(default_factory=lambda: {"points": []})
    summary: dict[str, Any] = field(default_factory=dict)
    partial: bool = True
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: datetime = field(default_factory=utcnow)
    finished_at: datetime | None = None

    @property
    def points(self) -> list[dict[str, Any]]:
        points: list[dict[str, Any]] = self.data.setdefault("points", [])
        return points

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "monitor": self.monitor,
            "target": self.target,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "partial": self.partial,
            "params": self.params,
            "data": self.data,
            "summary": self.summary,
        }


class StudyRecorder:
    """Keeps one study row in step with the measurements, and the probe results beside it."""

    def __init__(self, archive: Archive, study: Study) -> None:
        self.archive = archive
        self.study = study
        with archive.writing(f"cannot record {study.kind} study of {study.target}") as conn:
            conn.execute(insert(studies).values(**_row(study)))

    def store_result(self, result: Result | None) -> str | None:
        """Store a probe run as a study result (exports show it; the path's routine series,
        rollups and alerts do not); its id."""
        if result is None:
            return None
        self.archive.add(result.model_copy(update={"purpose": Purpose.STUDY}))
        return result.id

    def add_point(self, point: dict[str, Any]) -> None:
        self.study.points.append(point)
        self._save()

    def finish(self, summary: dict[str, Any], *, partial: bool) -> Study:
        self.study.summary = summary
        self.study.partial = partial
        self.study.finished_at = utcnow()
        self._save()
        return self.study

    def _save(self) -> None:
        save_study(self.archive, self.study)


def save_study(archive: Archive, study: Study) -> None:
    """Rewrite a stored study's data, summary, partial flag and end."""
    with archive.writing(f"cannot update study {study.id}") as conn:
        conn.execute(
            update(studies)
            .where(studies.c.id == study.id)
            .values(
                data=study.data,
                summary=study.summary,
                partial=study.partial,
                finished_at=study.finished_at,
            )
        )


def _row(study: Study) -> dict[str, Any]:
    return {
        "id": study.id,
        "kind": study.kind,
        "monitor": study.monitor,
        "target": study.target,
        "started_at": study.started_at,
        "finished_at": study.finished_at,
        "partial": study.partial,
        "params": study.params,
        "data": study.data,
        "summary": study.summary,
    }


def _study(row: Any) -> Study:
    return Study(
        id=row.id,
        kind=row.kind,
        monitor=row.monitor,
        target=row.target,
        started_at=row.started_at,
        finished_at=row.finished_at,
        partial=bool(row.partial),
        params=dict(row.params or {}),
        data=dict(row.data or {}),
        summary=dict(row.summary or {}),
    )


def load_study(archive: Archive, study_id: str) -> Study | None:
    """A study by id, or by a unique prefix of its id (as ``iepm study list`` shows it)."""
    query = select(studies).where(studies.c.id.startswith(study_id, autoescape=True)).limit(2)
    with archive.reading(f"cannot read study {study_id}") as conn:
        rows = conn.execute(query).all()
    return _study(rows[0]) if len(rows) == 1 else None


def list_studies(
    archive: Archive,
    *,
    kind: str | None = None,
    target: str | None = None,
    monitor: str | None = None,
    limit: int | None = None,
) -> list[Study]:
    """Studies, newest first."""
    query = select(studies)
    if kind is not None:
        query = query.where(studies.c.kind == kind)
    if target is not None:
        query = query.where(studies.c.target == target)
    if monitor is not None:
        query = query.where(studies.c.monitor == monitor)
    query = query.order_by(studies.c.started_at.desc(), studies.c.id).limit(limit)
    with archive.reading("cannot list studies") as conn:
        return [_study(row) for row in conn.execute(query)]

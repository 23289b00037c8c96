"""Live samples: what the running monitor sees as it happens, for the live pages.

``iepm run`` and ``iepm serve`` are separate processes (often on separate hosts), so the archive
is their channel. The monitor ``publish``-es each ping reply (and its interface rates) as a row
of ``live_samples``; the web server asks ``latest_id`` (an index lookup on either database) or,
on PostgreSQL, waits for the ``NOTIFY`` that every publish sends, then reads ``read_since`` its
last id. Rows older than ``KEEP_S`` are pruned by the writer: the live table is a short ring, and
what the archive keeps for years is the per-minute result that carries the same replies.

``set_running``/``clear_running`` name the tests running now, shown beside the interface rates.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from sqlalchemy import and_, delete, func, select

from iepm.store.archive import Archive
from iepm.store.filters import result_conditions
from iepm.store.schema import live_running as RUNNING
from iepm.store.schema import live_samples as SAMPLES
from iepm.store.schema import results as RESULTS

# How long live samples stay: the longest live view (an hour of per-second RTTs) and no more.
KEEP_S = 3600.0
# Prune at most this often (seconds): a DELETE per publish would double the writes.
PRUNE_EVERY_S = 60.0
# The PostgreSQL channel that every publish notifies, with the newest id as payload.
CHANNEL = "iepm_live"


class LiveSample(NamedTuple):
    """One live value: ``value`` None is a lost reply (drawn as a gap)."""

    target: str
    probe: str
    metric: str
    t_s: float
    value: float | None


class Running(NamedTuple):
    monitor: str
    probe: str
    target: str
    params: dict[str, Any]
    started_s: float


_last_prune_s: dict[str, float] = {}


def publish(archive: Archive, monitor: str, samples: Iterable[LiveSample]) -> int:
    """Store samples in one transaction (and notify listeners on PostgreSQL). Returns the newest
    id, or 0 if ``samples`` was empty."""
    rows = [
        {"monitor": monitor, "target": s.target, "probe": s.probe, "metric": s.metric,
         "t_s": float(s.t_s), "value": None if s.value is None else float(s.value)}
        for s in samples
    ]  # fmt: skip
    if not rows:
        return 0
    now_s = time.time()
    with archive.writing("cannot store live samples") as conn:
        conn.execute(SAMPLES.insert(), rows)
        newest = int(conn.execute(select(func.max(SAMPLES.c.id))).scalar_one() or 0)
        if now_s - _last_prune_s.get(archive.url, 0.0) >= PRUNE_EVERY_S:
            conn.execute(delete(SAMPLES).where(SAMPLES.c.t_s < now_s - KEEP_S))
            conn.execute(delete(RUNNING).where(RUNNING.c.expires_s < now_s))
            _last_prune_s[archive.url] = now_s
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"NOTIFY {CHANNEL}, '{newest}'")
    return newest


def latest_id(archive: Archive) -> int:
    """The newest sample's id (0 if none): a cheap "anything new?" for pollers."""
    with archive.reading("cannot read live samples") as conn:
        return int(conn.execute(select(func.max(SAMPLES.c.id))).scalar_one() or 0)


def read_since(
    archive: Archive, after_id: int, *, limit: int = 10_000
) -> list[tuple[int, LiveSample]]:
    """Samples with id > ``after_id``, oldest first, at most ``limit``."""
    query = (
        select(SAMPLES.c.id, SAMPLES.c.target, SAMPLES.c.probe, SAMPLES.c.metric,
               SAMPLES.c.t_s, SAMPLES.c.value)
        .where(SAMPLES.c.id > after_id)
        .order_by(SAMPLES.c.id)
        .limit(limit)
    )  # fmt: skip
    with archive.reading("cannot read live samples") as conn:
        return [(int(row[0]), LiveSample(*row[1:])) for row in conn.execute(query)]


def read_window(
    archive: Archive,
    since_s: float,
    *,
    probe: str | None = None,
    targets: Sequence[str] | None = None,
) -> list[tuple[int, LiveSample]]:
    """Samples taken at or after ``since_s`` (epoch seconds), oldest first: what a live page
    draws when it opens, before it follows ``read_since``."""
    conditions = [SAMPLES.c.t_s >= since_s]
    if probe is not None:
        conditions.append(SAMPLES.c.probe == probe)
    if targets is not None:
        conditions.append(SAMPLES.c.target.in_(list(targets)))
    query = (
        select(SAMPLES.c.id, SAMPLES.c.target, SAMPLES.c.probe, SAMPLES.c.metric,
               SAMPLES.c.t_s, SAMPLES.c.value)
        .where(and_(*conditions))
        .order_by(SAMPLES.c.id)
    )  # fmt: skip
    with archive.reading("cannot read live samples") as conn:
        return [(int(row[0]), LiveSample(*row[1:])) for row in conn.execute(query)]


def set_running(
    archive: Archive,
    monitor: str,
    probe: str,
    target: str,
    params: dict[str, Any],
    *,
    deadline_s: float,
) -> None:
    """Mark a test as running until it is cleared or ``deadline_s`` seconds pass."""
    now_s = time.time()
    key = and_(RUNNING.c.monitor == monitor, RUNNING.c.probe == probe, RUNNING.c.target == target)
    # params go through JSON so a value the column cannot hold fails here, not in the reader.
    row = {"monitor": monitor, "probe": probe, "target": target,
           "params": json.loads(json.dumps(params, default=str)),
           "started_s": now_s, "expires_s": now_s + deadline_s}  # fmt: skip
    with archive.writing("cannot store the running test") as conn:
        conn.execute(delete(RUNNING).where(key))
        conn.execute(RUNNING.insert(), row)


def clear_running(archive: Archive, monitor: str, probe: str, target: str) -> None:
    key = and_(RUNNING.c.monitor == monitor, RUNNING.c.probe == probe, RUNNING.c.target == target)
    with archive.writing("cannot clear the running test") as conn:
        conn.execute(delete(RUNNING).where(key))


def running(archive: Archive) -> list[Running]:
    """The tests running now (not expired), oldest first."""
    query = (
        select(RUNNING.c.monitor, RUNNING.c.probe, RUNNING.c.target, RUNNING.c.params,
               RUNNING.c.started_s)
        .where(RUNNING.c.expires_s >= time.time())
        .order_by(RUNNING.c.started_s)
    )  # fmt: skip
    with archive.reading("cannot read the running tests") as conn:
        return [Running(*row) for row in conn.execute(query)]


# -- reads for the live pages' stream ---------------------------------------------------------


class LiveResult(NamedTuple):
    """A new result as the live pages see it: its scalar figures only (no per-packet arrays)."""

    id: str
    probe: str
    target: str
    t_s: float
    succeeded: bool
    figures: dict[str, float]


def recent_result_ids(archive: Archive, probes: Sequence[str], since_s: float) -> dict[str, float]:
    """Ids (with their start, epoch seconds) of the results of ``probes`` started at or after
    ``since_s``: what a poller compares with what it has seen (results have no growing id, and
    one stored late may have started early). Uses the (probe, started_at) index."""
    if not probes:
        return {}
    since = datetime.fromtimestamp(since_s, UTC)
    query = select(RESULTS.c.id, RESULTS.c.started_at).where(
        *result_conditions(probe=list(probes), since=since)
    )
    with archive.reading("cannot read new results") as conn:
        return {str(row[0]): row[1].timestamp() for row in conn.execute(query)}


def results_by_id(archive: Archive, ids: Sequence[str]) -> list[LiveResult]:
    """The results named, oldest first, with the numbers of their ``data``."""
    if not ids:
        return []
    query = (
        select(RESULTS.c.id, RESULTS.c.probe, RESULTS.c.target, RESULTS.c.started_at,
               RESULTS.c.succeeded, RESULTS.c.data)
        .where(RESULTS.c.id.in_(list(ids)))
        .order_by(RESULTS.c.started_at)
    )  # fmt: skip
    with archive.reading("cannot read new results") as conn:
        rows = conn.execute(query).all()
    return [
        LiveResult(str(r[0]), str(r[1]), str(r[2]), r[3].timestamp(), bool(r[4]), _figures(r[5]))
        for r in rows
    ]


def _figures(data: Any) -> dict[str, float]:
    if not isinstance(data, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in data.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def pg_conninfo(archive: Archive) -> str | None:
    """The libpq URL of a PostgreSQL archive (for a LISTEN connection of its own), None for
    SQLite."""
    url = archive._engine.url  # the store's own engine: this module is part of the store
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)

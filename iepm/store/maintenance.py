"""Archive maintenance on PostgreSQL (``iepm archive maintain``, and the end of every
``iepm archive prune``): closed months stored by path, visibility maps kept, statistics fresh.

Results arrive in time order, every path's interleaved with every other's, so in a month
partition one path's rows each sit on a heap page of their own: a page of 100 results of one
monitor, target and probe reads about 100 heap pages, and its count as many. Maintenance

- makes the months ahead and moves rows the default partition caught (``partitions.ensure``);
- CLUSTERs each *closed* month of ``results`` (its end before now) by its
  ``(target, monitor, probe, purpose, started_at)`` index, once: the rewrite puts one path's
  rows of the month on a few pages, and the index is marked clustered, so later runs skip the
  month (``recluster=True`` does it again, e.g. after an import of old results into it). The
  open month is clustered only when asked (``open_month=True``, e.g. in a quiet hour): CLUSTER
  holds an exclusive lock on the month while it rewrites it, and the monitors writing into it
  wait meanwhile (past their archive deadline they spool, and write back later);
- VACUUMs (with ANALYZE) every partition of ``results`` and ``flows`` and the daily summaries:
  the visibility map lets a count (an API page's ``total``) be answered from the index alone
  instead of the heap, and the planner's statistics follow the growing months. A VACUUM
  blocks no reader or writer, and one of a month already vacuumed reads only what changed.

A CLUSTER waits at most ``LOCK_WAIT_S`` for its lock (a long reader may hold the month): a month
it could not lock is reported and left for the next run, instead of queueing every reader of
that month behind the wait. SQLite has no partitions and needs none of this: maintenance does
nothing there (its ``VACUUM`` would rewrite the whole file under the write lock).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from iepm.store import partitions
from iepm.store.archive import Archive

# The index a closed month of results is clustered by: the API's path filter, in time order.
CLUSTER_INDEX = "ix_results_target_monitor_probe_purpose_started_at"
LOCK_WAIT_S = 10
LOCK_NOT_AVAILABLE = "55P03"


@dataclass
class MaintenanceReport:
    backend: str
    lock_wait_s: float = LOCK_WAIT_S
    clustered: list[tuple[str, int, float]] = field(default_factory=list)  # name, rows, seconds
    already_clustered: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    vacuumed: list[str] = field(default_factory=list)
    vacuum_s: float = 0.0

    def lines(self) -> list[str]:
        if self.backend != "postgresql":
            return [f"maintenance: nothing to do on {self.backend} (no partitions)"]
        out = []
        for name, rows, seconds in self.clustered:
            out.append(f"clustered {name} by path: {rows:,} rows in {seconds:.1f} s")
        if self.already_clustered:
            out.append(
                f"{len(self.already_clustered)} closed months clustered before: "
                + ", ".join(self.already_clustered)
            )
        if self.busy:
            out.append(
                f"not clustered (locked by others for {self.lock_wait_s:g} s; next run): "
                + ", ".join(self.busy)
            )
        if not (self.clustered or self.already_clustered or self.busy):
            out.append("no closed month of results to cluster")
        out.append(f"vacuumed and analysed {len(self.vacuumed)} tables in {self.vacuum_s:.1f} s")
        return out


def closed_months(conn: Connection, now: datetime) -> list[partitions.Month]:
    """The month partitions of ``results`` that end before ``now``, oldest first."""
    return [month for month in partitions.months(conn) if month.end <= now]


def cluster_index(conn: Connection, partition: str) -> tuple[str, bool] | None:
    """The partition's own index of CLUSTER_INDEX (attached to it) and whether the partition
    is marked clustered by it; None if it has none."""
    found = conn.execute(
        text(
            "SELECT c.relname, i.indisclustered FROM pg_inherits h "
            "JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_index i ON i.indexrelid = c.oid "
            "WHERE h.inhparent = to_regclass(:parent) AND i.indrelid = to_regclass(:partition)"
        ),
        {"parent": CLUSTER_INDEX, "partition": partition},
    ).first()
    return None if found is None else (str(found[0]), bool(found[1]))


def maintain(
    archive: Archive,
    now: datetime | None = None,
    *,
    recluster: bool = False,
    open_month: bool = False,
    lock_wait_s: float = LOCK_WAIT_S,
) -> MaintenanceReport:
    """Run the maintenance the module describes; returns what it did."""
    now = now or datetime.now(UTC)
    with archive.reading("cannot read the archive's partitions") as conn:
        report = MaintenanceReport(backend=conn.dialect.name, lock_wait_s=lock_wait_s)
        if conn.dialect.name != "postgresql" or not partitions.is_partitioned(conn):
            return report
    with archive.writing("cannot make the month partitions") as conn:
        partitions.ensure(conn, max(now, datetime.now(UTC)))
    with archive.autocommit("cannot maintain the archive") as conn:
        conn.exec_driver_sql("SET statement_timeout = 0")  # a month's rewrite takes minutes
        months = closed_months(conn, now)
        if open_month and partitions.Month.of(now) in partitions.months(conn):
            months.append(partitions.Month.of(now))
        for month in months:
            name = partitions.RESULTS.name(month)
            index = cluster_index(conn, name)
            if index is None:
                continue
            if index[1] and not recluster and month.end <= now:
                report.already_clustered.append(name)
                continue
            t0 = time.perf_counter()
            conn.exec_driver_sql(f"SET lock_timeout = {int(lock_wait_s * 1000)}")
            try:
                conn.exec_driver_sql(f"CLUSTER {name} USING {index[0]}")
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                report.busy.append(name)
                continue
            finally:
                conn.exec_driver_sql("SET lock_timeout = 0")
            rows = conn.exec_driver_sql(
                f"SELECT reltuples::bigint FROM pg_class WHERE oid = '{name}'::regclass"
            ).scalar_one()
            report.clustered.append((name, int(rows), time.perf_counter() - t0))
        t0 = time.perf_counter()
        for scheme in partitions.SCHEMES:
            if partitions.is_partitioned(conn, scheme):
                for name in partitions.partitions(conn, scheme):
                    conn.exec_driver_sql(f"VACUUM (ANALYZE) {name}")
                    report.vacuumed.append(name)
        conn.exec_driver_sql("VACUUM (ANALYZE) daily")
        report.vacuumed.append("daily")
        report.vacuum_s = time.perf_counter() - t0
    return report

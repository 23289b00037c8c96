"""Keeping an archive for years: raw results for a while, daily summaries for ever.

``prune`` removes results, scheduler cycles and flow records older than the retention and leaves
``daily`` alone: it is kept in step with results on *write* only (iepm/store/rollup.py), so the
per-day summaries of pruned days stay, and the year-long views still draw them. Alerts and
studies are small and are history; they stay too.

Deletes go in batches of ``BATCH`` rows, each its own transaction: a prune of a large archive
never holds the SQLite write lock (or a PostgreSQL transaction) for long, so a running monitor
keeps writing, and an interrupted prune has removed whole batches, nothing half.

On PostgreSQL, where ``results`` and ``flows`` are partitioned by month
(iepm/store/partitions.py), a month that lies wholly before the cutoff is dropped whole,
partition and rows at once, each in its own short transaction; only the month the cutoff falls
in is deleted in batches.

Raw logs (``LOGDIR/YYYY-MM-DD/*.log``) older than the retention are removed with their day;
those older than ``compress_after_days`` are gzip-compressed in place (``.log.gz``, which
``iepm extract`` reads as well). A compression is written beside the log, fsynced, and renamed
over: a crash leaves the log or its compressed copy, never neither.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from sqlalchemy import Table, delete, func, select

from iepm.store import partitions
from iepm.store.archive import Archive
from iepm.store.schema import cycles as CYCLES
from iepm.store.schema import flows as FLOWS
from iepm.store.schema import results as RESULTS

BATCH = 5000
DAY_RE_FORMAT = "%Y-%m-%d"


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool
    results_by_probe: Counter[str] = field(default_factory=Counter)
    cycles: int = 0
    flows: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    log_days_removed: list[str] = field(default_factory=list)
    log_bytes_removed: int = 0
    logs_compressed: int = 0
    log_bytes_saved: int = 0

    @property
    def results(self) -> int:
        return sum(self.results_by_probe.values())

    def lines(self) -> list[str]:
        verb = "would remove" if self.dry_run else "removed"
        cut = self.cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
        by_probe = ", ".join(f"{p} {n}" for p, n in sorted(self.results_by_probe.items()))
        out = [
            f"{verb} {self.results} results older than {cut}"
            + (f" ({by_probe})" if by_probe else ""),
            *(
                [
                    f"{'would drop' if self.dry_run else 'dropped'} "
                    f"{len(self.partitions_dropped)} whole month partitions: "
                    + ", ".join(self.partitions_dropped)
                ]
                if self.partitions_dropped
                else []
            ),
            f"{verb} {self.cycles} scheduler cycles and {self.flows} flow records",
            "kept: daily summaries (all days), alerts, studies",
        ]
        if self.log_days_removed or self.logs_compressed:
            out.append(
                f"raw logs: {verb} {len(self.log_days_removed)} days "
                f"({self.log_bytes_removed / 1e6:.1f} MB); "
                f"{'would compress' if self.dry_run else 'compressed'} {self.logs_compressed} "
                f"files (saving {self.log_bytes_saved / 1e6:.1f} MB)"
            )
        return out


def prune(
    archive: Archive,
    *,
    keep_days: float,
    now: datetime | None = None,
    dry_run: bool = False,
    log_dir: Path | None = None,
    compress_after_days: float | None = None,
) -> PruneReport:
    """Remove what is older than ``keep_days`` (see the module's docstring); with ``dry_run``
    count it only."""
    if keep_days <= 0:
        raise ValueError("keep_days must be positive")
    now = now or datetime.now(UTC)
    cutoff = now - timedelta(days=keep_days)
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    if not dry_run:  # rows a default partition caught go to their months first
        with archive.writing("cannot make the month partitions") as conn:
            partitions.ensure(conn, max(now, datetime.now(UTC)))
    old_results = RESULTS.c.started_at < cutoff
    with archive.reading("cannot count old results") as conn:
        report.results_by_probe = Counter(
            {p: int(n) for p, n in conn.execute(
                select(RESULTS.c.probe, func.count()).where(old_results).group_by(RESULTS.c.probe)
            )}
        )  # fmt: skip
    report.cycles = _rows(archive, CYCLES, CYCLES.c.started_at < cutoff, dry_run)
    old_flows = FLOWS.c.start_ms < int(cutoff.timestamp() * 1000)
    report.flows = _rows(archive, FLOWS, old_flows, dry_run=True)
    for scheme, table, old in (
        (partitions.RESULTS, RESULTS, old_results),
        (partitions.FLOWS, FLOWS, old_flows),
    ):
        report.partitions_dropped += _months(archive, scheme, cutoff, dry_run)
        if not dry_run:
            _rows(archive, table, old, dry_run=False)
    if log_dir is not None:
        _logs(log_dir, report, cutoff.date(), compress_after_days, now, dry_run)
    return report


def _months(
    archive: Archive, scheme: partitions.Scheme, cutoff: datetime, dry_run: bool
) -> list[str]:
    """Drop the table's month partitions that lie wholly before ``cutoff``, each in its own
    transaction; returns their names."""
    with archive.reading(f"cannot list the partitions of {scheme.table}") as conn:
        if not partitions.is_partitioned(conn, scheme):
            return []
        whole = partitions.before(conn, cutoff, scheme)
    for month in [] if dry_run else whole:
        with archive.writing(f"cannot drop partition {scheme.name(month)}") as conn:
            partitions.drop(conn, month, scheme)
    return [scheme.name(month) for month in whole]


def _rows(archive: Archive, table: Table, old: object, dry_run: bool) -> int:
    key = table.c.id
    if dry_run:
        with archive.reading(f"cannot count old {table.name}") as conn:
            return int(conn.execute(select(func.count()).where(old)).scalar_one())  # type: ignore[arg-type]
    removed = 0
    while True:
        with archive.writing(f"cannot prune {table.name}") as conn:
            batch = select(key).where(old).limit(BATCH)  # type: ignore[arg-type]
            # ``old`` outside too: on a partitioned table only the partitions it spans are read.
            n = conn.execute(delete(table).where(old, key.in_(batch))).rowcount  # type: ignore[arg-type]
        removed += n
        if n < BATCH:
            return removed


def _logs(
    log_dir: Path,
    report: PruneReport,
    cutoff: date,
    compress_after_days: float | None,
    now: datetime,
    dry_run: bool,
) -> None:
    if not log_dir.is_dir():
        raise FileNotFoundError(f"{log_dir}: no such raw-log directory")
    compress_before = (
        None if compress_after_days is None else (now - timedelta(days=compress_after_days)).date()
    )
    for day_dir in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        try:
            day = datetime.strptime(day_dir.name, DAY_RE_FORMAT).date()
        except ValueError:
            continue  # not one of ours: never touched
        files = sorted(day_dir.glob("*.log")) + sorted(day_dir.glob("*.log.gz"))
        if day < cutoff:
            report.log_days_removed.append(day_dir.name)
            report.log_bytes_removed += sum(f.stat().st_size for f in files)
            if not dry_run:
                for f in files:
                    f.unlink()
                with contextlib.suppress(OSError):
                    day_dir.rmdir()  # left in place if it holds anything not ours
        elif compress_before is not None and day < compress_before:
            for f in (f for f in files if f.suffix == ".log"):
                report.logs_compressed += 1
                report.log_bytes_saved += f.stat().st_size - (0 if dry_run else _gzip(f))


def _gzip(path: Path) -> int:
    """Compress ``path`` to ``path.gz`` crash-safely; returns the compressed size."""
    final = path.with_name(path.name + ".gz")
    partial = path.with_name(path.name + ".gz.partial")
    with path.open("rb") as src, partial.open("wb") as raw:
        with gzip.GzipFile(filename=path.name, mode="wb", fileobj=raw, mtime=0) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(partial, final)
    path.unlink()
    return final.stat().st_size

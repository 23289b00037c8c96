"""Archive maintenance (iepm/store/maintenance.py, ``iepm archive maintain``): on PostgreSQL each
closed month of results is clustered by path once, every partition vacuumed (a count answered
from the index alone), a month locked by a reader skipped; nothing on SQLite."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_engine

from iepm.results import Result
from iepm.store import Archive, maintenance, partitions
from testkit import sample

NOW = datetime.now(UTC)
THIS = partitions.Month.of(NOW)
CLOSED = [
    partitions.Month.of(THIS.start - timedelta(days=40)),
    partitions.Month.of(THIS.start - timedelta(days=10)),
]
TARGETS = [f"t{k:02d}" for k in range(8)]


def pg(test):  # type: ignore[no-untyped-def]
    on_pg = pytest.mark.parametrize("archive_url", ["postgresql"], indirect=True)
    return pytest.mark.pg(on_pg(test))


def interleaved(month: partitions.Month, cycles: int) -> list[Result]:
    """Pings of every target each hour, in time order: the paths interleaved as a monitor
    writes them."""
    out = []
    for hour in range(cycles):
        for k, target in enumerate(TARGETS):
            moment = month.start + timedelta(hours=hour, seconds=k)
            out.append(sample.ping(target=target, started_at=moment))
    return out


def blocks(conn: Connection, partition: str, target: str) -> set[int]:
    """The heap pages holding one path's rows in a partition."""
    found = conn.exec_driver_sql(
        f"SELECT (ctid::text::point)[0]::int FROM {partition} WHERE target = '{target}'"
    )
    return set(found.scalars())


def count_scan(conn: Connection, partition: str, target: str) -> tuple[str, int]:
    """How a path's count reads the partition: the plan node's type and its heap fetches."""
    conn.exec_driver_sql("SET enable_seqscan = off")
    conn.exec_driver_sql("SET enable_bitmapscan = off")
    plan = conn.exec_driver_sql(
        "EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) SELECT count(*) FROM results "
        f"WHERE target = '{target}' AND monitor = 'slac-mon' AND probe = 'ping' "
        f"AND purpose = 'routine' AND {partitions.RESULTS.within(CLOSED[0])}"
    ).scalar_one()

    def walk(node: dict) -> list[tuple[str, int]]:  # type: ignore[type-arg]
        own = node.get("Relation Name") == partition
        found = [(node["Node Type"], int(node.get("Heap Fetches", -1)))] if own else []
        return found + [hit for child in node.get("Plans", []) for hit in walk(child)]

    (scan,) = walk(plan[0]["Plan"])
    return scan


@pg
def test_closed_months_are_clustered_by_path_once_and_counts_read_the_index(
    archive_url: str,
) -> None:
    closed = [partitions.RESULTS.name(month) for month in CLOSED]
    with Archive.open(archive_url) as archive:
        archive.add_many([*interleaved(CLOSED[0], 120), *interleaved(CLOSED[1], 120)])
        archive.add_many(interleaved(THIS, 2))
        with archive.writing("test") as conn:  # the past months' rows leave the default
            partitions.ensure(conn)
        with archive.reading("test") as conn:
            scattered = blocks(conn, closed[0], "t03")
            before = count_scan(conn, closed[0], "t03")
        assert before[0] != "Index Only Scan" or before[1] > 0  # not vacuumed yet
        # 120 rows of the path, one in eight rows: spread over every page of the month.
        assert len(scattered) > 10

        report = maintenance.maintain(archive)
        assert [name for name, _rows, _s in report.clustered] == closed
        assert [rows for _name, rows, _s in report.clustered] == [960, 960]
        assert {*closed, partitions.RESULTS.name(THIS), "results_default", "daily"} <= set(
            report.vacuumed
        )
        assert f"clustered {closed[0]} by path: 960 rows in" in "\n".join(report.lines())
        with archive.reading("test") as conn:
            together = blocks(conn, closed[0], "t03")
            # 120 rows on as few pages as they fill: consecutive, a few pages.
            assert len(together) < len(scattered) / 3
            assert max(together) - min(together) + 1 == len(together)
            assert maintenance.cluster_index(conn, closed[0]) == (
                maintenance.cluster_index(conn, closed[0])[0],  # type: ignore[index]
                True,
            )
            assert maintenance.cluster_index(conn, partitions.RESULTS.name(THIS))[1] is False  # type: ignore[index]
            assert count_scan(conn, closed[0], "t03") == ("Index Only Scan", 0)
        assert archive.count(target="t03") == 242  # every row kept

        again = maintenance.maintain(archive)
        assert (again.clustered, again.already_clustered) == ([], closed)
        assert again.lines()[0] == f"2 closed months clustered before: {', '.join(closed)}"
        forced = maintenance.maintain(archive, recluster=True)
        assert [name for name, _rows, _s in forced.clustered] == closed
        # The open month only when asked, and every time (it keeps growing).
        for _ in range(2):
            opened = maintenance.maintain(archive, open_month=True)
            assert opened.clustered[0][:2] == (partitions.RESULTS.name(THIS), 16)
            assert (len(opened.clustered), opened.already_clustered) == (1, closed)


@pg
def test_a_month_a_reader_holds_is_left_for_the_next_run(archive_url: str) -> None:
    closed = partitions.RESULTS.name(CLOSED[1])
    with Archive.open(archive_url) as archive:
        archive.add_many(interleaved(CLOSED[1], 3))
        with archive.writing("test") as conn:  # last month's rows leave the default
            partitions.ensure(conn)
    reader = create_engine(archive_url)
    try:
        with reader.connect() as held:
            held.exec_driver_sql(f"LOCK TABLE {closed} IN ACCESS SHARE MODE")  # in a transaction
            with Archive.open(archive_url) as archive:
                report = maintenance.maintain(archive, lock_wait_s=0.3)
            assert (report.busy, report.clustered) == ([closed], [])
            assert "not clustered (locked by others for 0.3 s; next run): " + closed in (
                report.lines()
            )
            held.rollback()
        with Archive.open(archive_url) as archive:
            report = maintenance.maintain(archive, lock_wait_s=0.3)
            assert [name for name, _rows, _s in report.clustered] == [closed]
            with archive.reading("test") as conn:  # the session's settings did not stay
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "0"
                assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5min"
    finally:
        reader.dispose()


def test_sqlite_has_nothing_to_maintain(tmp_path: Path) -> None:
    with Archive.open(f"sqlite:///{tmp_path / 'a.db'}") as archive:
        archive.add(sample.ping(started_at=NOW - timedelta(days=60)))
        report = maintenance.maintain(archive)
        assert report.lines() == ["maintenance: nothing to do on sqlite (no partitions)"]
        assert archive.count() == 1


def iepm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "iepm.cli", "archive", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_maintain_command_reports_and_never_creates_an_archive(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    run = iepm("maintain", "--db", f"sqlite:///{missing}")
    assert run.returncode == 2 and "does not exist" in run.stderr
    assert "Traceback" not in run.stderr and not missing.exists()


@pg
def test_the_commands_cluster_on_postgresql(archive_url: str) -> None:
    closed = partitions.RESULTS.name(CLOSED[1])
    with Archive.open(archive_url) as archive:
        archive.add_many(interleaved(CLOSED[1], 2))
    dry = iepm("prune", "--db", archive_url, "--keep-days", "400", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "clustered" not in dry.stdout  # a dry run changes nothing
    pruned = iepm("prune", "--db", archive_url, "--keep-days", "400")
    assert pruned.returncode == 0, pruned.stderr
    assert f"clustered {closed} by path: 16 rows in" in pruned.stdout
    run = iepm("maintain", "--db", archive_url)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert f"closed months clustered before: {closed}" in lines[0]
    assert lines[-1].startswith("vacuumed and analysed ")
    with Archive.open(archive_url) as archive:
        assert archive.count() == 16

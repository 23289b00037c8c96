"""``results`` on PostgreSQL partitioned by month (migration 0009, iepm/store/partitions.py):
an archive holding data upgrades and downgrades with every row kept; a row outside the month
partitions is never refused; a spool replayed is stored once; prune drops whole old months."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import Engine, func, make_url, select, text

from iepm.flows.decode import Flow
from iepm.flows.store import add_flows, read_flows
from iepm.results import Result
from iepm.store import Archive, partitions, retention
from iepm.store.archive import alembic_config, connect_engine
from iepm.store.schema import daily as DAILY
from testkit import sample

NOW = datetime.now(UTC).replace(microsecond=654321)  # not a whole millisecond


def pg(test):  # type: ignore[no-untyped-def]
    """On PostgreSQL only: partitioning is PostgreSQL's."""
    on_pg = pytest.mark.parametrize("archive_url", ["postgresql"], indirect=True)
    return pytest.mark.pg(on_pg(test))


@pytest.fixture
def pg_url(archive_url: str) -> str:
    return archive_url


@pytest.fixture
def engine(archive_url: str) -> Iterator[Engine]:
    engine = connect_engine(archive_url)
    yield engine
    engine.dispose()


def spread(months: int, per_month: int = 3) -> list[Result]:
    """Pings over the last ``months`` months (every probe read back by id), a few per month,
    two per path and day so the rollups have something to keep."""
    out = []
    for m in range(months):
        for k in range(per_month):
            moment = NOW - timedelta(days=30 * m + 1, hours=k)
            out.append(sample.ping(target=f"t{k}", started_at=moment, raw_token=f"tok-{m}-{k}"))
    return out


def flows_at(moments: list[datetime]) -> list[Flow]:
    return [
        Flow("198.18.0.1", 0, 10, "198.18.0.2", "198.18.0.3", 40000 + k, 5201, 6, 1500 * k, k,
             int(moment.timestamp() * 1000), int(moment.timestamp() * 1000) + 900, 1)
        for k, moment in enumerate(moments, start=1)
    ]  # fmt: skip


def shape(engine: Engine) -> tuple[str, list[str], list[str]]:
    """results' kind (``p`` partitioned, ``r`` plain), primary key and raw-token key columns."""
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT relkind FROM pg_class WHERE relname = 'results'"))
        key = conn.execute(
            text(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'results'::regclass "
                "AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)"
            )
        )
        token = conn.execute(
            text(
                "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE c.relname = 'ix_results_raw_token' AND i.indisunique "
                "ORDER BY array_position(i.indkey, a.attnum)"
            )
        )
        return str(kind.scalar_one()), list(key.scalars()), list(token.scalars())


def stored(archive: Archive) -> list[Result]:
    return sorted(archive.results(purpose=None), key=lambda r: r.id)


@pg
def test_an_archive_holding_results_upgrades_and_downgrades_keeping_every_row(
    pg_url: str, engine: Engine
) -> None:
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0008")
    written = spread(5)
    flows = flows_at([r.started_at for r in written])
    with Archive(connect_engine(pg_url)) as at_0008:  # ready: no upgrade on open
        at_0008.add_many(written)
        assert add_flows(at_0008, flows, "test") == len(flows)
        daily_before = _daily(at_0008)
    assert shape(engine) == ("r", ["id"], ["raw_token"])

    with Archive.open(pg_url) as archive:
        assert stored(archive) == sorted(written, key=lambda r: r.id)
        assert _daily(archive) == daily_before
        with archive.reading("test") as conn:
            have = set(partitions.months(conn))
            in_default = conn.exec_driver_sql("SELECT count(*) FROM results_default").scalar()
            flow_months = set(partitions.months(conn, partitions.FLOWS))
            flows_in_default = conn.exec_driver_sql("SELECT count(*) FROM flows_default").scalar()
        assert list(read_flows(archive)) == sorted(flows, key=lambda f: f.start_ms)
        assert add_flows(archive, flows, "again") == 0  # a record met twice is one row
    assert shape(engine) == ("p", ["id", "started_at"], ["raw_token", "started_at"])
    assert {partitions.Month.of(r.started_at) for r in written} <= have
    assert {partitions.Month.of(r.started_at) for r in written} <= flow_months
    assert flows_in_default == 0
    assert partitions.Month.of(NOW).next().next() in have  # made ahead
    assert in_default == 0

    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0008")
    assert shape(engine) == ("r", ["id"], ["raw_token"])
    with Archive(connect_engine(pg_url)) as archive:
        assert stored(archive) == sorted(written, key=lambda r: r.id)
        assert list(read_flows(archive)) == sorted(flows, key=lambda f: f.start_ms)
        with archive.reading("test") as conn:
            assert partitions.partitions(conn) == []
            assert partitions.partitions(conn, partitions.FLOWS) == []
            tables = conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relname ~ '^(results|flows)_'")
            )
            assert tables.scalar_one() == 0  # no partition, no table set aside, left behind


def _daily(archive: Archive) -> int:
    with archive.reading("test") as conn:
        return int(conn.execute(select(func.count()).select_from(DAILY)).scalar_one())


@pg
def test_a_row_outside_the_months_lands_in_the_default_partition_and_moves_out(
    pg_url: str,
) -> None:
    far = sample.ping(started_at=datetime(2019, 3, 5, tzinfo=UTC), raw_token="old")
    with Archive.open(pg_url) as archive:
        archive.add(far)  # no partition for March 2019: never refused
        with archive.reading("test") as conn:
            assert conn.exec_driver_sql("SELECT id FROM results_default").scalars().all() == [
                far.id
            ]
    with Archive.open(pg_url) as archive:  # reading moves nothing
        assert stored(archive) == [far]
        with archive.reading("test") as conn:
            assert partitions.Month(2019, 3) not in partitions.months(conn)
    now = sample.ping(started_at=NOW)
    with Archive.open(pg_url) as archive:  # the next writer makes March 2019 its own partition
        archive.add(now)
        with archive.reading("test") as conn:
            assert partitions.Month(2019, 3) in partitions.months(conn)
            assert conn.exec_driver_sql("SELECT count(*) FROM results_default").scalar() == 0
            assert conn.exec_driver_sql("SELECT id FROM results_2019_03").scalars().all() == [
                far.id
            ]
        assert stored(archive) == sorted([far, now], key=lambda r: r.id)


@pg
def test_a_replayed_spool_and_a_reextraction_store_nothing_twice(pg_url: str) -> None:
    results = spread(3)
    with Archive.open(pg_url) as archive:
        assert archive.add_new(results[:2]) == 2
        assert archive.add_new(results) == len(results) - 2
        assert archive.add_new(results) == 0
        # As a spool holds them: the envelope's start, cut to the millisecond. Still the same.
        spooled = [Result.model_validate(result.envelope()) for result in results]
        assert spooled[0].started_at != results[0].started_at
        assert archive.add_new(spooled) == 0
        # Re-extracted with a new id (and, say, a start read differently): the stored row kept.
        again = results[0].model_copy(update={"id": "new-id", "started_at": NOW, "data": {"v": 1}})
        assert archive.upsert_by_token(again) == results[0].id
        assert archive.count(purpose=None) == len(results)
        back = {r.id: r for r in archive.results(purpose=None)}[results[0].id]
        assert back.data == {"v": 1} and back.started_at == results[0].started_at


@pg
def test_prune_drops_whole_old_months_and_deletes_the_boundary_month_in_batches(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "BATCH", 2)
    now = datetime(2026, 11, 20, tzinfo=UTC)
    start = datetime(2026, 6, 15, tzinfo=UTC)  # mid-June to 20 November, a result a day
    written = [
        sample.ping(started_at=start + timedelta(days=d), raw_token=f"d{d}")
        for d in range((now - start).days)
    ]
    flows = flows_at([r.started_at for r in written])
    with Archive.open(pg_url) as archive:
        with archive.writing("test") as conn:
            partitions.create(conn, partitions.spanning(start, now))
        archive.add_many(written)
        add_flows(archive, flows, "test")  # into flows_default: prune first gives them months
        daily_before = _daily(archive)
        cutoff = now - timedelta(days=100)  # 12 August
        dry = retention.prune(archive, keep_days=100, now=now, dry_run=True)
        assert dry.partitions_dropped == ["results_2026_06", "results_2026_07"]
        assert archive.count(purpose=None) == len(written)

        report = retention.prune(archive, keep_days=100, now=now)
        kept = [r for r in written if r.started_at >= cutoff]
        assert report.results == len(written) - len(kept)
        assert report.flows == len(written) - len(kept)
        old_months = ["results_2026_06", "results_2026_07", "flows_2026_06", "flows_2026_07"]
        assert report.partitions_dropped == old_months
        assert f"dropped 4 whole month partitions: {', '.join(old_months)}" in report.lines()
        assert stored(archive) == sorted(kept, key=lambda r: r.id)
        assert [f.start_ms for f in read_flows(archive)] == [
            int(r.started_at.timestamp() * 1000) for r in kept
        ]
        with archive.reading("test") as conn:
            have = partitions.months(conn)
        assert partitions.Month(2026, 8) in have and partitions.Month(2026, 7) not in have
        assert _daily(archive) == daily_before  # daily summaries are kept for ever
        again = retention.prune(archive, keep_days=100, now=now)
        assert (again.results, again.partitions_dropped) == (0, [])


@pytest.mark.parametrize("archive_url", ["sqlite"], indirect=True)
def test_sqlite_keeps_its_plain_table(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        archive.add(sample.ping(started_at=datetime(2019, 3, 5, tzinfo=UTC)))
        with archive.reading("test") as conn:
            assert not partitions.is_partitioned(conn)
        report = retention.prune(archive, keep_days=30)
    assert (report.results, report.partitions_dropped) == (1, [])


@pg
def test_a_role_that_may_not_create_tables_still_opens_and_writes(pg_url: str) -> None:
    """Such a role (say, a web server's) skips making partitions; its rows land in the default
    partition, and the owner's next write moves them to their month."""
    ahead = partitions.Month.of(NOW).next().next()
    with Archive.open(pg_url) as archive, archive.writing("test") as conn:
        conn.exec_driver_sql(f"DROP TABLE {partitions.RESULTS.name(ahead)}")
        role = "iepm_writer_" + pg_url.rsplit("/", 1)[1][-12:]
        conn.exec_driver_sql(f"CREATE ROLE {role} LOGIN PASSWORD 'secret-{role}'")
        conn.exec_driver_sql(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
        )
    limited = make_url(pg_url).set(username=role, password=f"secret-{role}")
    late = sample.ping(started_at=ahead.start + timedelta(days=3))
    try:
        with Archive.open(limited.render_as_string(hide_password=False)) as archive:
            archive.add(late)
            with archive.reading("test") as conn:
                assert ahead not in partitions.months(conn)
        with Archive.open(pg_url) as archive:
            assert stored(archive) == [late]
            with archive.reading("test") as conn:
                assert ahead not in partitions.months(conn)  # reading makes nothing
            archive.add(sample.ping(started_at=NOW))
            with archive.reading("test") as conn:
                assert ahead in partitions.months(conn)
                rows = conn.exec_driver_sql(f"SELECT id FROM {partitions.RESULTS.name(ahead)}")
                assert rows.scalars().all() == [late.id]
    finally:
        with Archive.open(pg_url) as archive, archive.writing("test") as conn:
            conn.exec_driver_sql(f"DROP OWNED BY {role}")
            conn.exec_driver_sql(f"DROP ROLE {role}")


@pg
def test_reading_creates_no_partition_and_the_first_write_does(pg_url: str) -> None:
    """A reading command (report, serve, export) opens the archive and reads: no month partition
    is made, however many are missing. The first write (iepm run, collect, import) makes this
    month's and the next ones."""
    month = partitions.Month.of(datetime.now(UTC))
    ahead = [month, month.next(), month.next().next()]
    with Archive.open(pg_url) as archive:
        archive.add(sample.ping(started_at=datetime(2019, 3, 5, tzinfo=UTC)))  # makes them all
        with archive.writing("test") as conn:  # as if the archive had not been written for months
            for scheme in partitions.SCHEMES:
                for gone in ahead:
                    conn.exec_driver_sql(f"DROP TABLE {scheme.name(gone)}")

    def tables() -> list[str]:
        with Archive.open(pg_url) as archive, archive.reading("test") as conn:
            return sorted(
                conn.execute(
                    text("SELECT relname FROM pg_class WHERE relname ~ '^(results|flows)'")
                ).scalars()
            )

    before = tables()
    with Archive.open(pg_url) as archive:
        assert archive.count() == 1
        assert len(list(archive.results(purpose=None))) == 1
        assert archive.envelope_page(limit=10)[0] == 1
        assert archive.targets() == ["cern-1"]
        assert list(read_flows(archive)) == []
    assert tables() == before  # nothing made, nothing moved (March 2019 stays in the default)
    with Archive.open(pg_url) as archive, archive.reading("test") as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM results_default").scalar() == 1
        assert not set(ahead) & set(partitions.months(conn))
    with Archive.open(pg_url) as archive:
        archive.add(sample.ping(started_at=datetime.now(UTC)))
        with archive.reading("test") as conn:
            for scheme in partitions.SCHEMES:
                assert set(ahead) <= set(partitions.months(conn, scheme))
            assert partitions.Month(2019, 3) in partitions.months(conn)
            assert conn.exec_driver_sql("SELECT count(*) FROM results_default").scalar() == 0
        assert archive.count() == 2

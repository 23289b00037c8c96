"""The archive API on SQLite and PostgreSQL: round trips, filters, paging, re-extraction, errors."""

from __future__ import annotations

import json
import random
import re
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import QueuePool, make_url

from iepm.errors import StoreError
from iepm.results import Outcome, Result, new_result_id
from iepm.store import Archive, Cycle
from iepm.store.archive import Order, connect_engine
from testkit import sample
from testkit.sample import T0


def test_results_read_back_equal_what_was_written(archive: Archive) -> None:
    written = [
        sample.ping(),
        sample.failed_ping(target="in2p3", target_address=None, tool_version=None, raw_token=None),
        sample.iperf3(target="ΚΕΡΚΥΡΑ-π", diags="ünïcödé ✓\r\nline 2"),
        # Not UTC, and microseconds: read back as the same moment, in UTC.
        sample.ping(
            started_at=datetime(2026, 3, 1, 23, 59, 59, 999999, timezone(timedelta(hours=-8)))
        ),
        sample.ping(data={"nested": {"a": [1, {"b": None}], "big": 2**70, "tiny": 1e-300}}),
    ]
    for result in written:
        archive.add(result)
    read = {result.id: result for result in archive.results()}
    assert set(read) == {result.id for result in written}
    for result in written:
        back = read[result.id]
        assert back == result
        assert back.envelope() == result.envelope()
        assert back.started_at.tzinfo is UTC
        assert list(back.data) == list(result.data)  # key order too


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=12,
)
RESULTS = st.builds(
    Result,
    probe=TEXT,
    tool=TEXT,
    tool_version=st.none() | TEXT,
    monitor=TEXT,
    target=TEXT,
    target_address=st.none() | TEXT,
    started_at=st.datetimes(
        min_value=datetime(1900, 1, 2),
        max_value=datetime(2200, 1, 1),
        timezones=st.builds(timezone, st.timedeltas(timedelta(hours=-23), timedelta(hours=23))),
    ),
    duration_s=st.floats(allow_nan=False, allow_infinity=False),
    outcome=st.sampled_from(Outcome),  # succeeded follows from it
    error=st.none() | TEXT,
    diags=TEXT,
    raw_token=st.none() | st.builds(new_result_id),
    params=st.dictionaries(st.text(), JSON_VALUES, max_size=4),
    data=st.dictionaries(st.text(), JSON_VALUES, max_size=6),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(result=RESULTS)
def test_any_result_round_trips(archive: Archive, result: Result) -> None:
    archive.add(result)
    moment = result.started_at
    (back,) = [
        found
        for found in archive.results(
            monitor=result.monitor,
            probe=result.probe,
            target=result.target,
            since=moment,
            until=moment + timedelta(microseconds=1),
        )
        if found.id == result.id
    ]
    assert back == result
    assert back.envelope() == result.envelope()
    # The API's unvalidated path builds the same envelope from the stored row.
    (envelope,) = [
        found
        for found in map(
            json.loads,
            archive.envelope_page(
                target=result.target, since=moment, until=moment + timedelta(microseconds=1)
            )[1],
        )
        if found["id"] == result.id
    ]
    assert envelope == result.envelope()


def test_what_a_database_cannot_hold_is_stored_as_the_envelope_shows_it(archive: Archive) -> None:
    # NaN is null in every envelope; NUL cannot be in PostgreSQL text, so both backends store
    # U+FFFD (the raw log keeps the original bytes).
    result = sample.ping(diags="stderr: \x00\x01 junk", data={"rtt_mdev_ms": float("nan")})
    archive.add(result)
    back = archive.latest("ping", "cern-1")
    assert back is not None
    assert back.data == {"rtt_mdev_ms": None}
    assert back.diags == "stderr: \ufffd\x01 junk"
    assert back.envelope() == {**result.envelope(), "diags": back.diags}


def populate(archive: Archive) -> list[Result]:
    """3 targets × (ping, iperf3) × 10 runs 10 minutes apart, from two monitors, some failed."""
    rng = random.Random(7)
    results = []
    for i in range(10):
        moment = T0 + timedelta(minutes=10 * i)
        for target in ("cern-1", "in2p3", "fnal"):
            monitor = "slac-mon" if i % 2 else "bnl-mon"
            results.append(
                sample.ping(target, moment + timedelta(seconds=rng.random()), monitor=monitor)
            )
            make = sample.failed_ping if i % 3 == 0 else sample.iperf3
            results.append(make(target, moment + timedelta(seconds=30), monitor=monitor))
    rng.shuffle(results)
    assert archive.add_many(results) == len(results)
    return sorted(results, key=lambda result: (result.started_at, result.id))


FILTERS = [
    {},
    {"probe": "ping"},
    {"target": "in2p3"},
    {"probe": "iperf3", "target": "fnal"},
    {"monitor": "bnl-mon"},
    {"outcome": Outcome.TIMEOUT},
    {"outcome": "ok", "target": "cern-1"},
    {"since": T0 + timedelta(minutes=20)},
    {"until": T0 + timedelta(minutes=20)},
    {
        "since": T0 + timedelta(minutes=20, seconds=30),
        "until": T0 + timedelta(minutes=50, seconds=30),
    },
    {"probe": "nope"},
]


def matches(result: Result, filters: dict[str, Any]) -> bool:
    since = filters.get("since")
    until = filters.get("until")
    return (
        all(
            getattr(result, key) == filters[key]
            for key in ("probe", "target", "monitor", "outcome")
            if key in filters
        )
        and (since is None or result.started_at >= since)
        and (until is None or result.started_at < until)
    )


@pytest.mark.parametrize("filters", FILTERS, ids=lambda filters: ",".join(filters) or "all")
def test_filters_and_count(archive: Archive, filters: dict[str, Any]) -> None:
    stored = populate(archive)
    expected = [result.id for result in stored if matches(result, filters)]
    assert [result.id for result in archive.results(**filters)] == expected
    assert archive.count(**filters) == len(expected)


def test_paging_and_order(archive: Archive) -> None:
    stored = populate(archive)
    # Results that share a start time are ordered by id, so pages never overlap or skip.
    same_moment = [sample.ping("cern-1", T0 + timedelta(hours=5)) for _ in range(5)]
    archive.add_many(same_moment)
    stored = sorted(stored + same_moment, key=lambda result: (result.started_at, result.id))
    ids = [result.id for result in stored]
    assert [result.id for result in archive.results()] == ids
    assert [result.id for result in archive.results(order="desc")] == ids[::-1]
    orders: list[tuple[Order, list[str]]] = [("asc", ids), ("desc", ids[::-1])]
    for order, expected in orders:
        pages = [
            [result.id for result in archive.results(limit=7, offset=offset, order=order)]
            for offset in range(0, len(ids), 7)
        ]
        assert all(len(page) == 7 for page in pages[:-1])
        assert [result_id for page in pages for result_id in page] == expected
    assert list(archive.results(offset=len(ids))) == []
    with pytest.raises(ValueError, match="order must be"):
        archive.results(order="sideways")  # type: ignore[arg-type]


def test_latest_and_targets(archive: Archive) -> None:
    assert archive.latest("ping", "cern-1") is None
    assert archive.targets() == []
    stored = populate(archive)
    newest = max(
        (r for r in stored if r.probe == "ping" and r.target == "fnal"), key=lambda r: r.started_at
    )
    assert archive.latest("ping", "fnal") == newest
    assert archive.latest("traceroute", "fnal") is None
    assert archive.targets() == ["cern-1", "fnal", "in2p3"]


def test_upsert_by_token_replaces_the_reading_of_a_raw_run(archive: Archive) -> None:
    original = sample.failed_ping(raw_token="tok-1")
    other = sample.ping(raw_token="tok-2")
    archive.add_many([original, other])
    # A better parser reads the same raw run again: a new Result object, with a new id.
    fixed = sample.ping(
        raw_token="tok-1",
        data={"packets_sent": 10, "loss_percent": 0.0},
        diags="re-extracted",
        started_at=T0 + timedelta(days=1),
    )
    assert fixed.id != original.id
    assert archive.upsert_by_token(fixed) == original.id
    assert archive.count() == 2
    stored = {result.raw_token: result for result in archive.results()}
    assert stored["tok-2"] == other
    back = stored["tok-1"]
    assert back.id == original.id
    assert (back.data, back.outcome, back.succeeded, back.error) == (
        fixed.data,
        Outcome.OK,
        True,
        None,
    )
    # What was measured, rather than read, stays as it was.
    assert (back.started_at, back.diags, back.duration_s) == (
        original.started_at,
        original.diags,
        original.duration_s,
    )
    # Re-extracting again, now with the stored id; then a token never seen before: inserted.
    assert archive.upsert_by_token(back.model_copy(update={"data": {"v": 2}})) == original.id
    new = sample.ping(raw_token="tok-3")
    assert archive.upsert_by_token(new) == new.id
    assert archive.count() == 3
    assert {r.raw_token: r.data for r in archive.results()}["tok-1"] == {"v": 2}
    with pytest.raises(ValueError, match="no raw_token"):
        archive.upsert_by_token(sample.ping(raw_token=None))


def test_add_many_is_all_or_nothing(archive: Archive) -> None:
    first = sample.ping()
    archive.add(first)
    batch = [*sample.series(20)[1:], sample.ping(id=first.id)]
    with pytest.raises(StoreError, match=re.escape(archive.url)):
        archive.add_many(batch)
    assert [result.id for result in archive.results()] == [first.id]


def test_a_duplicate_id_is_a_store_error_naming_the_result(archive: Archive) -> None:
    result = sample.ping()
    archive.add(result)
    with pytest.raises(StoreError, match=f"cannot add result {result.id}"):
        archive.add(sample.ping(id=result.id))
    assert archive.count() == 1


def test_cycles(archive: Archive) -> None:
    cycles = [
        Cycle(
            monitor="slac-mon",
            started_at=T0 + timedelta(minutes=5 * i),
            finished_at=T0 + timedelta(minutes=5 * i, seconds=200 + 60 * (i == 2)),
            interval_s=300.0,
            overran=i == 2,
            n_results=12,
            n_failed=i,
        )
        for i in range(4)
    ] + [
        Cycle(
            monitor="bnl-mon",
            started_at=T0,
            finished_at=T0 + timedelta(seconds=1),
            interval_s=60.0,
            overran=False,
            n_results=1,
            n_failed=0,
        )
    ]
    for cycle in reversed(cycles):
        archive.add_cycle(cycle)
    assert list(archive.cycles(monitor="slac-mon")) == cycles[:4]
    assert (
        list(archive.cycles(since=T0 + timedelta(minutes=5), until=T0 + timedelta(minutes=15)))
        == cycles[1:3]
    )
    assert all(cycle.started_at.tzinfo is UTC for cycle in archive.cycles())
    assert len(list(archive.cycles())) == 5


def test_results_stream_and_release_their_connection(archive: Archive) -> None:
    archive.add_many(sample.series(3000))
    stream = archive.results()
    first = next(stream)
    # The archive stays usable (for writing too) while a stream is open.
    archive.add(sample.ping(target="other"))
    assert next(stream).started_at > first.started_at
    stream.close()
    pool = archive._engine.pool
    assert isinstance(pool, QueuePool) and pool.checkedout() == 0
    assert sum(1 for _ in archive.results(target="cern-1")) == 3000


def test_a_writer_waits_for_another_transaction_instead_of_failing(archive_url: str) -> None:
    archive = Archive.open(archive_url)
    blocker = connect_engine(archive_url)
    try:
        with blocker.connect() as conn:
            if blocker.dialect.name == "sqlite":
                conn.execution_options(iepm_write=True)
                conn.begin()
            else:
                conn.begin()
                conn.exec_driver_sql("LOCK TABLE results IN EXCLUSIVE MODE")
            errors: list[BaseException] = []

            def add() -> None:
                try:
                    archive.add(sample.ping())
                except BaseException as exc:
                    errors.append(exc)

            writer = threading.Thread(target=add)
            writer.start()
            time.sleep(1.0)
            assert writer.is_alive(), f"the writer did not wait: {errors}"
            conn.commit()
            writer.join(timeout=30)
        assert not writer.is_alive() and errors == []
        assert archive.count() == 1
    finally:
        blocker.dispose()
        archive.close()


def test_integrity_check(archive: Archive) -> None:
    archive.add_many(sample.series(100))
    assert archive.integrity_check() == "ok"


def test_an_unusable_database_is_a_store_error_naming_it(archive_url: str) -> None:
    url = make_url(archive_url)
    if url.get_backend_name() == "sqlite":
        path = Path(url.database or "")
        with Archive.open(archive_url) as archive:
            archive.add_many(sample.series(2000))
        size = path.stat().st_size
        cases = {
            "garbage": b"this is not a database, it is a text file\n" * 100,
            "truncated": path.read_bytes()[: size // 2],
        }
        for content in cases.values():
            path.write_bytes(content)
            with pytest.raises(StoreError, match=re.escape(f"cannot open archive {url}: ")):
                Archive.open(archive_url)
        path.unlink()
        path.mkdir()
        with pytest.raises(StoreError, match=re.escape(f"cannot open archive {url}: ")):
            Archive.open(archive_url)
    else:
        assert url.password
        for bad in (url.set(database="no_such_db"), url.set(password="wrong"), url.set(port=1)):
            shown = bad.render_as_string(hide_password=True)
            with pytest.raises(StoreError) as caught:
                Archive.open(bad.render_as_string(hide_password=False))
            assert f"cannot open archive {shown}: " in str(caught.value)
            assert url.password not in str(caught.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/var/lib/iepm/archive.db", "is not a database URL"),
        ("mysql://u@h/db", "unsupported database 'mysql'"),
        ("sqlite://", "names no file"),
        ("sqlite:///:memory:", "names no file"),
    ],
)
def test_urls_that_are_not_archives(url: str, message: str) -> None:
    with pytest.raises(StoreError, match=message):
        Archive.open(url)


@pytest.mark.parametrize("order", ["asc", "desc"])
def test_an_api_page_is_the_count_and_the_page_results_gives(archive: Archive, order: str) -> None:
    """``envelope_page`` (one statement on PostgreSQL): its total is ``count()`` and its page is
    ``results()``'s, in order, for every offset — also past the end, where the page is empty
    and the total still counts."""
    populate(archive)
    filters: dict[str, Any] = {"target": "in2p3", "probe": "ping"}
    everything = [r.envelope() for r in archive.results(**filters, order=order)]  # type: ignore[arg-type]
    assert len(everything) == archive.count(**filters) > 7
    for offset in (0, 7, len(everything) - 1, len(everything), len(everything) + 5):
        total, texts = archive.envelope_page(**filters, limit=7, offset=offset, order=order)  # type: ignore[arg-type]
        assert total == len(everything)
        assert [json.loads(t) for t in texts] == everything[offset : offset + 7]
    assert archive.envelope_page(target="nowhere", limit=5) == (0, [])

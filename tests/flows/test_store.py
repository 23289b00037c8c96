"""The flow store's write path: ids as archives already hold them, nothing stored twice."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iepm.errors import StoreError
from iepm.flows.decode import Flow
from iepm.flows.records import FlowColumns
from iepm.flows.store import add_flows, flow_id, flow_ids, read_flows
from iepm.store import Archive

text = st.text(max_size=40)  # any text: quotes, backslashes, non-ASCII (repr escapes them)
big = st.integers(min_value=0, max_value=2**63 - 1)
flows = st.builds(Flow, text, big, st.integers(0, 10), text, text, st.integers(0, 65535),
                  st.integers(0, 65535), st.integers(0, 255), big, big, big, big, big)  # fmt: skip


def id_as_written_before(flow: Flow) -> str:
    """The id the store gave records before its write path was made faster: a record stored
    then and met again now must get the same id, or it would be stored twice."""
    digest = hashlib.blake2b(repr(tuple(flow)).encode(), digest_size=10).hexdigest()
    return f"{flow.start_ms & 0xFFFFFFFFFFFF:012x}{digest}"


@settings(max_examples=300, deadline=None)
@given(flows)
def test_the_id_is_the_one_stored_archives_hold(flow: Flow) -> None:
    assert flow_id(flow) == id_as_written_before(flow)


@settings(max_examples=100, deadline=None)
@given(st.lists(flows, max_size=20))
def test_ids_from_columns_are_the_ids_of_the_records(records: list[Flow]) -> None:
    """The collector's path (records as columns) gives each record the id it always had."""
    columns = FlowColumns.of(records)
    assert columns.flows() == records
    assert flow_ids(columns) == [id_as_written_before(f) for f in records]


@pytest.fixture
def archive(archive_url: str) -> Iterator[Archive]:
    with Archive.open(archive_url) as opened:
        yield opened


def sample(n: int, seed: int) -> list[Flow]:
    rng = random.Random(seed)
    return [
        Flow("198.18.0.1", 0, 10, f"198.18.{rng.randrange(256)}.{rng.randrange(256)}",
             "198.19.0.1", rng.randrange(1024, 65536), 5201, 6, rng.randrange(1, 10**9),
             rng.randrange(1, 10**6), 1_764_000_000_000 + k, 1_764_000_060_000 + k, 1)
        for k in range(n)
    ]  # fmt: skip


def test_large_batches_store_each_record_once(archive: Archive) -> None:
    """Duplicates inside one batch, a batch overlapping what is stored, and a batch met
    again: each record is one row, and the count returned is of new rows only."""
    first, second = sample(12_000, 1), sample(12_000, 2)
    assert add_flows(archive, first + first[:3000], "udp") == 12_000
    assert add_flows(archive, first[6000:] + second, "udp") == 12_000
    assert add_flows(archive, iter(second), "udp") == 0  # any iterable, not only lists
    stored = list(read_flows(archive))
    assert len(stored) == 24_000
    assert sorted(stored) == sorted(first + second)


def test_columns_and_records_dedupe_against_each_other(archive: Archive) -> None:
    """A batch of columns (the collector's) and of records (an import, an archive written
    before) are the same rows: nothing is stored twice, whichever came first."""
    first, second = sample(5_000, 3), sample(5_000, 4)
    assert add_flows(archive, first, "nfcapd:file") == 5_000
    both = FlowColumns.of(first + second)
    assert add_flows(archive, both, "udp") == 5_000
    assert add_flows(archive, both[:2_500], "udp") == 0
    assert add_flows(archive, second, "udp") == 0
    assert sorted(read_flows(archive)) == sorted(first + second)


def test_an_empty_batch_stores_nothing(archive: Archive) -> None:
    assert add_flows(archive, [], "udp") == 0
    assert add_flows(archive, FlowColumns(), "udp") == 0
    assert list(read_flows(archive)) == []


def test_a_failing_write_is_a_store_error_and_stores_nothing(
    archive: Archive, archive_url: str
) -> None:
    """The write runs on the driver's connection: its errors still come out as StoreError
    (what the collector's writer counts), and the batch's transaction is rolled back."""
    with archive.writing("test setup") as conn:
        if archive_url.startswith("sqlite"):
            conn.exec_driver_sql(
                "CREATE TRIGGER no_big BEFORE INSERT ON flows WHEN NEW.bytes > 1000 "
                "BEGIN SELECT RAISE(ABORT, 'too big'); END"
            )
        else:
            conn.exec_driver_sql(
                "CREATE FUNCTION no_big() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.bytes > 1000 THEN RAISE EXCEPTION 'too big'; END IF; "
                "RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER no_big BEFORE INSERT ON flows "
                "FOR EACH ROW EXECUTE FUNCTION no_big()"
            )
    small = [f._replace(bytes=10) for f in sample(5, 3)]
    big = sample(1, 4)[0]._replace(bytes=5000)
    with pytest.raises(StoreError, match=r"cannot store flow records.*too big"):
        add_flows(archive, [*small, big], "udp")
    assert list(read_flows(archive)) == []
    assert add_flows(archive, small, "udp") == 5  # the archive is fine for the next batch


def test_a_counter_beyond_64_bits_is_a_store_error(archive: Archive) -> None:
    huge = sample(1, 5)[0]._replace(bytes=2**64 - 1)  # an IPFIX unsigned64 at its top
    with pytest.raises(StoreError, match="cannot store flow records"):
        add_flows(archive, [huge], "udp")
    assert list(read_flows(archive)) == []

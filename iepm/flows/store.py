"""Flow records in the archive: batched, idempotent writes and range reads."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from sqlalchemy import and_, or_, select

from iepm.flows.decode import Flow
from iepm.store import Archive
from iepm.store.schema import flows as FLOWS

# Rows per INSERT statement round (executemany): large enough to amortise a transaction.
CHUNK = 5000
COLUMNS = Flow._fields


def flow_id(flow: Flow) -> str:
    """The record's start time then a digest of every exported field: the same record met
    twice is one row. The time first keeps the primary key's inserts near its end (records
    arrive roughly in time order), not scattered over the whole index: filling a table to
    450,000 rows on a loaded host, SQLite stored twice as many records per second."""
    digest = hashlib.blake2b(repr(tuple(flow)).encode(), digest_size=10).hexdigest()
    return f"{flow.start_ms & 0xFFFFFFFFFFFF:012x}{digest}"


def add_flows(archive: Archive, flows: Iterable[Flow], source: str) -> int:
    """Store flow records in one transaction; those already stored are skipped. Returns how
    many rows are new.

    Rows go to the driver's ``executemany`` as plain tuples: SQLAlchemy's per-row parameter
    processing (and RETURNING, to count new rows) cost more than the insert itself at collector
    rates; the drivers (sqlite3, psycopg 3) sum the inserted rows of an ``executemany`` in
    ``rowcount``, and a row skipped by ON CONFLICT DO NOTHING is not counted."""
    new = 0
    with archive.writing("cannot store flow records") as conn:
        mark = "?" if conn.dialect.name == "sqlite" else "%s"
        sql = (
            f"INSERT INTO flows (id, {', '.join(COLUMNS)}, source) "
            f"VALUES ({', '.join([mark] * (len(COLUMNS) + 2))}) ON CONFLICT DO NOTHING"
        )
        iterator = iter(flows)
        while chunk := list(islice(iterator, CHUNK)):
            rows = [(flow_id(f), *f, source) for f in chunk]
            new += conn.exec_driver_sql(sql, rows).rowcount
    return new


def read_flows(
    archive: Archive,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
    address: str | None = None,
) -> Iterator[Flow]:
    """Stored flows starting in [since, until), oldest first; only ``pairs`` (src, dst) if
    given; only those from or to ``address`` if given."""
    conditions = []
    if address is not None:
        conditions.append(or_(FLOWS.c.src == address, FLOWS.c.dst == address))
    if since_ms is not None:
        conditions.append(FLOWS.c.start_ms >= since_ms)
    if until_ms is not None:
        conditions.append(FLOWS.c.start_ms < until_ms)
    query = select(*(FLOWS.c[name] for name in COLUMNS)).order_by(FLOWS.c.start_ms, FLOWS.c.id)
    if conditions:
        query = query.where(and_(*conditions))
    wanted = set(pairs) if pairs is not None else None
    with archive.reading("cannot read flow records") as conn:
        for row in conn.execute(query.execution_options(yield_per=1000)):
            flow = Flow(*row)
            if wanted is None or (flow.src, flow.dst) in wanted:
                yield flow

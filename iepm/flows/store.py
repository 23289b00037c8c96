"""Flow records in the archive: batched, idempotent writes and range reads."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from iepm.errors import StoreError
from iepm.flows.records import Flow, FlowColumns
from iepm.store import Archive
from iepm.store.schema import flows as FLOWS

COLUMNS = Flow._fields
# SQLite's page cache for the connection that writes flows (KiB; SQLite's default is 2 MiB).
# Each record updates three B-trees (id, (src, dst, start), start); with the default cache the
# pages of the (src, dst, start) index are read back from the OS again and again: 64 MiB cut
# the insert's CPU time per row by a quarter (8.0 → 5.8 µs, 300,000 rows, benchmarks/flows.py).
SQLITE_CACHE_KIB = 65536
# ``repr(tuple(flow))`` without building the tuple: %r of each field, as tuple's repr joins them.
_REPR = "(" + ", ".join(["%r"] * len(COLUMNS)) + ")"
_ID_SQL = ", ".join(("id", *COLUMNS, "source"))
# PostgreSQL: the batch is copied into this session's own scratch table, then moved to
# ``flows`` by one INSERT ... SELECT that skips the ids already there. ON COMMIT DELETE ROWS
# empties it at every commit, so a batch never sees the previous one.
_PG_STAGE = "iepm_flows_in"
_PG_STAGE_SQL = (
    f"CREATE TEMPORARY TABLE IF NOT EXISTS {_PG_STAGE} "
    "(LIKE flows INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
# The binary COPY's types, column by column (id, the Flow fields, source), as the table has them.
_PG_TYPES = [
    "text", "text", "int8", "int4", "text", "text", "int4", "int4", "int4",
    "int8", "int8", "int8", "int8", "int8", "text",
]  # fmt: skip
_PG_MOVE_SQL = (
    f"INSERT INTO flows ({_ID_SQL}) SELECT {_ID_SQL} FROM {_PG_STAGE} ON CONFLICT DO NOTHING"
)


def flow_id(flow: Flow, _repr: str = _REPR, _blake2b: Any = hashlib.blake2b) -> str:
    """The record's start time then a digest of every exported field: the same record met
    twice is one row. The time first keeps the primary key's inserts near its end (records
    arrive roughly in time order), not scattered over the whole index: filling a table to
    450,000 rows on a loaded host, SQLite stored twice as many records per second.

    The digest is of ``repr(tuple(flow))`` (the ids of archives written before stay valid);
    the format string builds the same text a third faster."""
    digest = _blake2b((_repr % flow).encode(), digest_size=10).hexdigest()
    return f"{flow[10] & 0xFFFFFFFFFFFF:012x}{digest}"


def flow_ids(flows: FlowColumns) -> list[str]:
    """:func:`flow_id` of each record, from the columns (one pass in a comprehension: a call
    per record was a fifth of the rows' cost). The scheme is kept so that records stored before
    still dedupe against new writes; its text and digest cost ~1.2 µs a record, a sixth of what
    the archive itself spends on the row (benchmarks/flows.py, part ``ceiling``)."""
    text, digest, mask = _REPR.__mod__, hashlib.blake2b, 0xFFFFFFFFFFFF
    columns = flows.columns
    return [
        f"{start & mask:012x}{digest(record.encode(), digest_size=10).hexdigest()}"
        for start, record in zip(columns[10], map(text, zip(*columns, strict=True)), strict=True)
    ]


def flow_rows(flows: Iterable[Flow] | FlowColumns, source: str) -> Iterator[tuple[Any, ...]]:
    """The ``flows`` table's rows, columns in :data:`COLUMNS` order between id and source: tuples
    made by ``zip`` (in C) from the columns."""
    columns = flows if isinstance(flows, FlowColumns) else FlowColumns.of(flows)
    return zip(flow_ids(columns), *columns.columns, repeat(source, len(columns)), strict=True)


def add_flows(archive: Archive, flows: Iterable[Flow] | FlowColumns, source: str) -> int:
    """Store flow records in one transaction; those already stored are skipped. Returns how
    many rows are new.

    SQLite: one ``executemany`` of a prepared ``INSERT ... ON CONFLICT DO NOTHING`` over plain
    tuples (SQLAlchemy's per-row parameter processing cost more than the insert itself at
    collector rates); sqlite3 sums the inserted rows in ``rowcount``, a skipped row is not
    counted. PostgreSQL: ``COPY`` (psycopg 3, binary) straight into the table, or, when some
    record is already stored, into a temporary table then one ``INSERT ... SELECT ... ON
    CONFLICT DO NOTHING``, whose rowcount is the new rows (see :func:`_copy_pg`): a row-by-row
    ``executemany`` is a round trip per row."""
    doing = "cannot store flow records"
    with archive.writing(doing) as conn:
        # These run on the driver's own connection, where SQLAlchemy does not turn the
        # driver's errors into its own (nor the archive into a StoreError): done here, so the
        # collector's writer counts a failed batch and goes on. OverflowError: an integer
        # beyond the column's 64 bits (sqlite3 raises it while binding).
        try:
            if conn.dialect.name == "postgresql":
                return _copy_pg(conn, flows, source)
            return _insert_sqlite(conn, flows, source)
        except (conn.dialect.loaded_dbapi.Error, OverflowError) as exc:
            raise StoreError(f"{doing} (archive {archive.url}): {exc}".strip()) from exc


def _insert_sqlite(conn: Connection, flows: Iterable[Flow] | FlowColumns, source: str) -> int:
    sql = (
        f"INSERT INTO flows ({_ID_SQL}) "
        f"VALUES ({', '.join(['?'] * (len(COLUMNS) + 2))}) ON CONFLICT DO NOTHING"
    )
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(f"PRAGMA cache_size = -{SQLITE_CACHE_KIB}")
        cursor.executemany(sql, flow_rows(flows, source))
        return int(cursor.rowcount)
    finally:
        cursor.close()


def _copy_pg(conn: Connection, flows: Iterable[Flow] | FlowColumns, source: str) -> int:
    """Straight into ``flows`` first, inside a savepoint: a collector's batches are new records,
    and so each row is written once. If an id is already there (a datagram met twice, a file
    imported again), the savepoint is rolled back and the batch goes through the scratch table,
    which skips what is stored."""
    rows = list(flow_rows(flows, source))
    raw = conn.connection.driver_connection
    unique_violation = conn.dialect.loaded_dbapi.IntegrityError
    with raw.cursor() as cursor:  # type: ignore[union-attr]
        cursor.execute("SAVEPOINT iepm_flows")
        try:
            _copy_rows(cursor, "flows", rows)
        except unique_violation as exc:
            if getattr(exc, "sqlstate", None) != "23505":
                raise
            cursor.execute("ROLLBACK TO SAVEPOINT iepm_flows")
        else:
            cursor.execute("RELEASE SAVEPOINT iepm_flows")
            return len(rows)
        cursor.execute(_PG_STAGE_SQL)
        _copy_rows(cursor, _PG_STAGE, rows)
        cursor.execute(_PG_MOVE_SQL)
        return int(cursor.rowcount)


def _copy_rows(cursor: Any, table: str, rows: list[tuple[Any, ...]]) -> None:
    with cursor.copy(f"COPY {table} ({_ID_SQL}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(_PG_TYPES)
        write = copy.write_row
        for row in rows:
            write(row)


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

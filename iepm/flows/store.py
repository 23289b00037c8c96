"""Flow records in the archive: batched, idempotent writes and range reads."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from sqlalchemy import and_, select
from sqlalchemy.dialects import postgresql, sqlite

from iepm.flows.decode import Flow
from iepm.store import Archive
from iepm.store.schema import flows as FLOWS

# Rows per INSERT statement round (executemany): large enough to amortise a transaction.
CHUNK = 5000
COLUMNS = Flow._fields


def flow_id(flow: Flow) -> str:
    """A digest of the record (every exported field): the same record met twice is one row."""
    return hashlib.blake2b(repr(tuple(flow)).encode(), digest_size=16).hexdigest()


def add_flows(archive: Archive, flows: Iterable[Flow], source: str) -> int:
    """Store flow records in one transaction; those already stored are skipped. Returns how
    many rows are new."""
    new = 0
    with archive.writing("cannot store flow records") as conn:
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        statement = dialect.insert(FLOWS).on_conflict_do_nothing().returning(FLOWS.c.id)
        iterator = iter(flows)
        while chunk := list(islice(iterator, CHUNK)):
            rows = [
                {"id": flow_id(f), "source": source, **dict(zip(COLUMNS, f, strict=True))}
                for f in chunk
            ]
            new += len(conn.execute(statement, rows).all())
    return new


def read_flows(
    archive: Archive,
    *,
    since_ms: int | None = None,
    until_ms: int | None = None,
    pairs: Sequence[tuple[str, str]] | None = None,
) -> Iterator[Flow]:
    """Stored flows starting in [since, until), oldest first; only ``pairs`` (src, dst) if
    given."""
    conditions = []
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

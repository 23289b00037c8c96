"""``results`` on PostgreSQL, partitioned by month of ``started_at`` (migration 0009).

A partition per calendar month (UTC), named ``results_YYYY_MM``, plus ``results_default`` for
any row no month partition takes, so an insert never fails for want of a partition. A partitioned
table's unique keys must hold the partition key, so on PostgreSQL the primary key is
``(id, started_at)`` and the raw-token key ``(raw_token, started_at)``: a result written twice (a
spool replayed after a write that outlived its deadline) has the same id *and* start, so it
still conflicts and is stored once. SQLite keeps its plain table (``id`` and ``raw_token`` unique
by themselves).

``ensure`` keeps the months ahead partitioned (this month and the next ``AHEAD``) and moves any
rows the default partition caught (a monitor that ran past the months made ahead, an import of
old results) into month partitions of their own; ``Archive.open`` and ``iepm archive prune``
call it. Retention (iepm/store/retention.py) drops whole months that lie before the cutoff —
no row-by-row delete, no table bloat — and batch-deletes only the month the cutoff falls in.

Partitions are found by name: a table this module did not name is never created, moved or
dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, func, select, text

PARENT = "results"
DEFAULT = "results_default"
# Month partitions made ahead of now: a monitor that opened its archive keeps writing into month
# partitions for this long without opening it again.
AHEAD = 2
# pg_advisory_xact_lock key ("iepp"): processes making partitions at once take turns.
LOCK = 0x69657070
_NAME = re.compile(r"results_(\d{4})_(\d{2})")


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def of(cls, moment: datetime) -> Month:
        moment = moment.astimezone(UTC)
        return cls(moment.year, moment.month)

    @property
    def name(self) -> str:
        return f"{PARENT}_{self.year:04d}_{self.month:02d}"

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    def next(self) -> Month:
        return Month(self.year + self.month // 12, self.month % 12 + 1)

    @property
    def end(self) -> datetime:
        return self.next().start


def spanning(since: datetime, until: datetime) -> list[Month]:
    """The months from the one holding ``since`` to the one holding ``until``, inclusive."""
    month, last, out = Month.of(since), Month.of(until), []
    while month <= last:
        out.append(month)
        month = month.next()
    return out


def _literal(moment: datetime) -> str:
    return "'" + moment.strftime("%Y-%m-%d %H:%M:%S+00") + "'"


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is one this module gives a partition."""
    return name == DEFAULT or _NAME.fullmatch(name) is not None


def is_partitioned(conn: Connection) -> bool:
    """Whether ``results`` is a partitioned table (PostgreSQL after migration 0009)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": PARENT}
    ).scalar_one_or_none()
    return kind == "p"


def partitions(conn: Connection) -> list[str]:
    """The names of ``results``' partitions, sorted (``results_default`` last)."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": PARENT},
    ).scalars()
    return sorted(names, key=lambda n: (n == DEFAULT, n))


def months(conn: Connection) -> list[Month]:
    """The month partitions this module made, oldest first."""
    found = (_NAME.fullmatch(name) for name in partitions(conn))
    return [Month(int(m[1]), int(m[2])) for m in found if m]


def create(conn: Connection, wanted: list[Month]) -> list[str]:
    """Create the months of ``wanted`` that have no partition yet and the default partition if
    missing, inside the caller's transaction (the ``results`` table must already be
    partitioned); returns the names created."""
    conn.execute(select(func.pg_advisory_xact_lock(LOCK)))
    made: list[str] = []
    existing = set(partitions(conn))
    if DEFAULT not in existing:
        conn.exec_driver_sql(f"CREATE TABLE {DEFAULT} PARTITION OF {PARENT} DEFAULT")
        made.append(DEFAULT)
    for month in sorted(set(wanted)):
        if month.name in existing:
            continue
        bounds = f"FROM ({_literal(month.start)}) TO ({_literal(month.end)})"
        caught = conn.exec_driver_sql(
            f"SELECT 1 FROM {DEFAULT} WHERE started_at >= {_literal(month.start)} "
            f"AND started_at < {_literal(month.end)} LIMIT 1"
        ).first()
        if caught is None:
            conn.exec_driver_sql(
                f"CREATE TABLE {month.name} PARTITION OF {PARENT} FOR VALUES {bounds}"
            )
        else:
            # The default partition holds rows of this month: attaching a partition over them
            # would be refused, so they move into the new table first.
            conn.exec_driver_sql(
                f"CREATE TABLE {month.name} "
                f"(LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            )
            conn.exec_driver_sql(
                f"WITH moved AS (DELETE FROM {DEFAULT} WHERE started_at >= {_literal(month.start)} "
                f"AND started_at < {_literal(month.end)} RETURNING *) "
                f"INSERT INTO {month.name} SELECT * FROM moved"
            )
            conn.exec_driver_sql(
                f"ALTER TABLE {PARENT} ATTACH PARTITION {month.name} FOR VALUES {bounds}"
            )
        made.append(month.name)
    return made


def needed(conn: Connection, now: datetime, ahead: int = AHEAD) -> list[Month]:
    """The months that should have a partition: this one, ``ahead`` more, and every month of
    the rows the default partition holds."""
    wanted = [Month.of(now)]
    for _ in range(ahead):
        wanted.append(wanted[-1].next())
    if DEFAULT in partitions(conn):
        caught = conn.exec_driver_sql(
            f"SELECT DISTINCT date_trunc('month', started_at AT TIME ZONE 'UTC') FROM {DEFAULT}"
        ).scalars()
        wanted += [Month(moment.year, moment.month) for moment in caught]
    return sorted(set(wanted))


def ensure(conn: Connection, now: datetime | None = None, ahead: int = AHEAD) -> list[str]:
    """Make the partitions ``needed`` says are missing, in the caller's transaction; returns the
    names created (none, and no lock taken, when all are there). A no-op unless ``results`` is
    partitioned."""
    if not is_partitioned(conn):
        return []
    wanted = needed(conn, now or datetime.now(UTC), ahead)
    have = set(months(conn))
    if all(month in have for month in wanted) and DEFAULT in partitions(conn):
        return []
    return create(conn, wanted)


def before(conn: Connection, cutoff: datetime) -> list[Month]:
    """The month partitions that lie entirely before ``cutoff`` (their rows all older)."""
    return [month for month in months(conn) if month.end <= cutoff]


def drop(conn: Connection, month: Month) -> None:
    """Drop one month partition with its rows."""
    conn.execute(select(func.pg_advisory_xact_lock(LOCK)))
    conn.exec_driver_sql(f"ALTER TABLE {PARENT} DETACH PARTITION {month.name}")
    conn.exec_driver_sql(f"DROP TABLE {month.name}")

"""``results`` and ``flows`` on PostgreSQL, partitioned by month (migration 0009).

Each table has a partition per calendar month (UTC) of its time column (``results.started_at``,
``flows.start_ms``), named ``results_YYYY_MM`` / ``flows_YYYY_MM``, plus ``results_default`` /
``flows_default`` for any row no month partition takes, so an insert never fails for want of a
partition. A partitioned table's unique keys must hold the partition key, so on PostgreSQL the
primary keys are ``(id, started_at)`` and ``(id, start_ms)`` and the raw-token key ``(raw_token,
started_at)``. A flow's id is a digest of the record, start included, so a record met twice still
conflicts. A spooled result's start is cut to the millisecond, so the archive looks for its id
near that start before storing it (``Archive.add_new``), and re-extraction finds a run by its
raw token alone (``Archive.upsert_by_token``). SQLite keeps its plain tables.

``ensure`` keeps the months ahead partitioned (this month and the next ``AHEAD``) and moves any
rows a default partition caught (a monitor that ran past the months made ahead, an import of
old results) into month partitions of their own; an archive's first write (and its first
write in a new month), ``iepm archive prune`` and ``iepm archive maintain`` call it — never a
command that only reads. Retention (iepm/store/retention.py) drops whole months that lie
before the cutoff — no row-by-row delete, no table bloat — and batch-deletes only the month the
cutoff falls in; maintenance (iepm/store/maintenance.py) clusters the closed months by path.

Partitions are found by name: a table this module did not name is never created, moved or
dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Connection, func, select, text

# Month partitions made ahead of now: a monitor that opened its archive keeps writing into month
# partitions for this long without opening it again.
AHEAD = 2
# pg_advisory_xact_lock key ("iepp"): processes making or dropping partitions take turns.
LOCK = 0x69657070


@dataclass(frozen=True, order=True)
class Month:
    year: int
    month: int

    @classmethod
    def of(cls, moment: datetime) -> Month:
        moment = moment.astimezone(UTC)
        return cls(moment.year, moment.month)

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    def next(self) -> Month:
        return Month(self.year + self.month // 12, self.month % 12 + 1)

    @property
    def end(self) -> datetime:
        return self.next().start


@dataclass(frozen=True)
class Scheme:
    """How one table is partitioned: by month of ``column``, a timestamp or (``in_ms``) Unix
    milliseconds."""

    table: str
    column: str
    in_ms: bool = False

    @property
    def default(self) -> str:
        return f"{self.table}_default"

    def name(self, month: Month) -> str:
        return f"{self.table}_{month.year:04d}_{month.month:02d}"

    def parse(self, name: str) -> Month | None:
        found = re.fullmatch(rf"{self.table}_(\d{{4}})_(\d{{2}})", name)
        return Month(int(found[1]), int(found[2])) if found else None

    def literal(self, moment: datetime) -> str:
        """``moment`` as a bound of this table's partitions, in SQL."""
        if self.in_ms:
            return str(int(moment.timestamp()) * 1000)
        return "'" + moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S+00") + "'"

    def within(self, month: Month) -> str:
        """SQL: the rows of ``month``."""
        column = self.column
        return f"{column} >= {self.literal(month.start)} AND {column} < {self.literal(month.end)}"

    @property
    def month_of_row(self) -> str:
        """SQL: the UTC month (a timestamp) a row belongs to."""
        moment = f"to_timestamp({self.column} / 1000.0)" if self.in_ms else self.column
        return f"date_trunc('month', {moment} AT TIME ZONE 'UTC')"


RESULTS = Scheme("results", "started_at")
FLOWS = Scheme("flows", "start_ms", in_ms=True)
SCHEMES = (RESULTS, FLOWS)


def spanning(since: datetime, until: datetime) -> list[Month]:
    """The months from the one holding ``since`` to the one holding ``until``, inclusive."""
    month, last, out = Month.of(since), Month.of(until), []
    while month <= last:
        out.append(month)
        month = month.next()
    return out


def is_partition_name(name: str) -> bool:
    """Whether ``name`` is one this module gives a partition."""
    return any(name == s.default or s.parse(name) is not None for s in SCHEMES)


def is_partitioned(conn: Connection, scheme: Scheme = RESULTS) -> bool:
    """Whether the table is partitioned (PostgreSQL after migration 0009)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": scheme.table}
    ).scalar_one_or_none()
    return kind == "p"


def partitions(conn: Connection, scheme: Scheme = RESULTS) -> list[str]:
    """The names of the table's partitions, sorted (the default one last)."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": scheme.table},
    ).scalars()
    return sorted(names, key=lambda n: (n == scheme.default, n))


def months(conn: Connection, scheme: Scheme = RESULTS) -> list[Month]:
    """The month partitions this module made, oldest first."""
    found = (scheme.parse(name) for name in partitions(conn, scheme))
    return [month for month in found if month is not None]


def create(conn: Connection, wanted: list[Month], scheme: Scheme = RESULTS) -> list[str]:
    """Create the months of ``wanted`` that have no partition yet and the default partition if
    missing, inside the caller's transaction (the table must already be partitioned); returns
    the names created."""
    conn.execute(select(func.pg_advisory_xact_lock(LOCK)))
    table, default = scheme.table, scheme.default
    made: list[str] = []
    existing = set(partitions(conn, scheme))
    if default not in existing:
        conn.exec_driver_sql(f"CREATE TABLE {default} PARTITION OF {table} DEFAULT")
        made.append(default)
    for month in sorted(set(wanted)):
        name = scheme.name(month)
        if name in existing:
            continue
        bounds = f"FROM ({scheme.literal(month.start)}) TO ({scheme.literal(month.end)})"
        where = scheme.within(month)
        if conn.exec_driver_sql(f"SELECT 1 FROM {default} WHERE {where} LIMIT 1").first() is None:
            conn.exec_driver_sql(f"CREATE TABLE {name} PARTITION OF {table} FOR VALUES {bounds}")
        else:
            # The default partition holds rows of this month: attaching a partition over them
            # would be refused, so they move into the new table first.
            conn.exec_driver_sql(
                f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            )
            conn.exec_driver_sql(
                f"WITH moved AS (DELETE FROM {default} WHERE {where} RETURNING *) "
                f"INSERT INTO {name} SELECT * FROM moved"
            )
            conn.exec_driver_sql(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}")
        made.append(name)
    return made


def needed(
    conn: Connection, now: datetime, ahead: int = AHEAD, scheme: Scheme = RESULTS
) -> list[Month]:
    """The months that should have a partition: this one, ``ahead`` more, and every month of
    the rows the default partition holds."""
    wanted = [Month.of(now)]
    for _ in range(ahead):
        wanted.append(wanted[-1].next())
    if scheme.default in partitions(conn, scheme):
        caught = conn.exec_driver_sql(
            f"SELECT DISTINCT {scheme.month_of_row} FROM {scheme.default}"
        ).scalars()
        wanted += [Month(moment.year, moment.month) for moment in caught]
    return sorted(set(wanted))


def ensure(conn: Connection, now: datetime | None = None, ahead: int = AHEAD) -> list[str]:
    """Make the partitions ``needed`` says are missing, of every partitioned table, in the
    caller's transaction; returns the names created (none, and no lock taken, when all are
    there). A no-op on tables that are not partitioned (SQLite)."""
    made: list[str] = []
    for scheme in SCHEMES:
        if not is_partitioned(conn, scheme):
            continue
        wanted = needed(conn, now or datetime.now(UTC), ahead, scheme)
        have = set(months(conn, scheme))
        if any(month not in have for month in wanted) or scheme.default not in partitions(
            conn, scheme
        ):
            made += create(conn, wanted, scheme)
    return made


def before(conn: Connection, cutoff: datetime, scheme: Scheme = RESULTS) -> list[Month]:
    """The month partitions that lie entirely before ``cutoff`` (their rows all older)."""
    return [month for month in months(conn, scheme) if month.end <= cutoff]


def drop(conn: Connection, month: Month, scheme: Scheme = RESULTS) -> None:
    """Drop one month partition with its rows."""
    conn.execute(select(func.pg_advisory_xact_lock(LOCK)))
    name = scheme.name(month)
    conn.exec_driver_sql(f"ALTER TABLE {scheme.table} DETACH PARTITION {name}")
    conn.exec_driver_sql(f"DROP TABLE {name}")

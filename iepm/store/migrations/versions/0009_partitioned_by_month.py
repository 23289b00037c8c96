"""Results and flow records partitioned by month, on PostgreSQL only (iepm/store/partitions.py).

Each table is rebuilt: the old one is renamed, a partitioned table with the same columns is
made with a partition per month its rows span (and the months ahead, and a default), the rows
are copied, the old table dropped, and the keys and indexes built once over the copied rows.
The primary keys become ``(id, started_at)`` and ``(id, start_ms)``, the raw-token key
``(raw_token, started_at)``: a partitioned table's unique keys must hold the partition key.
SQLite is left as it is. The downgrade rebuilds the plain tables the same way.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import op

from iepm.store import partitions
from iepm.store.partitions import FLOWS, RESULTS, Scheme

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Per table: its indexes (name: columns), the unique ones marked by a trailing "!".
INDEXES: dict[Scheme, dict[str, str]] = {
    RESULTS: {
        "ix_results_target_probe_purpose_started_at": "target, probe, purpose, started_at",
        "ix_results_target_monitor_probe_purpose_started_at": (
            "target, monitor, probe, purpose, started_at"
        ),
        "ix_results_probe_started_at": "probe, started_at",
        "ix_results_raw_token": "raw_token!",
    },
    FLOWS: {
        "ix_flows_src_dst_start_ms": "src, dst, start_ms",
        "ix_flows_start_ms": "start_ms",
    },
}


def _move_aside(scheme: Scheme, aside: str) -> str:
    """Rename the table to ``aside`` and drop its keys and indexes (their names are needed
    again, and the copy reads the table whole); returns its column list."""
    table = scheme.table
    op.execute(f"ALTER TABLE {table} RENAME TO {aside}")
    op.execute(f"ALTER TABLE {aside} DROP CONSTRAINT pk_{table}")
    for name in INDEXES[scheme]:
        op.execute(f"DROP INDEX {name}")
    columns = op.get_bind().exec_driver_sql(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
        f"WHERE attrelid = '{aside}'::regclass AND attnum > 0 AND NOT attisdropped"
    )
    return str(columns.scalar_one())


def _keys(scheme: Scheme, partitioned: bool) -> None:
    """The primary key and indexes; on a partitioned table each unique one also holds the
    partition key."""
    table, extra = scheme.table, f", {scheme.column}" if partitioned else ""
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY (id{extra})")
    for name, columns in INDEXES[scheme].items():
        if columns.endswith("!"):
            op.execute(f"CREATE UNIQUE INDEX {name} ON {table} ({columns[:-1]}{extra})")
        else:
            op.execute(f"CREATE INDEX {name} ON {table} ({columns})")
    op.execute(f"ANALYZE {table}")


def _partition(scheme: Scheme) -> None:
    conn = op.get_bind()
    table, aside = scheme.table, f"{scheme.table}_unpartitioned"
    columns = _move_aside(scheme, aside)
    op.execute(
        f"CREATE TABLE {table} (LIKE {aside} INCLUDING DEFAULTS) "
        f"PARTITION BY RANGE ({scheme.column})"
    )
    spanned = conn.exec_driver_sql(f"SELECT DISTINCT {scheme.month_of_row} FROM {aside}")
    wanted = [partitions.Month(moment.year, moment.month) for moment in spanned.scalars()]
    now = partitions.Month.of(datetime.now(UTC))
    for _ in range(partitions.AHEAD + 1):
        wanted.append(now)
        now = now.next()
    partitions.create(conn, wanted, scheme)
    op.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {aside}")
    op.execute(f"DROP TABLE {aside}")
    _keys(scheme, partitioned=True)


def _unpartition(scheme: Scheme) -> None:
    table, aside = scheme.table, f"{scheme.table}_partitioned"
    columns = _move_aside(scheme, aside)
    op.execute(f"CREATE TABLE {table} (LIKE {aside} INCLUDING DEFAULTS)")
    op.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM {aside}")
    op.execute(f"DROP TABLE {aside}")  # its partitions with it
    _keys(scheme, partitioned=False)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for scheme in (RESULTS, FLOWS):
        _partition(scheme)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for scheme in (RESULTS, FLOWS):
        _unpartition(scheme)

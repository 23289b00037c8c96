"""Results partitioned by month of ``started_at``, on PostgreSQL only (iepm/store/partitions.py).

The table is rebuilt: the old one is renamed, a partitioned ``results`` with the same columns
is made with a partition per month its rows span (and the months ahead, and a default), the
rows are copied, the old table dropped, and the keys and indexes built once over the copied
rows. The primary key becomes ``(id, started_at)`` and the raw-token key ``(raw_token,
started_at)``: a partitioned table's unique keys must hold the partition key. SQLite is left
as it is. The downgrade rebuilds the plain table the same way.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from datetime import UTC, datetime

from alembic import op

from iepm.store import partitions

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_results_target_probe_purpose_started_at": "target, probe, purpose, started_at",
    "ix_results_target_monitor_probe_purpose_started_at": (
        "target, monitor, probe, purpose, started_at"
    ),
    "ix_results_probe_started_at": "probe, started_at",
}
OLD = "results_unpartitioned"


def _move_aside(new_name: str) -> str:
    """Rename ``results`` to ``new_name`` and drop its keys and indexes (their names are
    needed again, and the copy reads the table whole); returns its column list."""
    op.execute(f"ALTER TABLE results RENAME TO {new_name}")
    op.execute(f"ALTER TABLE {new_name} DROP CONSTRAINT pk_results")
    for name in [*INDEXES, "ix_results_raw_token"]:
        op.execute(f"DROP INDEX {name}")
    columns = op.get_bind().exec_driver_sql(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
        f"WHERE attrelid = '{new_name}'::regclass AND attnum > 0 AND NOT attisdropped"
    )
    return str(columns.scalar_one())


def _keys(partitioned: bool) -> None:
    key = "id, started_at" if partitioned else "id"
    token = "raw_token, started_at" if partitioned else "raw_token"
    op.execute(f"ALTER TABLE results ADD CONSTRAINT pk_results PRIMARY KEY ({key})")
    op.execute(f"CREATE UNIQUE INDEX ix_results_raw_token ON results ({token})")
    for name, columns in INDEXES.items():
        op.execute(f"CREATE INDEX {name} ON results ({columns})")


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    columns = _move_aside(OLD)
    op.execute(
        f"CREATE TABLE results (LIKE {OLD} INCLUDING DEFAULTS) PARTITION BY RANGE (started_at)"
    )
    spanned = conn.exec_driver_sql(
        "SELECT DISTINCT date_trunc('month', started_at AT TIME ZONE 'UTC') FROM " + OLD
    ).scalars()
    wanted = [partitions.Month(moment.year, moment.month) for moment in spanned]
    now = partitions.Month.of(datetime.now(UTC))
    for _ in range(partitions.AHEAD + 1):
        wanted.append(now)
        now = now.next()
    partitions.create(conn, wanted)
    op.execute(f"INSERT INTO results ({columns}) SELECT {columns} FROM {OLD}")
    op.execute(f"DROP TABLE {OLD}")
    _keys(partitioned=True)
    op.execute("ANALYZE results")


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    aside = "results_partitioned"
    columns = _move_aside(aside)
    op.execute(f"CREATE TABLE results (LIKE {aside} INCLUDING DEFAULTS)")
    op.execute(f"INSERT INTO results ({columns}) SELECT {columns} FROM {aside}")
    op.execute(f"DROP TABLE {aside}")  # its partitions with it
    _keys(partitioned=False)
    op.execute("ANALYZE results")

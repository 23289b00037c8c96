"""Daily summaries by monitor: the index ``(monitor, day)`` on ``daily``.

A mesh pair page (iepm/web/pages/pair.py) reads both directions of one pair over the last days:
``monitor = a and target = b (or b.<route>)`` or the reverse. The table's key leads with the
target, and ``target LIKE 'b.%'`` cannot use it under a non-C collation, so every page read the
whole table: on the 50-host, 90-day mesh (2.2 M daily rows) a parallel sequential scan of 25,480
pages, 144 ms alone and 0.8 / 3.1 s p50 / p99 under 20 clients (benchmarks/mesh_scale.py); with
this index a bitmap scan of the two monitors' last days, 365 pages and 2.2 ms (EXPLAIN ANALYZE,
README's mesh section).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_daily_monitor_day", "daily", ["monitor", "day"])


def downgrade() -> None:
    op.drop_index("ix_daily_monitor_day", table_name="daily")

"""Daily summaries by metric: the index ``(probe, metric, day)`` on ``daily``.

The mesh grid (iepm/web/pages/mesh.py) sums one metric of every path over the last days; the
daily table's key leads with the target, so without this index it read the whole table (every
path, metric and day kept for ever) at each refresh: on a 20-host mesh of 30 days (117,800 daily
rows) 1,360 pages and ~340 ms on the busy test machine, against 458 pages and 3–20 ms with it
(EXPLAIN ANALYZE, README's mesh section); the table grows with every day kept, the grid's read
with its window only.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_daily_probe_metric_day", "daily", ["probe", "metric", "day"])


def downgrade() -> None:
    op.drop_index("ix_daily_probe_metric_day", table_name="daily")

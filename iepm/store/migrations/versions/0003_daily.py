"""Per-day summaries of each path's results (``daily``), filled from the results already
stored.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "daily",
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("metric", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("total_sq", sa.Float(), nullable=True),
        sa.Column("minimum", sa.Float(), nullable=True),
        sa.Column("maximum", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("target", "monitor", "probe", "day", "metric", name="pk_daily"),
        sqlite_with_rowid=False,
    )
    # The archive's existing results: one pass, one path at a time.
    from iepm.store import rollup

    # No purpose column yet (revision 0004): every result then was routine.
    rollup.rebuild(op.get_bind(), by_purpose=False)


def downgrade() -> None:
    op.drop_table("daily")

"""Live samples (each ping reply, interface rates) and the tests running now: ``live_samples``,
``live_running``.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "live_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("metric", sa.Text(), nullable=False),
        sa.Column("t_s", sa.Float(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_live_samples"),
    )
    op.create_index("ix_live_samples_t_s", "live_samples", ["t_s"])
    op.create_table(
        "live_running",
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("started_s", sa.Float(), nullable=False),
        sa.Column("expires_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("monitor", "probe", "target", name="pk_live_running"),
    )


def downgrade() -> None:
    op.drop_table("live_running")
    op.drop_index("ix_live_samples_t_s", table_name="live_samples")
    op.drop_table("live_samples")

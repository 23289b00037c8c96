"""Initial archive: results and scheduler cycles.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "results",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("schema", sa.Integer(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("tool_version", sa.Text(), nullable=True),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("target_address", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("diags", sa.Text(), nullable=False),
        sa.Column("raw_token", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_results"),
    )
    op.create_index(
        "ix_results_target_probe_started_at", "results", ["target", "probe", "started_at"]
    )
    op.create_index("ix_results_probe_started_at", "results", ["probe", "started_at"])
    op.create_index("ix_results_raw_token", "results", ["raw_token"], unique=True)
    op.create_table(
        "cycles",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("interval_s", sa.Float(), nullable=False),
        sa.Column("overran", sa.Boolean(), nullable=False),
        sa.Column("n_results", sa.Integer(), nullable=False),
        sa.Column("n_failed", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cycles"),
    )
    op.create_index("ix_cycles_monitor_started_at", "cycles", ["monitor", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_cycles_monitor_started_at", table_name="cycles")
    op.drop_table("cycles")
    op.drop_index("ix_results_raw_token", table_name="results")
    op.drop_index("ix_results_probe_started_at", table_name="results")
    op.drop_index("ix_results_target_probe_started_at", table_name="results")
    op.drop_table("results")

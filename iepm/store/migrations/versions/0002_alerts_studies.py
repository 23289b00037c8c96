"""Alerts (step changes with their likely cause), tuning/duration/impact studies and the tuned
parameters the scheduler uses.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("metric", sa.Text(), nullable=False),
        sa.Column("detected_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("change_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("direction", sa.Text(), nullable=False),
        sa.Column("before", sa.Float(), nullable=True),
        sa.Column("after", sa.Float(), nullable=True),
        sa.Column("change_percent", sa.Float(), nullable=True),
        sa.Column("cause", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivery_attempts", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index("ix_alerts_target_detected_at", "alerts", ["target", "detected_at"])
    op.create_index("ix_alerts_detected_at", "alerts", ["detected_at"])
    op.create_table(
        "studies",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("partial", sa.Boolean(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_studies"),
    )
    op.create_index(
        "ix_studies_target_kind_started_at", "studies", ["target", "kind", "started_at"]
    )
    op.create_table(
        "tuned_params",
        sa.Column("monitor", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("study_id", sa.Text(), nullable=True),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("monitor", "target", "probe", name="pk_tuned_params"),
    )


def downgrade() -> None:
    op.drop_table("tuned_params")
    op.drop_index("ix_studies_target_kind_started_at", table_name="studies")
    op.drop_table("studies")
    op.drop_index("ix_alerts_detected_at", table_name="alerts")
    op.drop_index("ix_alerts_target_detected_at", table_name="alerts")
    op.drop_table("alerts")

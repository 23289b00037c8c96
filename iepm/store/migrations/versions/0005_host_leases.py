"""Host leases of a mesh: a bandwidth test holds a row per host it uses (iepm/mesh/leases.py).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_leases",
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("probe", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("expires_s", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("host", name="pk_host_leases"),
    )
    op.create_index("ix_host_leases_token", "host_leases", ["token"])


def downgrade() -> None:
    op.drop_index("ix_host_leases_token", table_name="host_leases")
    op.drop_table("host_leases")

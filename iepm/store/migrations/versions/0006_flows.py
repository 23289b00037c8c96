"""Flow records (NetFlow v5/v9, IPFIX, nfcapd imports): the ``flows`` table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "flows",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("exporter", sa.Text(), nullable=False),
        sa.Column("domain", sa.BigInteger(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("src", sa.Text(), nullable=False),
        sa.Column("dst", sa.Text(), nullable=False),
        sa.Column("sport", sa.Integer(), nullable=False),
        sa.Column("dport", sa.Integer(), nullable=False),
        sa.Column("proto", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("packets", sa.BigInteger(), nullable=False),
        sa.Column("start_ms", sa.BigInteger(), nullable=False),
        sa.Column("end_ms", sa.BigInteger(), nullable=False),
        sa.Column("sampling", sa.BigInteger(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_flows"),
    )
    op.create_index("ix_flows_src_dst_start_ms", "flows", ["src", "dst", "start_ms"])
    op.create_index("ix_flows_start_ms", "flows", ["start_ms"])


def downgrade() -> None:
    op.drop_index("ix_flows_start_ms", table_name="flows")
    op.drop_index("ix_flows_src_dst_start_ms", table_name="flows")
    op.drop_table("flows")

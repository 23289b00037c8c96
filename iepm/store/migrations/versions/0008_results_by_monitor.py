"""Results by monitor: the index ``(target, monitor, probe, purpose, started_at)``.

In a mesh many monitors measure one target, and a path is (monitor, target): a page of one
path's results (``/api/v1/results?target=&monitor=``, the pair page's series) otherwise walks
every monitor's rows of the target and filters them in the table. Measured on a 50-host mesh of
1.18 M results (benchmarks/mesh_scale.py): see the README's mesh section.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_results_target_monitor_probe_purpose_started_at",
        "results",
        ["target", "monitor", "probe", "purpose", "started_at"],
    )


def downgrade() -> None:
    op.drop_index("ix_results_target_monitor_probe_purpose_started_at", table_name="results")

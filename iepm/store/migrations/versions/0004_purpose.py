"""Results carry their purpose (``routine`` or ``study``); the transfers that tuning and impact
studies stored before are found through the result ids their study rows name, and the daily
summaries are rebuilt without them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
UPDATE_CHUNK = 500


def _result_ids(value: Any) -> Iterator[str]:
    """Every string under a key ending in ``result_id`` (``iperf3_result_id``,
    ``ping_during_result_id``, …), however deep in a study's data."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.endswith("result_id") and isinstance(item, str):
                yield item
            else:
                yield from _result_ids(item)
    elif isinstance(value, list):
        for item in value:
            yield from _result_ids(item)


def upgrade() -> None:
    op.add_column(
        "results",
        sa.Column("purpose", sa.Text(), nullable=False, server_default="routine"),
    )
    op.drop_index("ix_results_target_probe_started_at", table_name="results")
    op.create_index(
        "ix_results_target_probe_purpose_started_at",
        "results",
        ["target", "probe", "purpose", "started_at"],
    )
    conn = op.get_bind()
    studies = sa.table("studies", sa.column("data", sa.JSON()))
    results = sa.table("results", sa.column("id", sa.Text()), sa.column("purpose", sa.Text()))
    named = conn.execute(sa.select(studies.c.data))
    ids = sorted({result_id for (data,) in named for result_id in _result_ids(data)})
    for start in range(0, len(ids), UPDATE_CHUNK):
        chunk = ids[start : start + UPDATE_CHUNK]
        conn.execute(sa.update(results).where(results.c.id.in_(chunk)).values(purpose="study"))
    if ids:
        from iepm.store import rollup

        rollup.rebuild(conn)


def downgrade() -> None:
    op.drop_index("ix_results_target_probe_purpose_started_at", table_name="results")
    op.create_index(
        "ix_results_target_probe_started_at", "results", ["target", "probe", "started_at"]
    )
    with op.batch_alter_table("results") as batch:
        batch.drop_column("purpose")

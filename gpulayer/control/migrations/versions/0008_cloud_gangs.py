"""Schema 8: cloud gangs, the instances of one launch with their node ranks."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_columns, record_schema_number

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns("instances", sa.Column("launch_id", sa.String(length=64), nullable=True))
    ensure_columns(
        "instances", sa.Column("node_rank", sa.Integer(), nullable=False, server_default="0")
    )
    record_schema_number(8)

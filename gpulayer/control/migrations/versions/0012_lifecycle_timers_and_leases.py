"""Schema 12: the lifecycle's timers and in-flight steps as columns (leases, capacity waits,
the check and reclaim times), so a restart or a second controller sees them."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_columns, ensure_table, record_schema_number

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns(
        "instances",
        sa.Column("checked_at", sa.Float(), nullable=True),
        sa.Column("reclaimed_at", sa.Float(), nullable=True),
    )
    ensure_table(
        "lifecycle_leases",
        sa.Column("key", sa.String(length=128), nullable=False),
        sa.Column("lock_token", sa.String(length=32), nullable=False),
        sa.Column("lock_expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    ensure_table(
        "capacity_waits",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("not_before", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    record_schema_number(12)

"""Schema 3: the ledger of rented instances."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_index, ensure_table, record_schema_number

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "instances",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("region", sa.String(length=64), nullable=True),
        sa.Column("zone", sa.String(length=64), nullable=True),
        sa.Column("instance_type", sa.String(length=128), nullable=True),
        sa.Column("instance_id", sa.String(length=128), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("ssh_host", sa.String(length=255), nullable=True),
        sa.Column("key_path", sa.Text(), nullable=True),
        sa.Column("hourly_price", sa.Float(), nullable=True),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("spot", sa.Boolean(), nullable=False),
        sa.Column("tags", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("launched_at", sa.Float(), nullable=True),
        sa.Column("ready_at", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("request_id"),
    )
    ensure_index("instances", "ix_instances_job", ["job_id"])
    ensure_index("instances", "ix_instances_state", ["state"])
    record_schema_number(3)

"""Schema 4: per-worker credentials and fencing epochs, schedules, log-size bookkeeping."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulayer.control.migrations import (
    ensure_columns,
    ensure_index,
    ensure_table,
    record_schema_number,
)

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "schedules",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("suspend", sa.Boolean(), nullable=False),
        sa.Column("working_dir", sa.Text(), nullable=True),
        sa.Column("has_bundle", sa.Boolean(), nullable=False),
        sa.Column("watermark", sa.Float(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    ensure_table(
        "log_usage",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("cut_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.PrimaryKeyConstraint("job_id"),
    )
    ensure_table(
        "schedule_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("schedule_id", sa.String(length=32), nullable=False),
        sa.Column("tick", sa.Float(), nullable=False),
        sa.Column("manual", sa.Boolean(), nullable=False),
        sa.Column("outcome", sa.String(length=24), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    ensure_index("schedule_runs", "ix_schedule_runs_job", ["job_id"])
    ensure_index("schedule_runs", "ux_schedule_runs_tick", ["schedule_id", "tick"], unique=True)
    ensure_table(
        "schedule_sources",
        sa.Column("schedule_id", sa.String(length=32), nullable=False),
        sa.Column("bundle", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
        ),
        sa.PrimaryKeyConstraint("schedule_id"),
    )
    ensure_columns("attempts", sa.Column("worker_epoch", sa.Integer(), nullable=True))
    ensure_columns("tokens", sa.Column("id", sa.String(length=16), nullable=True))
    ensure_columns(
        "tokens", sa.Column("scheme", sa.String(length=8), nullable=False, server_default="sha256")
    )
    ensure_columns("tokens", sa.Column("salt", sa.String(length=64), nullable=True))
    ensure_columns("tokens", sa.Column("digest", sa.String(length=128), nullable=True))
    ensure_columns("tokens", sa.Column("worker_id", sa.String(length=32), nullable=True))
    ensure_columns("tokens", sa.Column("parent_id", sa.String(length=16), nullable=True))
    ensure_columns("tokens", sa.Column("expires_at", sa.Float(), nullable=True))
    ensure_columns("tokens", sa.Column("max_workers", sa.Integer(), nullable=True))
    ensure_columns(
        "tokens", sa.Column("registered", sa.Integer(), nullable=False, server_default="0")
    )
    ensure_columns("tokens", sa.Column("revoked_at", sa.Float(), nullable=True))
    # Schema 3's "worker" tokens were join tokens; "worker" now names one worker's own.
    op.execute(sa.text("UPDATE tokens SET kind = 'join' WHERE kind = 'worker'"))
    op.execute(sa.text("UPDATE tokens SET id = 't-' || substr(hash, 1, 10) WHERE id IS NULL"))
    ensure_index("tokens", "ix_tokens_id", ["id"], unique=True)
    ensure_index("tokens", "ix_tokens_worker", ["worker_id"])
    record_schema_number(4)

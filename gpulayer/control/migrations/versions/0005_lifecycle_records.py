"""Schema 5: what the lifecycle needs to resume an instance after a restart: its offer,
state time, tunnel and install; the transition history and reservations."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import (
    ensure_columns,
    ensure_index,
    ensure_table,
    record_schema_number,
)

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "instance_transitions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("from_state", sa.String(length=16), nullable=True),
        sa.Column("to_state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["instances.request_id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    ensure_index("instance_transitions", "ix_instance_transitions_request", ["request_id", "id"])
    ensure_table(
        "reservations",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("worker_id", sa.String(length=32), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("bound_at", sa.Float(), nullable=True),
        sa.Column("released_at", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
        ),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["instances.request_id"],
        ),
        sa.PrimaryKeyConstraint("request_id"),
    )
    ensure_index("reservations", "ix_reservations_job", ["job_id", "state"])
    ensure_index("reservations", "ix_reservations_worker", ["worker_id"])
    ensure_columns("instances", sa.Column("offer", sa.Text(), nullable=True))
    ensure_columns("instances", sa.Column("state_since", sa.Float(), nullable=True))
    ensure_columns("instances", sa.Column("tunnel_port", sa.Integer(), nullable=True))
    ensure_columns("instances", sa.Column("token_hash", sa.String(length=64), nullable=True))
    ensure_columns("instances", sa.Column("install_dir", sa.Text(), nullable=True))
    ensure_columns("instances", sa.Column("machine", sa.Text(), nullable=True))
    record_schema_number(5)

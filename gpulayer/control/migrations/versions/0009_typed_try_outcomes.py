"""Schema 9: typed try outcomes and the lifecycle's restart-safe memory."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulayer.control.migrations import ensure_columns, ensure_index, record_schema_number
from gpulayer.control.outcome_migration import outcomes_from_notes

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns("instances", sa.Column("outcome", sa.String(length=16), nullable=True))
    ensure_columns("instances", sa.Column("outcome_scope", sa.String(length=16), nullable=True))
    ensure_columns("instances", sa.Column("outcome_message", sa.Text(), nullable=True))
    ensure_columns("instances", sa.Column("hold_until", sa.Float(), nullable=True))
    ensure_columns("instances", sa.Column("last_error", sa.Text(), nullable=True))
    ensure_columns(
        "instances", sa.Column("step_failures", sa.Integer(), nullable=False, server_default="0")
    )
    ensure_columns("instances", sa.Column("next_step_at", sa.Float(), nullable=True))
    ensure_columns("instances", sa.Column("unreachable_since", sa.Float(), nullable=True))
    ensure_index("instances", "ix_instances_hold", ["hold_until"])
    outcomes_from_notes(op.get_bind())
    record_schema_number(9)

"""Schema 2: hashed tokens of the team server; jobs ordered by creation time, not a sequence."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulayer.control.migrations import (
    drop_index_if_present,
    ensure_index,
    ensure_table,
    record_schema_number,
)

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "tokens",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("hash"),
    )
    drop_index_if_present("jobs", "ix_jobs_state_seq")
    if "seq" in {c["name"] for c in sa.inspect(op.get_bind()).get_columns("jobs")}:
        # Unique and in an index, so SQLite copies the table to drop it.
        with op.batch_alter_table("jobs") as batch_op:
            batch_op.drop_column("seq")
    ensure_index("jobs", "ix_jobs_created", ["created_at"])
    ensure_index("jobs", "ix_jobs_state_created", ["state", "created_at"])
    record_schema_number(2)

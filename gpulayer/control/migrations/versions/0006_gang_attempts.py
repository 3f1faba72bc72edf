"""Schema 6: a gang has one attempt per node under one number."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import (
    drop_index_if_present,
    ensure_columns,
    ensure_index,
    record_schema_number,
)

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns(
        "attempts", sa.Column("node_rank", sa.Integer(), nullable=False, server_default="0")
    )
    ensure_columns("attempts", sa.Column("result", sa.Text(), nullable=True))
    drop_index_if_present("attempts", "ix_attempts_job")
    ensure_index("attempts", "ix_attempts_job", ["job_id", "number", "node_rank"], unique=True)
    ensure_columns("logs", sa.Column("node", sa.Integer(), nullable=True))
    record_schema_number(6)

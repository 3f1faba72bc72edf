"""Schema 7: the jobs page's index and the dashboard's sessions and login links."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_index, ensure_table, record_schema_number

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "ui_login_links",
        sa.Column("code_hash", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("used_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("code_hash"),
    )
    ensure_table(
        "ui_sessions",
        sa.Column("id_hash", sa.String(length=64), nullable=False),
        sa.Column("csrf", sa.String(length=64), nullable=False),
        sa.Column("token_id", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id_hash"),
    )
    ensure_index("jobs", "ix_jobs_created_id", ["created_at", "id"])
    record_schema_number(7)

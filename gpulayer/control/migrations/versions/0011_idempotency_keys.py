"""Schema 11: the answers of create requests, by caller and Idempotency-Key."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_index, ensure_table, record_schema_number

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "idempotency_keys",
        sa.Column("caller", sa.String(length=64), nullable=False),
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("answer", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("caller", "key"),
    )
    ensure_index("idempotency_keys", "ix_idempotency_keys_created", ["created_at"])
    record_schema_number(11)

"""Schema 15: the team server's secret store (``secrets``: each value encrypted, with its
scope, name and times)."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_table, record_schema_number

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_table(
        "secrets",
        sa.Column("scope", sa.String(length=64), primary_key=True),
        sa.Column("name", sa.String(length=128), primary_key=True),
        sa.Column("ciphertext", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )
    record_schema_number(15)

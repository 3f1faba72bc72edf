"""Schema 10: a job names its kept bundle by digest in its row."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_columns, ensure_index, record_schema_number

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns("jobs", sa.Column("bundle_digest", sa.String(length=64), nullable=True))
    ensure_index("jobs", "ix_jobs_bundle_digest", ["bundle_digest"])
    record_schema_number(10)

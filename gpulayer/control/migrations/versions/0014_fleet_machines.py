"""Schema 14: named fleets. A fleet's machine is launched before any job wants it, so an
instance (and its reservation) may belong to no job until one takes it (``job_id`` NULL), and
each instance names the fleet it belongs to (``fleet``; NULL for a job's own machine)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpulayer.control.migrations import ensure_columns, record_schema_number

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns("instances", sa.Column("fleet", sa.String(length=64), nullable=True))
    for table in ("instances", "reservations"):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("job_id", existing_type=sa.String(length=32), nullable=True)
    record_schema_number(14)

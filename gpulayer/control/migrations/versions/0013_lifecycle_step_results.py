"""Schema 13: what each instance's last lifecycle step found (its StepResult as JSON, the
step's name and time), and since when a restarted controller is to reopen a worker's tunnel,
so a second controller, a restart and the instance listing read them from the store."""

from __future__ import annotations

import sqlalchemy as sa

from gpulayer.control.migrations import ensure_columns, record_schema_number

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_columns(
        "instances",
        sa.Column("last_step", sa.String(length=16), nullable=True),
        sa.Column("last_step_result", sa.Text(), nullable=True),
        sa.Column("step_at", sa.Float(), nullable=True),
        sa.Column("relink_since", sa.Float(), nullable=True),
    )
    record_schema_number(13)

"""Schema 9: typed try outcomes and the lifecycle's restart-safe memory.

Its data step: tries recorded before outcomes had columns of their own kept them in the
instance's note as text ("capacity/zone: ...", "failed: ...", "config: ..."). They are read
once, here, into the typed columns; nothing parses a note after that. The revision names the
columns it reads and writes itself, as they were at schema 9, so it replays the same whatever
the tables look like later.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

from gpulayer.control.migrations import ensure_columns, ensure_index, record_schema_number

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_INSTANCES = sa.table(
    "instances",
    sa.column("request_id", sa.String()),
    sa.column("note", sa.Text()),
    sa.column("outcome", sa.String()),
    sa.column("outcome_scope", sa.String()),
    sa.column("outcome_message", sa.Text()),
)
_SCOPED = ("capacity", "quota", "auth", "partial")
_SCOPES = ("offer", "zone", "region", "provider")
_UNSCOPED = ("failed", "config")
_RECLAIMED_NOTE = "reclaimed by the provider"


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
    _outcomes_from_notes(op.get_bind())
    record_schema_number(9)


def outcome_from_note(note: str | None) -> tuple[str, str | None, str] | None:
    """(outcome, scope, message) as an older gpulayer wrote it into a note; None for notes
    that recorded no fault."""
    text = note or ""
    if text == _RECLAIMED_NOTE:
        return ("reclaimed", None, text)
    head, _, message = text.partition(": ")
    kind, _, scope = head.partition("/")
    if kind in _SCOPED and scope in _SCOPES:
        return (kind, scope, message)
    if kind in _UNSCOPED and not scope:
        return (kind, None, message)
    return None


def _outcomes_from_notes(conn: Any) -> None:
    rows = conn.execute(
        sa.select(_INSTANCES.c.request_id, _INSTANCES.c.note).where(
            _INSTANCES.c.outcome.is_(None)
        )
    ).all()
    for request_id, note in rows:
        found = outcome_from_note(note)
        if found is None:
            continue
        outcome, scope, message = found
        conn.execute(
            sa.update(_INSTANCES)
            .where(_INSTANCES.c.request_id == request_id)
            .values(outcome=outcome, outcome_scope=scope, outcome_message=message)
        )

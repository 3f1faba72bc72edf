"""Schema 9's data step: tries recorded before outcomes had columns of their own kept them in
the instance's note as text ("capacity/zone: ...", "failed: ...", "config: ..."). They are
read once, here, into the typed columns; nothing parses a note after that."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from gpulayer.control import tables as t

_SCOPED = ("capacity", "quota", "auth", "partial")
_SCOPES = ("offer", "zone", "region", "provider")
_UNSCOPED = ("failed", "config")
_RECLAIMED_NOTE = "reclaimed by the provider"


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


def outcomes_from_notes(conn: Any) -> None:
    rows = conn.execute(
        select(t.instances.c.request_id, t.instances.c.note).where(t.instances.c.outcome.is_(None))
    ).all()
    for request_id, note in rows:
        found = outcome_from_note(note)
        if found is None:
            continue
        outcome, scope, message = found
        conn.execute(
            update(t.instances)
            .where(t.instances.c.request_id == request_id)
            .values(outcome=outcome, outcome_scope=scope, outcome_message=message)
        )

"""Alembic's environment for the store: the store hands over its open connection (in
``config.attributes["connection"]``), already in the transaction the whole upgrade runs in.

No metadata is given: each revision names the tables and columns it touches as they were at
its schema number, so replaying an old revision never runs against today's columns."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=None,
    # SQLite alters a table by copying it; batch operations do that where needed.
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()

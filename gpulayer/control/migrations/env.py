"""Alembic's environment for the store: the store hands over its open connection (in
``config.attributes["connection"]``), already in the transaction the whole upgrade runs in."""

from __future__ import annotations

from alembic import context

from gpulayer.control import tables

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=tables.metadata,
    # SQLite alters a table by copying it; batch operations do that where needed.
    render_as_batch=True,
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()

"""The store's schema migrations, run by Alembic (one revision per schema number).

Revision ``00NN`` brings a database to schema NN. Each also writes NN into the ``meta`` table,
which is where a gpulayer from before these revisions looks to refuse a newer database.
The store migrates forward only: no revision has a downgrade.
"""

from __future__ import annotations

from typing import Any

from alembic import op
from sqlalchemy import Column, column, inspect, table, update

_META = table("meta", column("key"), column("value"))


def record_schema_number(number: int) -> None:
    op.execute(update(_META).where(_META.c.key == "schema").values(value=str(number)))


# Builds between schema numbers wrote databases that already hold some of what the next
# number adds (a table or column that landed before its number was bumped). Every change a
# revision makes is therefore made only where it is missing: running a revision over such a
# database finishes it instead of failing on what is there.


def _has_table(name: str) -> bool:
    return bool(inspect(op.get_bind()).has_table(name))


def ensure_table(name: str, *elements: Any) -> None:
    if not _has_table(name):
        op.create_table(name, *elements)


def ensure_columns(table_name: str, *columns: Column[Any]) -> None:
    present = {c["name"] for c in inspect(op.get_bind()).get_columns(table_name)}
    missing = [c for c in columns if c.name not in present]
    if missing:
        with op.batch_alter_table(table_name) as batch:
            for column_ in missing:
                batch.add_column(column_)


def _index_names(table_name: str) -> set[str]:
    return {str(i["name"]) for i in inspect(op.get_bind()).get_indexes(table_name)}


def ensure_index(table_name: str, name: str, columns: list[str], *, unique: bool = False) -> None:
    if name not in _index_names(table_name):
        op.create_index(name, table_name, columns, unique=unique)


def drop_index_if_present(table_name: str, name: str) -> None:
    if name in _index_names(table_name):
        op.drop_index(name, table_name=table_name)

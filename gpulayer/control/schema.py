"""Which schema a store's database is at, and bringing it to this gpulayer's (Alembic).

A database is at one of three kinds of place:
- empty: the current tables are created whole and marked as at the head revision (running
  every revision from the first would build the same schema, which a test checks, only slower);
- written by a gpulayer from before Alembic: its ``meta`` row names the schema number, which is
  the revision it is at;
- at an Alembic revision: the revisions after it run.

Alembic is imported only when there is something to upgrade: opening a database that is
current reads one row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Connection, MetaData, String, Table, insert, inspect, select

from gpulayer.control import tables as t
from gpulayer.errors import GpulayerError


def revision_of_number(number: int) -> str:
    return f"{number:04d}"


MIGRATIONS = Path(__file__).with_name("migrations")


def _newest_revision() -> str:
    numbers = [
        match.group(1)
        for path in (MIGRATIONS / "versions").iterdir()
        if (match := re.fullmatch(r"([0-9]{4})_\w+\.py", path.name))
    ]
    return max(numbers)


HEAD = _newest_revision()
"""This gpulayer's schema: the newest revision under migrations/versions, whose file name
starts with its number. The one place the schema version is kept."""

# Alembic's own bookkeeping table, as Alembic defines it: written here only for a database
# this gpulayer creates whole.
_VERSION_TABLE = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)


class SchemaError(GpulayerError):
    """The database's schema is one this gpulayer cannot use."""


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at; None for an empty one."""
    present = set(inspect(conn).get_table_names())
    number = None
    if t.meta.name in present:
        number = conn.execute(select(t.meta.c.value).where(t.meta.c.key == "schema")).scalar()
    # Every gpulayer writes its schema number, so an older one reads it to refuse a newer
    # database: whichever of the two is further on says where the database is.
    found = revision_of_number(int(number)) if number is not None else None
    if _VERSION_TABLE.name in present:
        revision = conn.execute(select(_VERSION_TABLE.c.version_num)).scalar()
        if revision is not None and (found is None or str(revision) > found):
            found = str(revision)
    return found


def bring_up_to_date(conn: Connection) -> None:
    """Bring the database on ``conn`` (in a transaction) to :data:`HEAD`, keeping every row."""
    found = current_revision(conn)
    if found == HEAD:
        return
    if found is None:
        t.metadata.create_all(conn, checkfirst=True)
        conn.execute(insert(t.meta).values(key="schema", value=str(int(HEAD))))
        _VERSION_TABLE.create(conn, checkfirst=True)
        conn.execute(insert(_VERSION_TABLE).values(version_num=HEAD))
        return
    if not re.fullmatch(r"\d{4}", found) or found > HEAD:
        raise SchemaError(
            f"database schema {found.lstrip('0')} is newer than this gpulayer understands "
            f"({int(HEAD)}); upgrade gpulayer"
        )
    upgrade(conn, found)


def upgrade(conn: Connection, found: str, to: str = "head") -> None:
    from alembic import command

    config = alembic_config(conn)
    if not inspect(conn).has_table(_VERSION_TABLE.name):
        # Written by a gpulayer from before Alembic: its schema number is its revision.
        command.stamp(config, found)
    command.upgrade(config, to)


def alembic_config(conn: Connection | None = None) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config

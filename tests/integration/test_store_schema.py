"""The store's schema is versioned: opening an older database upgrades it and keeps its rows."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gpulayer.control import tables
from gpulayer.control.store import Store, StoreError


def make_schema_2_database(path: Path) -> None:
    """A database as schema 2 left it: every table but the instance ledger."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{path}")
    older = [t for name, t in tables.metadata.tables.items() if name != "instances"]
    tables.metadata.create_all(engine, tables=older)
    engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema', '2')")
        conn.execute(
            "INSERT INTO jobs (id, name, spec, state, target, has_bundle, attempts, cancel_requested,"
            " created_at, labels) VALUES ('j-old', 'old', ?, 'succeeded', 'local', 0, 1, 0, 1.0, '{}')",
            (json.dumps({"workload": {"kind": "command", "command": ["true"]}}),),
        )


def test_upgrade_keeps_existing_jobs_and_adds_new_tables(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    make_schema_2_database(database)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == tables.SCHEMA_VERSION == 3
    assert store.get_job("j-old").name == "old"
    assert store.list_instances() == []  # the new ledger table exists and works
    store.close()
    again = Store(f"sqlite:///{database}")  # a second open is a no-op
    assert again.get_job("j-old").state == "succeeded"
    again.close()


def test_a_newer_schema_is_refused_rather_than_damaged(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    Store(f"sqlite:///{database}").close()
    with sqlite3.connect(database) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    with pytest.raises(StoreError, match="newer"):
        Store(f"sqlite:///{database}")

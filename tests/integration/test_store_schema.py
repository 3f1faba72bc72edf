"""The store's schema is versioned: opening an older database upgrades it and keeps its rows."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from gpulayer.control import tables
from gpulayer.control.auth import TokenAuthority
from gpulayer.control.store import Store, StoreError

_SCHEMA_4_COLUMNS = {
    "attempts": ["worker_epoch"],
    "tokens": [
        "id",
        "scheme",
        "salt",
        "digest",
        "worker_id",
        "parent_id",
        "expires_at",
        "max_workers",
        "registered",
        "revoked_at",
    ],
}


def make_schema_2_database(path: Path) -> None:
    """A database as schema 2 left it: no instance ledger, and tokens and attempts as they were."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{path}")
    older = [t for name, t in tables.metadata.tables.items() if name != "instances"]
    tables.metadata.create_all(engine, tables=older)
    engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX ix_tokens_id")
        conn.execute("DROP INDEX ix_tokens_worker")
        for table, columns in _SCHEMA_4_COLUMNS.items():
            for column in columns:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("INSERT INTO meta (key, value) VALUES ('schema', '2')")
        conn.execute(
            "INSERT INTO jobs (id, name, spec, state, target, has_bundle, attempts, cancel_requested,"
            " created_at, labels) VALUES ('j-old', 'old', ?, 'succeeded', 'local', 0, 1, 0, 1.0, '{}')",
            (json.dumps({"workload": {"kind": "command", "command": ["true"]}}),),
        )
        # Schema 2's worker tokens were what are now join tokens.
        conn.execute(
            "INSERT INTO tokens (hash, kind, name, created_at) VALUES (?, 'worker', 'old', 1.0)",
            (hashlib.sha256(b"an-old-join-token").hexdigest(),),
        )


def test_upgrade_keeps_existing_rows_and_adds_new_tables_and_columns(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    make_schema_2_database(database)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == tables.SCHEMA_VERSION == 5
    assert store.get_job("j-old").name == "old"
    assert store.list_instances() == []  # the new ledger table exists and works
    (old_token,) = store.list_tokens()
    assert old_token.kind == "join" and old_token.id.startswith("t-")
    assert old_token.scheme == "sha256" and old_token.registered == 0
    principal = TokenAuthority(store)("an-old-join-token")
    assert principal is not None and principal.kind == "join"
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

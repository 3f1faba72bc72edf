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

_LATER_COLUMNS = {
    "attempts": ["worker_epoch", "node_rank", "result"],
    "logs": ["node"],
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
        conn.execute("DROP INDEX ix_attempts_job")
        for table, columns in _LATER_COLUMNS.items():
            for column in columns:
                conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("CREATE UNIQUE INDEX ix_attempts_job ON attempts (job_id, number)")
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
    assert store.schema_version() == tables.SCHEMA_VERSION == 9
    assert store.get_job("j-old").name == "old"
    # Schema 6: a gang's nodes share one attempt number, so the old unique index is gone.
    store.upsert_worker(worker_id="w-a", name="a", kind="remote", labels={}, capabilities={})
    store.upsert_worker(worker_id="w-b", name="b", kind="remote", labels={}, capabilities={})
    old = store.insert_job(
        job_id="j-gang",
        name="gang",
        spec={},
        state="queued",
        target="remote",
        working_dir=None,
        has_bundle=False,
        labels={},
    )
    nodes = store.assign_gang(old.id, [("w-a", []), ("w-b", [])])
    assert nodes is not None and [(a.number, a.node_rank) for a in nodes] == [(1, 0), (1, 1)]
    assert store.list_instances() == []  # the new ledger table exists and works
    # Schema 8: an old store's instances table takes a gang's launch id and node ranks.
    (node,) = store.record_instances(
        [
            {
                "request_id": "r-1",
                "job_id": old.id,
                "owner": "o",
                "provider": "ssh",
                "state": "requested",
                "launch_id": "r-1",
                "node_rank": 1,
            }
        ]
    )
    assert (node.launch_id, node.node_rank) == ("r-1", 1)
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


def make_schema_3_database(path: Path) -> None:
    """A database as schema 3 left it: the instance ledger without the lifecycle's columns."""
    make_schema_2_database(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
        conn.execute(
            "CREATE TABLE instances (request_id VARCHAR(64) PRIMARY KEY, job_id VARCHAR(32) NOT"
            " NULL, owner VARCHAR(64) NOT NULL, provider VARCHAR(64) NOT NULL, region VARCHAR(64),"
            " zone VARCHAR(64), instance_type VARCHAR(128), instance_id VARCHAR(128), state"
            " VARCHAR(16) NOT NULL, ssh_host VARCHAR(255), key_path TEXT, hourly_price FLOAT,"
            " currency VARCHAR(3) NOT NULL, spot BOOLEAN NOT NULL, tags TEXT NOT NULL, created_at"
            " FLOAT NOT NULL, launched_at FLOAT, ready_at FLOAT, ended_at FLOAT, note TEXT)"
        )
        conn.execute(
            "INSERT INTO instances (request_id, job_id, owner, provider, state, currency, spot,"
            " tags, created_at, ended_at) VALUES ('r-old', 'j-old', 'o-1', 'aws', 'terminated',"
            " 'USD', 0, '{}', 1.0, 2.0)"
        )


def test_upgrade_from_3_adds_the_lifecycle_columns_and_tables(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    make_schema_3_database(database)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == 9
    (old,) = store.list_instances()
    assert (old.request_id, old.state, old.offer, old.tunnel_port) == (
        "r-old",
        "terminated",
        None,
        None,
    )
    assert store.instance_history("r-old") == [] and store.reservation("r-old") is None
    new = store.record_instance(
        reason="offer ssh/lab/box",
        request_id="r-new",
        job_id="j-old",
        owner="o-1",
        provider="ssh",
        state="requested",
        tags={},
        offer={"provider": "ssh", "region": "lab", "instance_type": "box"},
    )
    assert new.offer == {"provider": "ssh", "region": "lab", "instance_type": "box"}
    assert store.move_instance("r-new", expect="requested", to="launching", reason="go")
    assert not store.move_instance("r-new", expect="requested", to="launching", reason="again")
    assert [(h.from_state, h.to_state) for h in store.instance_history("r-new")] == [
        (None, "requested"),
        ("requested", "launching"),
    ]
    reservation = store.reservation("r-new")
    assert reservation is not None and reservation.state == "pending"
    assert store.bind_reservation("r-new", "w-1")
    assert store.bind_reservation("r-new", "w-1")  # the same worker registering again
    assert not store.bind_reservation("r-new", "w-other")  # no one else takes the instance
    store.release_reservation("r-new")
    assert store.live_reservations(job_id="j-old") == []
    store.close()


def make_schema_8_database(path: Path) -> None:
    """A database as schema 8 left it: a try's outcome only in its note."""
    make_schema_3_database(path)
    Store(f"sqlite:///{path}").close()  # up to the current schema, then back to 8's columns
    with sqlite3.connect(path) as conn:
        for column in (
            "outcome",
            "outcome_scope",
            "outcome_message",
            "hold_until",
            "last_error",
            "step_failures",
            "next_step_at",
            "unreachable_since",
        ):
            if column == "hold_until":
                conn.execute("DROP INDEX ix_instances_hold")
            conn.execute(f"ALTER TABLE instances DROP COLUMN {column}")
        conn.execute("UPDATE meta SET value = '8' WHERE key = 'schema'")
        for request_id, note in (
            ("r-cap", "capacity/zone: no room in z1"),
            ("r-gang", "partial/zone: node 1 no SSH"),
            ("r-bad", "failed: bootstrap timed out"),
            ("r-reclaimed", "reclaimed by the provider"),
            ("r-ran", "instance torn down"),
        ):
            conn.execute(
                "INSERT INTO instances (request_id, job_id, owner, provider, state, currency,"
                " spot, tags, created_at, ended_at, note) VALUES (?, 'j-old', 'o-1', 'aws',"
                " 'terminated', 'USD', 0, '{}', 1.0, 2.0, ?)",
                (request_id, note),
            )


def test_upgrade_from_8_reads_each_tries_note_into_its_outcome_columns(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    make_schema_8_database(database)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == 9
    found = {
        r.request_id: (r.outcome, r.outcome_scope, r.outcome_message)
        for r in store.list_instances()
    }
    assert found["r-cap"] == ("capacity", "zone", "no room in z1")
    assert found["r-gang"] == ("partial", "zone", "node 1 no SSH")
    assert found["r-bad"] == ("failed", None, "bootstrap timed out")
    assert found["r-reclaimed"] == ("reclaimed", None, "reclaimed by the provider")
    assert found["r-ran"] == (None, None, None) and found["r-old"] == (None, None, None)
    assert all(r.step_failures == 0 for r in store.list_instances())
    store.close()

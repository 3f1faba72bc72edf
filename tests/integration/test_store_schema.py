"""The store's schema is versioned: opening an older database upgrades it and keeps its rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpulayer.control import schema
from gpulayer.control.auth import TokenAuthority
from gpulayer.control.store import Store
from tests.support.old_schemas import OLD_JOIN_TOKEN, write_old_database


def test_upgrade_keeps_existing_rows_and_adds_new_tables_and_columns(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    write_old_database(f"sqlite:///{database}", 2)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == int(schema.HEAD)
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
    principal = TokenAuthority(store)(OLD_JOIN_TOKEN)
    assert principal is not None and principal.kind == "join"
    store.close()
    again = Store(f"sqlite:///{database}")  # a second open is a no-op
    assert again.get_job("j-old").state == "succeeded"
    again.close()


def test_upgrade_from_3_adds_the_lifecycle_columns_and_tables(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    write_old_database(f"sqlite:///{database}", 3)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == 15
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
    """A database as schema 8 left it, with tries whose outcome is only in their note."""
    write_old_database(f"sqlite:///{path}", 8)
    with sqlite3.connect(path) as conn:
        for request_id, note in (
            ("r-cap", "capacity/zone: no room in z1"),
            ("r-gang", "partial/zone: node 1 no SSH"),
            ("r-bad", "failed: bootstrap timed out"),
            ("r-reclaimed", "reclaimed by the provider"),
            ("r-ran", "instance torn down"),
        ):
            conn.execute(
                "INSERT INTO instances (request_id, job_id, owner, provider, state, currency,"
                " spot, tags, created_at, ended_at, note, node_rank) VALUES (?, 'j-old', 'o-1',"
                " 'aws', 'terminated', 'USD', 0, '{}', 1.0, 2.0, ?, 0)",
                (request_id, note),
            )


def test_upgrade_from_8_reads_each_tries_note_into_its_outcome_columns(tmp_path: Path) -> None:
    database = tmp_path / "state.db"
    make_schema_8_database(database)
    store = Store(f"sqlite:///{database}")
    assert store.schema_version() == 15
    found = {
        r.request_id: (r.outcome, r.outcome_scope, r.outcome_message)
        for r in store.list_instances()
    }
    assert found["r-cap"] == ("capacity", "zone", "no room in z1")
    assert found["r-gang"] == ("partial", "zone", "node 1 no SSH")
    assert found["r-bad"] == ("failed", None, "bootstrap timed out")
    assert found["r-reclaimed"] == ("reclaimed", None, "reclaimed by the provider")
    assert found["r-ran"] == (None, None, None)
    assert all(r.step_failures == 0 for r in store.list_instances())
    store.close()

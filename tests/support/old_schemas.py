"""Databases as released gpulayers left them: each schema's own table definitions
(tests/fixtures/schemas) and the rows its gpulayer wrote."""

from __future__ import annotations

import hashlib
import importlib
import json
from typing import Any

from sqlalchemy import Boolean, Float, Integer, LargeBinary, Table, create_engine, insert
from sqlalchemy.types import TypeEngine

OLD_JOIN_TOKEN = "an-old-join-token"
OLD_TOKEN_HASH = hashlib.sha256(OLD_JOIN_TOKEN.encode()).hexdigest()
OLD_TOKEN_ID = "t-" + OLD_TOKEN_HASH[:10]


def old_schema(number: int) -> Any:
    """Schema ``number``'s table definitions module (its ``metadata``)."""
    return importlib.import_module(f"tests.fixtures.schemas.schema_v{number}")


def _filler(kind: TypeEngine[Any]) -> Any:
    if isinstance(kind, Boolean):
        return False
    if isinstance(kind, (Integer, Float)):
        return 1
    if isinstance(kind, LargeBinary):
        return b"x"
    return "x"


def _row(table: Table, **values: Any) -> dict[str, Any]:
    """``values`` for the columns ``table`` has, and a filler for its other required ones."""
    row = {k: v for k, v in values.items() if k in table.c}
    for column in table.columns:
        required = not column.nullable and column.default is None and not column.autoincrement
        if column.name not in row and required and column.server_default is None:
            row[column.name] = _filler(column.type)
    return row


def write_old_database(url: str, number: int) -> None:
    """A database as schema ``number``'s gpulayer left it, with a job that ran, its worker,
    attempt and logs, and (where the schema has them) a token and a cloud try."""
    old = old_schema(number)
    engine = create_engine(url)
    old.metadata.create_all(engine)
    t = old.metadata.tables
    spec = json.dumps({"workload": {"kind": "command", "command": ["true"]}})
    with engine.begin() as conn:
        conn.execute(insert(t["meta"]).values(key="schema", value=str(number)))
        job = _row(
            t["jobs"],
            id="j-old",
            seq=1,
            name="old",
            spec=spec,
            state="succeeded",
            target="local",
            has_bundle=False,
            attempts=1,
            cancel_requested=False,
            created_at=1.0,
            labels="{}",
        )
        conn.execute(insert(t["jobs"]).values(job))
        conn.execute(
            insert(t["workers"]).values(
                _row(
                    t["workers"],
                    id="w-old",
                    name="old",
                    kind="local",
                    labels="{}",
                    capabilities="{}",
                    state="offline",
                    registered_at=1.0,
                    last_heartbeat=1.0,
                    epoch=1,
                )
            )
        )
        conn.execute(
            insert(t["attempts"]).values(
                _row(
                    t["attempts"],
                    job_id="j-old",
                    number=1,
                    worker_id="w-old",
                    gpu_indices="[]",
                    state="succeeded",
                    created_at=1.0,
                )
            )
        )
        conn.execute(
            insert(t["logs"]).values(
                _row(t["logs"], job_id="j-old", attempt=1, stream="stdout", text="hi\n", at=1.0)
            )
        )
        if "tokens" in t:
            # Before schema 4 a "worker" token was what is now a join token.
            kind = "worker" if number < 4 else "join"
            conn.execute(
                insert(t["tokens"]).values(
                    _row(
                        t["tokens"],
                        hash=OLD_TOKEN_HASH,
                        id=OLD_TOKEN_ID,
                        kind=kind,
                        name="old",
                        created_at=1.0,
                    )
                )
            )
        if "instances" in t:
            conn.execute(
                insert(t["instances"]).values(
                    _row(
                        t["instances"],
                        request_id="r-old",
                        job_id="j-old",
                        owner="o-1",
                        provider="aws",
                        state="terminated",
                        currency="USD",
                        spot=False,
                        tags="{}",
                        created_at=1.0,
                        ended_at=2.0,
                        # Before schema 9 a try's outcome was kept in its note only.
                        note="capacity/zone: no room in z1",
                        outcome="capacity",
                        outcome_scope="zone",
                        outcome_message="no room in z1",
                    )
                )
            )
    engine.dispose()

"""Every schema a released gpulayer wrote upgrades, through the Alembic revisions, to exactly
the schema a new database gets, on SQLite and on PostgreSQL, keeping its rows.

Each old database is built from that schema's own table definitions (tests/fixtures/schemas),
holds the rows its gpulayer wrote, and is then opened by today's Store."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, MetaData, create_engine

from gpulayer.control import schema, tables
from gpulayer.control.store import Store, StoreError
from tests.support.old_schemas import OLD_TOKEN_ID, old_schema, write_old_database
from tests.support.servers import postgres_bin, postgres_cluster

OLD_SCHEMAS = range(1, int(schema.HEAD))
_databases = itertools.count()


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[str]:
    if postgres_bin() is None:
        pytest.fail("PostgreSQL is not installed: .ci/run installs it (apt-get install postgresql)")
    with postgres_cluster() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a database of its own, with nothing in it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state.db'}"
        return
    server: str = request.getfixturevalue("postgres_server")
    name = f"migration_{next(_databases)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    yield server.rsplit("/", 1)[0] + f"/{name}"


def schema_differences(engine: Engine, metadata: MetaData = tables.metadata) -> list[Any]:
    """What Alembic finds between the database and ``metadata`` (by default, the schema a new
    database gets)."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def alembic_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


@pytest.mark.parametrize("number", OLD_SCHEMAS)
def test_an_old_database_upgrades_to_the_new_schema_keeping_its_rows(
    empty_database: str, number: int
) -> None:
    write_old_database(empty_database, number)
    store = Store(empty_database)
    try:
        assert store.schema_version() == int(schema.HEAD)
        assert alembic_revision(store.engine) == schema.HEAD
        assert schema_differences(store.engine) == []
        old = store.get_job("j-old")
        assert (old.name, old.state, old.attempts) == ("old", "succeeded", 1)
        (attempt,) = store.attempts_for("j-old")
        assert (attempt.worker_id, attempt.node_rank) == ("w-old", 0)
        assert [line.text for line in store.read_logs("j-old")] == ["hi\n"]
        if number >= 2:
            (token,) = store.list_tokens()
            assert (token.kind, token.id) == ("join", OLD_TOKEN_ID)
        if number >= 3:
            (instance,) = store.list_instances()
            assert (instance.outcome, instance.outcome_scope) == ("capacity", "zone")
            assert (instance.node_rank, instance.step_failures) == (0, 0)
        # What today's gpulayer writes fits: a new job, and a gang's second attempt number.
        store.insert_job(
            job_id="j-new",
            name="new",
            spec={},
            state="queued",
            target="local",
            working_dir=None,
            has_bundle=False,
            labels={},
        )
        assert store.get_job("j-new").state == "queued"
    finally:
        store.close()
    # Opened again it is current: nothing runs twice.
    Store(empty_database).close()


def test_the_revisions_build_from_nothing_what_a_new_database_gets(empty_database: str) -> None:
    engine = create_engine(empty_database)
    with engine.begin() as conn:
        schema.upgrade(conn, found="base")
    try:
        assert alembic_revision(engine) == schema.HEAD
        assert schema_differences(engine) == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("number", OLD_SCHEMAS)
def test_the_revisions_up_to_a_schema_build_what_its_gpulayer_defined(
    empty_database: str, number: int
) -> None:
    """Each revision is the schema its number's gpulayer wrote, as that gpulayer defined it."""
    engine = create_engine(empty_database)
    with engine.begin() as conn:
        schema.upgrade(conn, found="base", to=schema.revision_of_number(number))
    try:
        assert schema_differences(engine, old_schema(number).metadata) == []
    finally:
        engine.dispose()


def test_head_names_the_newest_revision() -> None:
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(schema.alembic_config())
    assert scripts.get_heads() == [schema.HEAD]
    revisions = sorted(s.revision for s in scripts.walk_revisions())
    assert revisions == [schema.revision_of_number(n) for n in range(1, int(schema.HEAD) + 1)]


def test_a_new_database_is_at_head_without_running_the_revisions(empty_database: str) -> None:
    store = Store(empty_database)
    try:
        assert alembic_revision(store.engine) == schema.HEAD
        assert schema_differences(store.engine) == []
    finally:
        store.close()


def test_a_database_of_a_newer_gpulayer_is_refused_and_left_as_it_is(empty_database: str) -> None:
    Store(empty_database).close()
    engine = create_engine(empty_database)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0042'")
        conn.exec_driver_sql("UPDATE meta SET value = '42' WHERE key = 'schema'")
    try:
        with pytest.raises(StoreError, match="newer than this gpulayer understands"):
            Store(empty_database)
        assert alembic_revision(engine) == "0042"
    finally:
        engine.dispose()

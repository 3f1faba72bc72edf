"""The store's engine and transactions, and its schema brought up to date on opening."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    create_engine,
    event,
    select,
)

from gpulayer.control import tables as t
from gpulayer.control.fair_lock import FairRLock
from gpulayer.control.schema import SchemaError, bring_up_to_date
from gpulayer.control.store.records import (
    StoreError,
)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


# As many pooled connections as the HTTP server has worker threads (anyio's default 40) plus
# the control plane's own loops: a request never pays for a new connection (and, on SQLite,
# its PRAGMAs), and a burst never closes connections it will want again at once.
POOL_SIZE = 48
POOL_OVERFLOW = 16


def create_store_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=POOL_SIZE,
            max_overflow=POOL_OVERFLOW,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)


def _private_sqlite_files(url: str) -> None:
    """Make a SQLite store's file owner-only before the first connection, and its -wal and
    -shm too: SQLite gives those the database file's own mode when it creates them."""
    import contextlib
    import os

    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT, 0o600))
    except FileNotFoundError:
        return  # its folder is missing: the connection reports that better
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(database + suffix, 0o600)


class StoreBase:
    def __init__(self, url: str, *, max_log_bytes: int | None = None) -> None:
        from gpulayer.control.log_cap import DEFAULT_MAX_LOG_BYTES

        self.url = url
        self.max_log_bytes = max_log_bytes or DEFAULT_MAX_LOG_BYTES
        if url.startswith("sqlite"):
            _private_sqlite_files(url)
        self.engine = create_store_engine(url)
        # SQLite takes one writer at a time and makes the others sleep and retry (backing off
        # to 100 ms sleeps); taking turns here instead keeps a burst of writes from stalling,
        # and in turn order, so no write waits while later ones go ahead of it.
        self._writer: FairRLock | None = FairRLock() if url.startswith("sqlite") else None
        self.token_changes = 0
        """Bumped whenever this process revokes, removes or rehashes a token, so what
        remembers tokens in memory forgets them at once."""
        self._migrate()

    @contextlib.contextmanager
    def _begin(self) -> Iterator[Connection]:
        """A write transaction (on SQLite, one of this process's at a time)."""
        if self._writer is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._writer, self.engine.begin() as conn:
            yield conn

    # --- schema -----------------------------------------------------------------------------

    def _migrate(self) -> None:
        """Bring the schema to this gpulayer's, keeping every row of an older one."""
        try:
            self._bring_up_to_date()
        except SchemaError as exc:
            raise StoreError(str(exc)) from exc

    def _bring_up_to_date(self) -> None:
        if self._writer is None:
            with self.engine.begin() as conn:
                # Two servers starting at once on one PostgreSQL database migrate it once.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7210151)")
                bring_up_to_date(conn)
            return
        with self._writer, self.engine.connect() as conn:
            # SQLite changes a table by copying it, which its foreign keys would refuse while
            # rows of other tables point at it; they are checked once the copy is done.
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
            try:
                with conn.begin():
                    bring_up_to_date(conn)
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise StoreError(f"the schema upgrade broke foreign keys: {broken[:3]}")
            finally:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(t.meta.c.value).where(t.meta.c.key == "schema")).scalar_one()
            )

    def close(self) -> None:
        self.engine.dispose()

"""Telling a full disk from other failures: the server answers it 507, in one line.

A write that finds no space fails as ENOSPC (or EDQUOT over a quota) from the filesystem,
SQLITE_FULL from SQLite ("database or disk is full"), or SQLSTATE 53100 from PostgreSQL; each
may come wrapped (SQLAlchemy's errors keep the driver's in ``orig``, Python chains the rest).
"""

from __future__ import annotations

import errno
import sqlite3

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_SQLITE_FULL = 13
_POSTGRES_DISK_FULL = "53100"

DISK_FULL_LINE = "the server's disk is full: nothing was stored; try again once space is freed"


def is_disk_full(exc: BaseException | None) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(exc, sqlite3.Error) and code == _SQLITE_FULL:
            return True
        if getattr(exc, "sqlstate", None) == _POSTGRES_DISK_FULL:
            return True
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return False

"""Statements built once for the reads and writes each item of a map makes, in the two shapes
a list of ids takes: ``== id`` for one, an expanding ``IN`` for several. SQLAlchemy renders an
expanding list anew on every run, which costs more than SQLite takes to run the statement, and
nearly every such call on the per-item path names one id."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, CursorResult, Executable, bindparam, or_

from gpulayer.control import tables as t

ACTIVE_ATTEMPT = or_(t.attempts.c.state == "assigned", t.attempts.c.state == "running")
"""An attempt that is assigned or running, with its two states bound as plain parameters."""


@dataclass(frozen=True)
class ByIds:
    one: Executable
    many: Executable

    def run(
        self, conn: Any, ids: Sequence[Any], params: Mapping[str, Any] | None = None
    ) -> CursorResult[Any]:
        """Run with ``b_ids`` bound to ``ids`` (and ``params`` besides)."""
        bound = dict(params or {})
        bound["b_ids"] = ids[0] if len(ids) == 1 else list(ids)
        return conn.execute(self.one if len(ids) == 1 else self.many, bound)


def by_ids(column: Any, build: Callable[[ColumnElement[bool]], Executable]) -> ByIds:
    """``build(condition)`` made once with ``column == :b_ids`` and once with an expanding
    ``column IN :b_ids``."""
    return ByIds(
        one=build(column == bindparam("b_ids")),
        many=build(column.in_(bindparam("b_ids", expanding=True))),
    )

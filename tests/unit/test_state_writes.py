"""Every state a record holds is written through its transition table: the code is read for
UPDATEs that set a state, and each must sit in one of the few functions that check a table
(as the import rules test reads imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpulayer.control.record_states import RESERVATION_TRANSITIONS, WORKER_TRANSITIONS, sources

ROOT = Path(__file__).resolve().parents[2] / "gpulayer"

# Where an UPDATE sets `state`, and the table each one checks.
STATE_WRITERS = {
    (
        "control/store/jobs.py",
        "<module>",
    ),  # the dispatch's queued -> running, a JOB_TRANSITIONS move
    # A worker's reported ends: attempt and job moves from the sources JobStates.end_reported
    # takes from ATTEMPT_TRANSITIONS and JOB_TRANSITIONS.
    ("control/store/attempt_ends.py", "_conditional_move.move"),
    ("control/store/instances.py", "InstanceLedger.move_instance"),  # checks TRANSITIONS first
    ("control/store/workers.py", "WorkerStore.move_worker"),  # WORKER_TRANSITIONS
    (
        "control/store/workers.py",
        "WorkerStore.worker_heartbeat",
    ),  # WORKER_TRANSITIONS: lost -> ready
    ("control/store/instances.py", "InstanceLedger.bind_reservation"),  # RESERVATION_TRANSITIONS
    ("control/store/instances.py", "InstanceLedger.release_reservation"),  # RESERVATION_TRANSITIONS
    ("control/store/instances.py", "InstanceLedger.rest_reservation"),  # RESERVATION_TRANSITIONS
    # A job takes a warm machine: TRANSITIONS (idle -> ready) and RESERVATION_TRANSITIONS.
    ("control/store/instances.py", "InstanceLedger._take_idle"),
}
# Store methods that take any column, state included: only the job table's mover may pass it.
GENERIC_UPDATES = {"update_job", "update_attempt", "update_instance", "update_worker"}
GENERIC_STATE_CALLERS = {
    ("control/job_states.py", "JobStates.move_job"),
    ("control/job_states.py", "JobStates.move_attempt"),
}


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.writes: set[tuple[str, str]] = set()
        self.generic: set[tuple[str, str]] = set()

    def _visit_scope(self, node: ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_ClassDef = _visit_scope
    visit_FunctionDef = _visit_scope
    visit_AsyncFunctionDef = _visit_scope

    def _where(self) -> tuple[str, str]:
        return (self.module, ".".join(self.scope) or "<module>")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else None
        sets_state = any(k.arg == "state" for k in node.keywords) or any(
            isinstance(a, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "state" for k in a.keys)
            for a in node.args
        )
        if sets_state and name == "values" and _is_update(func):
            self.writes.add(self._where())
        if sets_state and name in GENERIC_UPDATES:
            self.generic.add(self._where())
        self.generic_visit(node)


def _is_update(func: ast.Attribute) -> bool:
    """`update(...)...values(...)`, not an insert's values."""
    node: ast.AST = func.value
    while isinstance(node, (ast.Call, ast.Attribute)):
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "update":
                return True
            node = node.func
        else:
            node = node.value
    return False


def _scan() -> _Finder:
    found = _Finder("")
    for path in sorted(ROOT.rglob("*.py")):
        finder = _Finder(str(path.relative_to(ROOT)))
        finder.visit(ast.parse(path.read_text(), str(path)))
        found.writes |= finder.writes
        found.generic |= finder.generic
    return found


def test_state_is_written_only_where_a_transition_table_is_checked() -> None:
    found = _scan()
    assert found.writes == STATE_WRITERS
    assert found.generic <= GENERIC_STATE_CALLERS, found.generic - GENERIC_STATE_CALLERS


def test_the_scan_sees_a_state_write_it_was_not_told_of(tmp_path: Path) -> None:
    code = "def sneaky(conn):\n    conn.execute(update(t.workers).values(state='ready'))\n"
    finder = _Finder("x.py")
    finder.visit(ast.parse(code))
    assert finder.writes == {("x.py", "sneaky")}
    finder = _Finder("x.py")
    finder.visit(ast.parse("def f(store):\n    store.update_job('j', state='queued')\n"))
    assert finder.generic == {("x.py", "f")}


@pytest.mark.parametrize("table", [WORKER_TRANSITIONS, RESERVATION_TRANSITIONS])
def test_every_state_can_reach_the_final_one_and_the_final_one_is_final(
    table: dict[str, frozenset[str]],
) -> None:
    final = [s for s, moves in table.items() if not moves]
    assert len(final) == 1
    for state in table:
        seen, todo = set(), [state]
        while todo:
            current = todo.pop()
            seen.add(current)
            todo += [t for t in table[current] if t not in seen]
        assert final[0] in seen, state
        assert table[state] <= set(table)


def test_a_gone_worker_only_comes_back_by_registering() -> None:
    assert sources(WORKER_TRANSITIONS, "ready") == ["lost"]
    # A released reservation is never bound again; an idle one (a warm machine) is, by the job
    # that takes it.
    assert sources(RESERVATION_TRANSITIONS, "bound") == ["idle", "pending"]

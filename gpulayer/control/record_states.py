"""The moves workers and reservations may make, as tables like the jobs' and attempts'.

Every state write of a worker or a reservation is a conditional UPDATE from the states these
tables allow into the target (the store's move_worker, worker_heartbeat, bind_reservation and
release_reservation), so a retired worker's late heartbeat cannot bring it back, and a released
reservation cannot be bound again. A (re)registration is not a move: it starts a new epoch of
the worker, ready, whatever it was.
"""

from __future__ import annotations

WORKER_TRANSITIONS: dict[str, frozenset[str]] = {
    "ready": frozenset({"leaving", "lost", "gone"}),
    # Stopping (SIGTERM): it said so as it began to stop, takes no new job and ends its
    # running ones; its heartbeats never make it ready again, only a new registration does.
    "leaving": frozenset({"lost", "gone"}),
    # A lost worker that heartbeats again is ready again; a gone one (its machine handed
    # back, or reclaimed) only by registering anew.
    "lost": frozenset({"ready", "leaving", "gone"}),
    "gone": frozenset(),
}

RESERVATION_TRANSITIONS: dict[str, frozenset[str]] = {
    "pending": frozenset({"bound", "released"}),
    # A warm machine: its job ended, its worker is held for no job until one takes it.
    "bound": frozenset({"idle", "released"}),
    "idle": frozenset({"bound", "released"}),
    "released": frozenset(),
}


def sources(table: dict[str, frozenset[str]], target: str) -> list[str]:
    """The states a record may move into target from."""
    if target not in table:
        raise ValueError(f"unknown state {target!r}")
    return sorted(state for state, targets in table.items() if target in targets)

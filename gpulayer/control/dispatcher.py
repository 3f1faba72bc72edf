"""Dispatch passes: queued jobs placed on workers with room, one pass at a time, asked for by
whoever changed what placement reads (a submit, a finish, a worker's arrival) and made on the
dispatcher's thread when one runs."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

from gpulayer.control import gangs
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.dispatch import LivePlacement, plan_assignments
from gpulayer.control.store import QueuedHead, Store
from gpulayer.spec import JobSpec

log = logging.getLogger("gpulayer.control")

_PASSES_PER_CALL = 2


class Dispatcher:
    def __init__(self, store: Store, placement: LivePlacement, changes: ChangeFeed) -> None:
        self.store = store
        self.placement = placement
        self.changes = changes
        self._lock = threading.Lock()
        self._dispatching = False
        self._wanted = False
        self._loud = False
        self._general = False
        """A pass was asked for by a change that may concern any job: its news is for all."""
        self._touched: set[str] = set()
        """Else the jobs whose changes asked for it: its news is for their followers (and
        those of the jobs it places) alone."""
        self._asked: threading.Event | None = None
        """Set to ask the dispatcher thread for a pass (None: no such thread; passes are
        made by whoever asks for them)."""

    def queue_moved(self, job_id: str, entered: bool) -> None:
        """A job moved into the queue or out of it (or out of a state next to it)."""
        if entered:
            self.placement.queue_changed()  # put back in line by its time: read with the rest
        else:
            self.placement.jobs_left_queue([job_id])

    def jobs_stored(
        self,
        heads: Sequence[QueuedHead],
        specs: Mapping[str, tuple[JobSpec, Mapping[str, str]]] | None = None,
    ) -> None:
        """Jobs stored queued (by a submit, a list submit or a schedule's run): the dispatch
        pass's queue takes them in (with ``specs``, the validated spec each stored one was
        dumped from, and its labels), and one for a cloud wakes whoever plans cloud work."""
        self.placement.jobs_queued(heads, specs)
        if any(head.target == "cloud" for head in heads):
            self.changes.cloud_work_stored()

    def start(self) -> Callable[[], None]:
        """From now on the passes that finishes ask for are made on a thread of their own, so
        a worker's batch of reports is answered once it is recorded, not after the pass its
        freed room starts; returns how to stop the thread. Without it (in process, in a
        test) every finish makes its pass before it returns."""
        asked = threading.Event()
        stopping = threading.Event()

        def passes() -> None:
            while True:
                asked.wait()
                if stopping.is_set():
                    return
                asked.clear()
                try:
                    self.dispatch(touched=())  # what asked for it noted it in dispatch_soon
                except Exception:
                    log.exception("dispatch pass failed")
                    stopping.wait(0.5)  # a store that keeps failing is not asked in a loop
                with self._lock:
                    # Asked for again while its passes ran, with no other caller making them.
                    if self._wanted and not self._dispatching:
                        asked.set()

        self._asked = asked
        threading.Thread(target=passes, name="gpulayer-dispatch", daemon=True).start()

        def stop() -> None:
            self._asked = None
            stopping.set()
            asked.set()

        return stop

    def dispatch_soon(self, touched: Iterable[str] | None = None) -> None:
        """Ask for a dispatch pass: the dispatcher thread's where one runs (the caller goes on
        at once; passes asked for meanwhile are made together), else made now. ``touched``:
        the jobs whose change asks for it (None: a change that may concern any job)."""
        asked = self._asked
        if asked is None:
            self.dispatch(touched=touched)
        else:
            with self._lock:
                self._note(touched)
            asked.set()

    def _note(self, touched: Iterable[str] | None) -> None:
        """Called with the lock held."""
        if touched is None:
            self._general = True
        else:
            self._touched.update(touched)

    def dispatch(self, *, quiet: bool = False, touched: Iterable[str] | None = None) -> int:
        """Place queued jobs on workers with room. Returns how many were assigned.

        Only the workers given work are woken; ``quiet`` (the periodic pass) tells the
        other listeners only when something was assigned. Followers of one job are told only
        of a pass whose news may concern it: ``touched`` (the jobs whose change asked for the
        pass; None: any job) and the jobs it places."""
        # One pass at a time, and callers never queue behind it: a call made while a pass
        # runs asks for one more pass, which the running one makes before it returns. A caller
        # makes at most _PASSES_PER_CALL of them, so no request is kept making passes for
        # others; a pass still asked for then is the next caller's (or the periodic pass's).
        with self._lock:
            self._wanted = True
            self._loud = self._loud or not quiet
            self._note(touched)
            if self._dispatching:
                return 0
            self._dispatching = True
        assigned = 0
        passes = 0
        try:
            while True:
                with self._lock:
                    if not self._wanted or passes >= _PASSES_PER_CALL:
                        self._dispatching = False
                        break
                    passes += 1
                    loud = self._loud
                    told = None if self._general else self._touched
                    self._wanted = self._loud = self._general = False
                    self._touched = set()
                assigned += self._one_pass(quiet=not loud, told=told)
        except BaseException:
            with self._lock:
                self._dispatching = False
            raise
        return assigned

    def _one_pass(self, *, quiet: bool, told: set[str] | None = None) -> int:
        woken: set[str] = set()
        placed: set[str] = set()
        assigned = 0
        plans = plan_assignments(self.store, self.placement)
        results = self.store.assign_all(plans)
        self.placement.jobs_left_queue(job_id for job_id, _ in plans)
        for (job_id, nodes), attempts in zip(plans, results, strict=True):
            if attempts is None:
                # No longer queued (another control plane took it, or it was cancelled): the
                # room it was given goes to the next pass, at once.
                with self._lock:
                    self._wanted = True
                continue
            assigned += 1
            placed.add(job_id)
            woken.update(w for w, _ in nodes)
            if len(nodes) > 1:
                self.changes.log_system(job_id, 0, [gangs.placed_note(self.store, nodes)])
        if assigned:
            self.changes.wake_workers(woken)
        if assigned or not quiet:
            self.changes.notify(None if told is None else told | placed)
        return assigned

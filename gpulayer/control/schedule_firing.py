"""The schedule firing loop: one thread per control plane that sleeps until the next tick.

It wakes at the earliest next tick of any schedule, when a schedule changes through this
process, and every RELOAD_SECONDS to see schedules another server process wrote to the shared
store. Between those it sleeps; it never polls at a short interval, so a control plane holding
a thousand schedules stays idle.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gpulayer.control.schedule_service import Loaded, ScheduleService
from gpulayer.errors import NotFoundError
from gpulayer.schedules.model import Schedule
from gpulayer.schedules.ticks import cached_next_tick

log = logging.getLogger("gpulayer.schedules")

RELOAD_SECONDS = 5.0
RETRY_SECONDS = 5.0
_PRUNE_EVERY_SECONDS = 60.0


class ScheduleFiring:
    def __init__(self, schedules: ScheduleService) -> None:
        self.schedules = schedules
        self.store = schedules.store
        self.started_at = time.time()
        """Ticks before this came while this control plane did not run (catch-up decides)."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._loaded: dict[str, Loaded] = {}
        self._pruned_at: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        schedules.on_change(self.wake)

    def start(self) -> ScheduleFiring:
        self.started_at = time.time()
        self._thread = threading.Thread(target=self._run, name="gpulayer-schedules", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                upcoming = self.run_pass(time.time())
            except Exception:
                log.exception("schedule pass failed")
                upcoming = None
            wait = RELOAD_SECONDS
            if upcoming is not None:
                wait = min(wait, max(0.0, upcoming - time.time()))
            if wait > 0:
                self._wake.wait(wait)
            self._wake.clear()

    def run_pass(self, now: float) -> float | None:
        """Decide what is due; return the earliest next tick (epoch seconds) of any schedule."""
        upcoming: float | None = None
        heads = self.store.schedule_heads()
        known = {schedule_id for schedule_id, _, _ in heads}
        for schedule_id in list(self._loaded):
            if schedule_id not in known:
                del self._loaded[schedule_id]
        workers: list[Any] | None = None
        made = 0
        for schedule_id, updated_at, watermark in heads:
            loaded = self._load(schedule_id, updated_at)
            if loaded is None:
                continue
            schedule = loaded.schedule
            following = cached_next_tick(schedule.expressions, schedule.timezone, watermark)
            if following is not None and following <= now:
                if workers is None:
                    workers = self.schedules.service.workers.worker_views()
                loaded.record.watermark = watermark
                try:
                    following, created = self.schedules.fire_due(
                        loaded, now, self.started_at, workers
                    )
                    made += created
                    self._prune(loaded, now)
                except Exception:
                    # One schedule's failure (the database busy, a bad row) must neither starve
                    # the others nor spin: it is tried again a little later.
                    log.exception("schedule %s: deciding its ticks failed", loaded.record.name)
                    following = now + RETRY_SECONDS
            if following is not None and (upcoming is None or following < upcoming):
                upcoming = following
        if made:
            self.schedules.service.dispatcher.dispatch()
        return upcoming

    def _load(self, schedule_id: str, updated_at: float) -> Loaded | None:
        """The schedule as last edited; its watermark comes fresh with each pass's heads."""
        cached = self._loaded.get(schedule_id)
        if cached is not None and cached.record.updated_at == updated_at:
            return cached
        try:
            record = self.store.get_schedule(schedule_id)
        except NotFoundError:
            return None  # deleted meanwhile
        loaded = Loaded(record, Schedule.model_validate(record.spec))
        self._loaded[schedule_id] = loaded
        return loaded

    def _prune(self, loaded: Loaded, now: float) -> None:
        last = self._pruned_at.get(loaded.record.id, 0.0)
        if now - last >= _PRUNE_EVERY_SECONDS:
            self._pruned_at[loaded.record.id] = now
            self.store.prune_schedule_runs(loaded.record.id, loaded.schedule.history_limit)


def attach_schedules(service: Any) -> ScheduleFiring:
    """Build a control service's schedules and start their firing loop; the API and the
    dashboard are given ``.schedules`` of what this returns when they are built."""
    return ScheduleFiring(ScheduleService(service)).start()

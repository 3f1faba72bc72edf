"""Schedules in the control plane: apply, pause, resume, delete, trigger, and firing a tick.

Each tick is decided once through the store: the run row (UNIQUE schedule, tick) and the job it
creates commit in one transaction, so a restarted control plane or a second server sharing the
database that decides the same tick again loses the insert and does nothing.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpulayer.control.store import QueuedHead, ScheduleRecord, job_row
from gpulayer.control.store.once_keys import OnceKey, remember_answer
from gpulayer.control.targets import choose_target, may_leave_this_machine, with_default_target
from gpulayer.errors import GpulayerError, NotFoundError, UsageError
from gpulayer.ids import new_id
from gpulayer.schedules.decisions import (
    BudgetState,
    Decision,
    LedgerEntry,
    RunCost,
    Skip,
    Start,
    budget_period,
    decide_start,
    epoch,
    from_epoch,
    period_spend,
    triage,
)
from gpulayer.schedules.model import SCHEDULE_LABEL, TICK_LABEL, Schedule, worst_case_cost
from gpulayer.schedules.ticks import next_ticks, ticks_between, zone
from gpulayer.schedules.validate import validate_schedule
from gpulayer.spec import JobSpec
from gpulayer.spec.submit_arch import SUBMIT_ARCH_LABEL, machine_arch

log = logging.getLogger("gpulayer.schedules")

# How many skipped ticks of one pass are written down one by one (a long outage of a
# per-second schedule would otherwise write ~86,400 rows).
_RECORDED_TICKS = 100


@dataclass(frozen=True)
class _Started:
    """A run written under the schedule's lock, to be announced once the lock is let go."""

    job_id: str
    notes: list[str]
    target: str | None
    created_at: float


class TickSkipped(GpulayerError):
    """A trigger that concurrency or the budget turned down; `reason` says which."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"skipped ({reason}): {message}" if message else f"skipped ({reason})")
        self.reason = reason


@dataclass
class Loaded:
    record: ScheduleRecord
    schedule: Schedule


class ScheduleService:
    def __init__(self, service: Any) -> None:
        self.service = service
        self.store = service.store
        self.layout = service.layout
        self._listeners: list[Any] = []

    def on_change(self, listener: Any) -> None:
        self._listeners.append(listener)

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    # --- the resource -----------------------------------------------------------------------

    def apply(
        self,
        data: dict[str, Any],
        *,
        working_dir: str | None = None,
        source_dir: Path | None = None,
        bundle: Path | None = None,
        bundle_digest: str | None = None,
    ) -> tuple[ScheduleRecord, bool]:
        """Create the schedule, or replace the one of that name (future ticks only).

        `bundle` is a one-shot upload, used up here; `bundle_digest` names one the bundle
        store keeps, read and left in place. Nothing is written when the document does not
        validate or its source cannot be read.
        """
        try:
            if isinstance(data.get("job"), dict):
                data = {
                    **data,
                    "job": with_default_target(data["job"], self.service.default_target),
                }
            schedule = validate_schedule(data)
            leaves = may_leave_this_machine(schedule.job)
            given = bundle is not None or bundle_digest is not None
            if working_dir and leaves and source_dir is None and not given:
                # Its runs may go to other machines: the folder is taken now, as it is.
                source_dir = Path(working_dir)
            if bundle_digest is not None:
                source: bytes | None = self.service.bundles.read(bundle_digest)
            else:
                base = Path(working_dir) if working_dir else source_dir
                source = _read_source(source_dir, bundle, _inputs_to_ship(schedule, base))
            _refuse_unshipped(schedule, source)
        finally:
            if bundle is not None:
                bundle.unlink(missing_ok=True)
        spec = schedule.model_dump(mode="json")
        fields = {
            "spec": spec,
            "suspend": schedule.suspend,
            "working_dir": working_dir,
            "has_bundle": source is not None,
        }
        from sqlalchemy.exc import IntegrityError

        created = False
        try:
            existing = self.store.find_schedule(schedule.name)
        except NotFoundError:
            try:
                existing = self.store.insert_schedule(id=new_id("s"), name=schedule.name, **fields)
                created = True
            except IntegrityError:  # applied at the same moment elsewhere: update that one
                existing = self.store.find_schedule(schedule.name)
        if not created:
            if existing.suspend and not schedule.suspend:
                fields["watermark"] = max(existing.watermark, time.time())  # resumed: no catch-up
            self.store.update_schedule(existing.id, **fields)
        self.store.put_schedule_source(existing.id, source)
        self._changed()
        return self.store.get_schedule(existing.id), created

    def load(self, name: str) -> Loaded:
        record = self.store.find_schedule(name)
        return Loaded(record, Schedule.model_validate(record.spec))

    def load_id(self, schedule_id: str) -> Loaded:
        record = self.store.get_schedule(schedule_id)
        return Loaded(record, Schedule.model_validate(record.spec))

    def all(self) -> list[Loaded]:
        return [Loaded(r, Schedule.model_validate(r.spec)) for r in self.store.list_schedules()]

    def active_count(self) -> int:
        return int(self.store.count_active_schedules())

    def delete(self, name: str) -> ScheduleRecord:
        record = self.store.find_schedule(name)
        self.store.delete_schedule(record.id)
        self._changed()
        return record

    def pause(self, name: str) -> ScheduleRecord:
        return self._set_suspend(name, True)

    def resume(self, name: str) -> ScheduleRecord:
        return self._set_suspend(name, False)

    def _set_suspend(self, name: str, suspend: bool) -> ScheduleRecord:
        loaded = self.load(name)
        spec = {**loaded.record.spec, "suspend": suspend}
        values: dict[str, Any] = {"spec": spec, "suspend": suspend}
        if not suspend and loaded.record.suspend:
            # Resuming does not catch up: ticks while suspended are decided as skipped.
            values["watermark"] = max(loaded.record.watermark, time.time())
        self.store.update_schedule(loaded.record.id, **values)
        self._changed()
        return self.store.get_schedule(loaded.record.id)

    def trigger(self, name: str, *, once: OnceKey | None = None) -> str:
        """Run one now, outside the cron, under concurrency and budget. Returns the job id.
        ``once``: the request's idempotency key, kept with the job it makes."""
        loaded = self.load(name)
        now = time.time()
        tick = round(now, 3)
        decision, job_id = self._decide_and_start(loaded, from_epoch(tick), manual=True, once=once)
        if isinstance(decision, Skip):
            raise TickSkipped(decision.reason, decision.message)
        if job_id is None:
            raise UsageError(f"NAME: schedule {name} has a run for this instant already")
        return job_id

    def _decide_and_start(
        self,
        loaded: Loaded,
        tick: datetime,
        *,
        manual: bool = False,
        workers: list[Any] | None = None,
        dispatch: bool = True,
        once: OnceKey | None = None,
    ) -> tuple[Decision, str | None]:
        """Decide a tick and write what was decided in one transaction that holds the
        schedule, so that concurrent triggers (on this server or another one over the same
        database) each see the runs the others made: a budget that fits one run starts one.
        The job made, if any, is announced and dispatched once the transaction is over."""
        started: _Started | None = None
        with self.store.schedule_locked(loaded.record.id) as locked:
            decision = self._decide(loaded, tick, from_epoch(time.time()), manual=manual)
            if isinstance(decision, Skip):
                self.store.record_tick(
                    loaded.record.id,
                    epoch(decision.tick),
                    outcome=decision.reason,
                    message=decision.message,
                    manual=manual,
                    within=locked,
                )
                return decision, None
            started = self._create(loaded, decision, manual=manual, workers=workers, within=locked)
            if started is not None and once is not None:
                remember_answer(locked, once, [started.job_id])
        if started is None:
            return decision, None
        self._announce(loaded, decision, started, dispatch=dispatch)
        return decision, started.job_id

    # --- firing -----------------------------------------------------------------------------

    def fire_due(
        self, loaded: Loaded, now: float, loop_started: float, workers: list[Any] | None = None
    ) -> tuple[float | None, int]:
        """Decide every tick after the watermark up to now: (its next tick, jobs made).

        The caller dispatches the jobs made, once for a whole pass; `workers` is the pass's
        snapshot of workers to choose targets with.
        """
        schedule, record = loaded.schedule, loaded.record
        due, older_left_out, following = ticks_between(
            schedule.expressions,
            zone(schedule.timezone),
            from_epoch(record.watermark),
            from_epoch(now),
            _RECORDED_TICKS,
        )
        if not due:
            return None if following is None else epoch(following), 0
        if older_left_out:
            log.info(
                "schedule %s: recording only the newest %d missed ticks", record.name, len(due)
            )
        skips, candidates = triage(
            due,
            suspended=record.suspend,
            catch_up=schedule.catch_up,
            loop_started=from_epoch(loop_started),
        )
        for skip in skips:
            self._record_skip(record, skip)
        made = 0
        for tick in candidates:
            _, job_id = self._decide_and_start(loaded, tick, workers=workers, dispatch=False)
            if job_id is not None:
                made += 1
        self.store.advance_watermark(record.id, epoch(due[-1]))
        return None if following is None else epoch(following), made

    def _record_skip(self, record: ScheduleRecord, skip: Skip) -> None:
        self.store.record_tick(
            record.id, epoch(skip.tick), outcome=skip.reason, message=skip.message
        )

    def _decide(
        self, loaded: Loaded, tick: datetime, now: datetime, manual: bool = False
    ) -> Decision:
        schedule = loaded.schedule
        return decide_start(
            tick,
            now=now,
            starting_deadline_seconds=schedule.starting_deadline_seconds,
            concurrency=schedule.concurrency,
            # allow needs no look at live runs, so a tick of such a schedule costs one query less
            live_runs=[]
            if schedule.concurrency == "allow"
            else self.store.live_schedule_jobs(loaded.record.id),
            budget=self.budget_state(loaded, epoch(now)),
            manual=manual,
        )

    def _create(
        self,
        loaded: Loaded,
        decision: Start,
        *,
        manual: bool,
        workers: list[Any] | None,
        within: Any,
    ) -> _Started | None:
        """Write the tick's job, once. None when the tick was decided elsewhere first."""
        record, schedule = loaded.record, loaded.schedule
        tick_text = decision.tick.isoformat(timespec="milliseconds" if manual else "seconds")
        labels = {**schedule.job.labels, SCHEDULE_LABEL: record.name, TICK_LABEL: tick_text}
        job = schedule.job
        if "cloud" in job.placement.targets and not job.resources.cpu_arch:
            arch = machine_arch()  # no submitting machine: this control plane's own
            if arch is not None:
                labels[SUBMIT_ARCH_LABEL] = arch
        spec = schedule.job.model_copy(update={"labels": labels})  # validated with the schedule
        service = self.service
        if workers is None:
            workers = service.workers.worker_views()
        target = choose_target(spec, workers, cloud_available=service.cloud.available())
        job_id = new_id("j")
        source = self.store.schedule_source(record.id) if record.has_bundle else None
        bundles = self.service.bundles
        with bundles.lock:
            # Kept by digest: workers fetch a schedule's source once for all its runs, and
            # share it with plain submits of the same content.
            digest = bundles.keep_bytes(source) if source is not None else None
            row = job_row(
                job_id=job_id,
                name=spec.name,
                spec=spec.model_dump(mode="json"),
                state="queued" if target.target else "failed",
                target=target.target or spec.placement.target,
                working_dir=record.working_dir,
                bundle_digest=digest,
                labels=dict(spec.labels),
                reason=None if target.target else "unschedulable",
                message=target.message,
            )
            recorded = self.store.record_tick(
                record.id,
                epoch(decision.tick),
                outcome="created",
                manual=manual,
                job=row,
                within=within,
            )
            if not recorded and digest is not None:
                self.service.jobs.release_unused_bundle(digest)
        if not recorded:
            return None
        kind = "triggered" if manual else f"tick {tick_text}"
        notes = [f"schedule {record.name}: {kind}", *target.notes]
        return _Started(job_id, notes, target.target, row["created_at"])

    def _announce(
        self, loaded: Loaded, decision: Start, started: _Started, *, dispatch: bool
    ) -> None:
        service = self.service
        service.changes.log_system(started.job_id, 0, started.notes)
        for live in decision.replace:
            service.changes.log_system(
                live, 0, [f"schedule {loaded.record.name}: replaced by {started.job_id}"]
            )
            service.jobs.cancel(live)
        if started.target:
            # Stored with its run record, not through submit: the service is told here.
            service.dispatcher.jobs_stored(
                [QueuedHead(started.job_id, started.target, started.created_at)]
            )
        if started.target and dispatch:
            service.dispatcher.dispatch()

    # --- budget -----------------------------------------------------------------------------

    def budget_state(self, loaded: Loaded, now: float) -> BudgetState | None:
        schedule = loaded.schedule
        if schedule.budget is None:
            return None
        start, end = budget_period(schedule.budget.period, zone(schedule.timezone), from_epoch(now))
        return BudgetState(
            max_cost=schedule.budget.max_cost,
            spent=self.period_spend(loaded.record.id, epoch(start), epoch(end), now),
            next_run=worst_case_cost(schedule.job),
        )

    def period_spend(self, schedule_id: str, start: float, end: float, now: float) -> float:
        runs = []
        for job in self.store.schedule_jobs_since(schedule_id, start):
            instances = self.store.list_instances(job_id=job.id)
            runs.append(
                RunCost(
                    live=not job.terminal,
                    worst_case=worst_case_cost(JobSpec.model_validate(job.spec)),
                    instances=tuple(
                        LedgerEntry(i.hourly_price, i.launched_at, i.ended_at) for i in instances
                    ),
                )
            )
        return period_spend(runs, start, end, now)

    def next_ticks(self, loaded: Loaded, count: int, after: float | None = None) -> list[datetime]:
        schedule = loaded.schedule
        tz = zone(schedule.timezone)
        start = from_epoch(max(loaded.record.watermark, after if after is not None else 0.0))
        return [t.astimezone(tz) for t in next_ticks(schedule.expressions, tz, start, count)]


def _read_source(
    source_dir: Path | None, bundle: Path | None, inputs: dict[int, Path] | None = None
) -> bytes | None:
    """The schedule's source as bundle bytes: a local folder snapshotted now (with the local
    inputs its runs take elsewhere), or an upload."""
    if bundle is not None:
        return bundle.read_bytes()
    if source_dir is None:
        return None
    from gpulayer.protocol.bundle import create_bundle

    with tempfile.TemporaryDirectory(prefix="gpulayer-schedule-") as scratch:
        path = Path(scratch) / "source.tar.gz"
        create_bundle(source_dir, path, inputs=inputs)
        return path.read_bytes()


def _inputs_to_ship(schedule: Schedule, base: Path | None) -> dict[int, Path] | None:
    """The run's local-path inputs that exist here, for runs that may go elsewhere."""
    if base is None or not may_leave_this_machine(schedule.job):
        return None
    from gpulayer.protocol.bundle import local_input_paths

    return local_input_paths([i.artifact for i in schedule.job.inputs], base)


def _refuse_unshipped(schedule: Schedule, source: bytes | None) -> None:
    """A run that may go to another machine gets its local-path inputs only inside the
    schedule's bundle (a worker opens no path of its own machine for a job)."""
    from gpulayer.control.targets import refuse_unshipped_inputs
    from gpulayer.protocol.bundle import is_machine_path, shipped_input_indexes

    job = schedule.job
    if not may_leave_this_machine(job) or not any(is_machine_path(i.artifact) for i in job.inputs):
        return
    shipped = shipped_input_indexes(source) if source is not None else set()
    try:
        refuse_unshipped_inputs(job, shipped)
    except UsageError as exc:
        raise UsageError(f"job.{exc}") from None

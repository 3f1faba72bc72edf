"""One loop that drives every rented instance from its stored state toward its goal.

A pass gathers the world (:mod:`.sync`: every live instance's facts, what its last step left in
the store, the jobs waiting for a machine and their waits for capacity), asks the pure
:func:`~gpulayer.cloud.lifecycle.world.decide_pass` once, and carries its one result out: the
moves, the steps to start, the jobs to plan; then it sleeps no longer than the earliest
follow-up. Each step (:mod:`.steps`: launch, prepare, reconnect, check, drain, terminate, reap,
plan) runs in a pool of its kind (launches, teardowns, the rest), does its I/O and returns a
StepResult that is stored with its instance; so no thread waits on a job for its life, no
bootstrap holds up a teardown, and a controller that restarts (or a second one on the same
store) finds every step in flight (leases), backoff and hold where the last one left it.

A gang (a distributed job of N nodes) owns N records, one per node rank, under one launch id
(node 0's request id): node 0's record makes the one launch call for all N, each node then
boots and bootstraps its own worker, the job is handed over once all N workers joined, and the
first node to fail or end takes the whole gang down (see :mod:`.gangs`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpulayer.cloud.credentials import using_environment
from gpulayer.cloud.lifecycle.arrays import array_of, size_of
from gpulayer.cloud.lifecycle.links import Links
from gpulayer.cloud.lifecycle.states import GONE, HOLDS_WORKER
from gpulayer.cloud.lifecycle.steps import check, drain, launch, prepare, reap, reconnect, terminate
from gpulayer.cloud.lifecycle.steps.context import ProvidersLoader, StepContext
from gpulayer.cloud.lifecycle.steps.fleet import top_up
from gpulayer.cloud.lifecycle.steps.plan import PLACING, plan_job
from gpulayer.cloud.lifecycle.sync import Local, end_key, gather, launch_key
from gpulayer.cloud.lifecycle.world import Live, PassDecision, World, decide_pass, fleet_wait_key

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.decide import Step
    from gpulayer.cloud.lifecycle.ports import JobPort
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.lifecycle.step_result import StepResult

log = logging.getLogger("gpulayer.lifecycle")

IDLE_RECHECK_SECONDS = 1.0
"""How often a loop with no cloud work asks the store again without being told of any."""
WAKE_EVERY_SECONDS = 1.0
"""The loop's usual wake-up; a follow-up due sooner wakes it sooner."""
REAP_EVERY_SECONDS = reap.REAP_EVERY_SECONDS
LEASE_SECONDS = 20.0
"""How long a step's lease outlives the last pass of the controller running it: a controller
that died holds its steps back no longer than this."""

_STEPS: dict[str, tuple[Callable[[StepContext, str], StepResult], str]] = {
    # step -> (its module's function, its pool); drains and terminates run under their own key
    # (see sync.end_key), launches under theirs (sync.launch_key).
    "launch": (launch.launch, "launch"),
    "prepare": (prepare.prepare, "steps"),
    "reconnect": (reconnect.reconnect, "steps"),
    "check": (check.check, "steps"),
    "drain": (drain.drain, "teardown"),
    "terminate": (terminate.terminate, "teardown"),
}


class Reconciler:
    def __init__(
        self,
        service: JobPort,
        *,
        control_port: int,
        owner: str,
        load_providers: ProvidersLoader,
        settings: Callable[[], Mapping[str, Any]] | None = None,
        parallel_steps: int = 8,
        parallel_launches: int = 8,
        parallel_teardowns: int = 4,
    ) -> None:
        self.service = service
        self.store = service.store
        self.owner = owner
        self.links = Links()
        self._wake = threading.Event()
        self.steps = StepContext(
            service,
            control_port,
            owner,
            load_providers,
            settings or dict,
            self.links,
            self._wake.set,
        )
        self._pools = {
            "steps": ThreadPoolExecutor(parallel_steps, thread_name_prefix="gpulayer-lifecycle"),
            # A launch may wait long inside its provider (a Slurm allocation pending behind
            # others): launches have threads of their own, so machines already up are still
            # prepared meanwhile, and their jobs end and free what the waiting launches wait for.
            "launch": ThreadPoolExecutor(parallel_launches, thread_name_prefix="gpulayer-launch"),
            # Drains and terminates too: slow bootstraps filling the pool must not keep a
            # machine billing after its job ended.
            "teardown": ThreadPoolExecutor(
                parallel_teardowns, thread_name_prefix="gpulayer-teardown"
            ),
        }
        self._lock = threading.Lock()
        self._held: dict[str, str] = {}
        """Step key -> the token of this process's lease on it (the store's lease is what
        every controller reads; this is what this one renews and ends)."""
        self._unleased: set[str] = set()
        """The reaper while it runs here: not leased as a step (its lease is the time of the
        last reap), only kept from running twice at once in this process."""
        self._stop = threading.Event()
        # The two below decide nothing: each only spares this process a store query. Whether
        # cloud work exists, and whether a reap is due (the store's `reap` lease), are read
        # from the store; these remember when this process last asked.
        self._idle_since_check: float | None = None
        """When the store last showed no cloud work (None: it may hold some)."""
        self._reap_asked_at = 0.0
        self._cloud_news = threading.Event()
        self._thread: threading.Thread | None = None
        self._sleep = WAKE_EVERY_SECONDS
        service.on_work(self._on_work)
        service.on_cloud_work(self._on_cloud_work)

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.steps.settings

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self.resume()
        self._thread = threading.Thread(target=self._loop, name="gpulayer-lifecycle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self.links.close_all()
        # A controller started after this one takes its steps over at once, as after a clean
        # restart; one that died leaves its leases to expire.
        with self._lock:
            held, self._held = list(self._held.items()), {}
        with contextlib.suppress(Exception):
            self.store.drop_leases(held)

    def resume(self) -> None:
        """What a previous controller left mid-way: the tunnels of workers it held are to be
        reopened (their silence meanwhile is ours: a column, so the sweep reads it); a job it
        was about to provision is queued again."""
        now = time.time()
        live = self.store.list_instances(live_only=True)
        for record in live:
            if record.state in HOLDS_WORKER and record.relink_since is None:
                self.store.update_instance(record.request_id, relink_since=now)
        live_jobs = {r.job_id for r in live}
        for job in self.store.list_jobs(states=["provisioning"], limit=10_000):
            if job.target == "cloud" and job.id not in live_jobs:
                self.service.requeue_for_provisioning(job.id, "the controller restarted")

    def reconnecting_workers(self) -> set[str]:
        """Workers whose instance's tunnel a restarted controller is to reopen: their silence
        is ours."""
        relinking = [
            r.request_id
            for r in self.store.list_instances(live_only=True)
            if r.state in HOLDS_WORKER and r.relink_since is not None
        ]
        if not relinking:
            return set()
        return {
            reservation.worker_id
            for reservation in self.store.reservations_of(relinking)
            if reservation.worker_id
        }

    def has_live_instances(self) -> bool:
        return bool(self.store.list_instances(live_only=True))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._sleep)
            self._wake.clear()
            try:
                self.reconcile_once()
            except Exception:
                self._sleep = WAKE_EVERY_SECONDS
                log.exception("lifecycle pass failed")

    def _on_work(self) -> None:
        # With no cloud work a change to jobs has nothing for this loop: it is not woken (a
        # thread switch per submit and per finish), and only news of cloud work wakes it.
        if self._idle_since_check is None:
            self._wake.set()

    def _on_cloud_work(self) -> None:
        self._cloud_news.set()
        self._wake.set()

    def _idle(self, now: float) -> bool:
        """Whether no cloud work exists, asking the store only when it may have changed.

        On a server without cloud jobs, asking the store at every change to jobs would cost a
        query per submit and per finish. Only a job stored for a cloud starts cloud work here
        (instances are this loop's own), and it says so; a second control plane on the same
        store is seen at the next recheck."""
        checked = self._idle_since_check
        told = self._cloud_news.is_set()
        if checked is not None and not told and 0 <= now - checked < IDLE_RECHECK_SECONDS:
            return True
        self._cloud_news.clear()  # before asking: news arriving meanwhile is asked again
        if self.store.cloud_work_exists():
            self._idle_since_check = None
            return False
        self._idle_since_check = now
        return True

    def reconcile_once(self) -> None:
        now = time.time()
        self._renew_leases(now)
        if self._idle(now) and not self._keeps_fleets():
            # Nothing cloud-bound anywhere: no instance and no queued job is read.
            self._sleep = WAKE_EVERY_SECONDS
            if self._reap_due(now):
                self._start_reap()
            return
        records, world = self._gather(now)
        decision = decide_pass(world, now)
        self._carry_out(records, world, decision, now)
        self._sleep = decision.sleep_for(time.time(), WAKE_EVERY_SECONDS)

    def _keeps_fleets(self) -> bool:
        """Whether a fleet is to be kept up (min_nodes above 0): then the pass runs without
        any job, to top it up."""
        try:
            rules = self.settings.get("fleet_rules") or ()
        except Exception:  # providers.yaml does not validate now: nothing to keep
            return False
        return any(rule.min_nodes > 0 for rule in rules)

    def _reap_due(self, now: float) -> bool:
        """Whether this process asks the store for the reap lease now (at most once every
        REAP_EVERY_SECONDS; the lease says whether any controller reaped meanwhile)."""
        if now - self._reap_asked_at <= REAP_EVERY_SECONDS:
            return False
        self._reap_asked_at = now
        return True

    def _gather(self, now: float) -> tuple[dict[str, InstanceRecord], World]:
        """The world a pass decides over, read from the store in a few batched queries: the
        jobs waiting for a machine first, so an instance recorded for one meanwhile is seen."""
        waiting = [
            *self.store.queued_jobs(),
            *self.store.list_jobs(states=["provisioning"], limit=10_000),
        ]
        waits = self.store.capacity_waits()
        records = self.store.list_instances(live_only=True)
        limits = self.settings.get("state_timeouts") or {}
        every_facts = gather(self.store, records, now, limits, self._local(now))
        world = World(
            [
                Live(r.request_id, r.job_id, facts)
                for r, facts in zip(records, every_facts, strict=True)
            ],
            [(job.id, job.target) for job in waiting],
            waits,
            limits,
            self.steps.deadman_seconds(),
            self._reap_due(now),
            tuple(self.settings.get("fleet_rules") or ()),
            {
                job.id: (array_id, job.created_at)
                for job in waiting
                if (array_id := array_of(job.spec.get("labels"))) is not None
            },
            {
                array_id: size
                for job in waiting
                if (array_id := array_of(job.spec.get("labels"))) is not None
                and (size := size_of(job.spec.get("labels"))) is not None
            },
        )
        return {r.request_id: r for r in records}, world

    def _carry_out(
        self,
        records: Mapping[str, InstanceRecord],
        world: World,
        decision: PassDecision,
        now: float,
    ) -> None:
        facts = {live.request_id: live.facts for live in world.instances}
        for request_id, actions in decision.instances.items():
            try:
                worker_id = facts[request_id].worker_id
                self.steps.carry_out(records[request_id], worker_id, actions, now, self._start)
            except Exception:
                log.exception("driving instance %s failed", request_id)
        self.service.forget_cloud_environments({live.job_id for live in world.instances})
        if decision.ended_waits:
            self.store.end_capacity_waits(decision.ended_waits)
        for job_id in decision.plan:
            together = decision.plan_with.get(job_id, ())
            self._submit(f"plan:{job_id}", self._plan, job_id, together, job_id=job_id)
        for fleet, _ in decision.top_ups:
            self._submit(fleet_wait_key(fleet), self._top_up, fleet)
        if decision.reap:
            self._start_reap()

    def _renew_leases(self, now: float) -> None:
        """Every pass holds this process's leases on for another LEASE_SECONDS: a step stays
        in flight for every controller while it runs here, however long it hangs."""
        with self._lock:
            tokens = list(self._held.values())
        if tokens:
            self.store.renew_leases(tokens, now + LEASE_SECONDS)

    # --- starting steps ---------------------------------------------------------------------------

    def _start(self, r: InstanceRecord, step: Step, now: float) -> None:
        """Begin one of an instance's steps (the decision's Submit)."""
        rid = r.request_id
        run, pool = _STEPS[step]
        key = launch_key(rid) if step == "launch" else end_key(rid) if pool == "teardown" else rid
        if step == "check":
            self.store.update_instance(rid, checked_at=now)
        self._submit(key, self._run_step, run, rid, job_id=r.job_id, pool=pool)

    def _run_step(self, run: Callable[[StepContext, str], StepResult], request_id: str) -> None:
        result = run(self.steps, request_id)
        if result.outcome != "skipped":
            self.steps.keep(request_id, result)

    def _plan(self, job_id: str, together: tuple[str, ...] = ()) -> None:
        plan_job(
            self.steps,
            job_id,
            lambda rid, job: self._submit(
                launch_key(rid), self._run_step, launch.launch, rid, job_id=job, pool="launch"
            ),
            together,
        )

    def _top_up(self, fleet: str) -> None:
        top_up(
            self.steps,
            fleet,
            PLACING,
            lambda rid, _: self._submit(
                launch_key(rid), self._run_step, launch.launch, rid, pool="launch"
            ),
        )

    def _start_reap(self) -> None:
        self._submit("reap", reap.reap_when_due, self.steps, lease=False)

    def _submit(
        self,
        key: str,
        step: Callable[..., object],
        *args: Any,
        job_id: str | None = None,
        pool: str = "steps",
        lease: bool = True,
    ) -> None:
        """Run a step in the pool of its kind; a job's steps call its provider with the
        credentials of the submit that sent it (see gpulayer.cloud.credentials)."""
        token = uuid.uuid4().hex
        with self._lock:
            if key in self._held or key in self._unleased or self._stop.is_set():
                return
            if lease:
                self._held[key] = token
            else:
                self._unleased.add(key)
        now = time.time()
        if lease and not self.store.take_lease(key, token, now=now, expires_at=now + LEASE_SECONDS):
            self._end_lease(key, token, in_store=False)  # another controller runs it
            return
        environ = self.service.cloud_environment(job_id) if job_id is not None else None

        def run() -> None:
            try:
                with using_environment(environ):
                    step(*args)
            except Exception:
                log.exception("lifecycle step %s failed", key)
            finally:
                self._end_lease(key, token, in_store=lease)
                self._wake.set()

        try:
            self._pools[pool].submit(run)
        except RuntimeError:  # the pool is shut down: the controller is stopping
            self._end_lease(key, token, in_store=lease)

    def _end_lease(self, key: str, token: str, *, in_store: bool = True) -> None:
        with self._lock:
            self._unleased.discard(key)
            if self._held.get(key) == token:
                del self._held[key]
        if in_store:
            try:
                self.store.drop_leases([(key, token)])
            except Exception:  # it expires by itself
                log.exception("ending the lease on step %s failed", key)

    def _local(self, now: float) -> Local:
        """What a pass reads beside the instances' rows: the steps in flight (every
        controller's leases) and this process's links."""
        leased = self.store.leased_keys(now)
        with self._lock:
            leased |= self._held.keys()

        def link_alive(request_id: str) -> bool:
            link = self.links.get(request_id)
            return link is not None and link.alive

        return Local(leased.__contains__, link_alive, self.steps.idle_seconds)

    # --- the reaper -------------------------------------------------------------------------

    def reap(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """What is (or would be) ended: instances of ended jobs (warm idle ones included: a
        reap does not wait for their idle_seconds), and owned instances no record knows of.
        Without dry_run it drives them now rather than at the next pass."""
        records = [
            r
            for r in self.store.list_instances(live_only=True)
            if r.state in ("idle", "draining", "terminating")
            or (r.job_id and self.store.get_job(r.job_id).terminal)
        ]
        ended = [reap.entry(r.request_id, r.provider, r.instance_id, r.job_id) for r in records]
        if not dry_run:
            for record in records:
                if record.state == "idle":
                    # Not released first: a job taking it meanwhile keeps it (the move fails).
                    self.steps.move(record, "draining", "reaped while idle")
        ended += reap.reap_unknown(self.steps, dry_run=dry_run)
        if not dry_run:
            self.store.clear_step_retries()
            self._wake.set()
        return ended


__all__ = ["GONE", "Reconciler"]

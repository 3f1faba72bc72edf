"""One loop that drives every rented instance from its stored state toward its goal.

Each pass reads the live instance records and the cloud jobs waiting for a machine. For each
instance it gathers the facts its next step depends on (its record, job, reservation, gang,
worker link and attempt, the steps in flight), asks the pure decision
(:func:`gpulayer.cloud.lifecycle.decide.decide`) for actions, and carries them out: launch,
wait for SSH and bootstrap, hand the worker to its job, reopen a lost tunnel, check the
provider still has it, drain, terminate. A step that blocks on the network runs in a pool of
its kind (launches, teardowns, the rest) and ends with a state change, so no thread waits on a
job for its life, no bootstrap holds up a teardown, and a controller that restarts picks every
record up where the last one left it. The reaper is a step of the same loop.

A gang (a distributed job of N nodes) owns N records, one per node rank, under one launch id
(node 0's request id): node 0's record makes the one launch call for all N, each node then
boots and bootstraps its own worker, the job is handed over once all N workers joined, and the
first node to fail or end takes the whole gang down (see :mod:`.gangs`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpulayer.backoff import CLOUD_TERMINATE_RETRY
from gpulayer.cloud.credentials import using_environment
from gpulayer.cloud.lifecycle import gangs, planning
from gpulayer.cloud.lifecycle.decide import (
    Action,
    EndGangNode,
    HandOver,
    InstanceFacts,
    LoseWorker,
    MarkReachable,
    MarkUnreachable,
    Move,
    Release,
    RememberReclaim,
    Step,
    Submit,
    decide,
    jobs_to_plan,
)
from gpulayer.cloud.lifecycle.links import (
    Link,
    Links,
    connect,
    host_keys_path,
    reopen,
    ssh_target,
)
from gpulayer.cloud.lifecycle.placement import candidates
from gpulayer.cloud.lifecycle.results import (
    after_config_error,
    launch_failed,
    machine_fate,
    still_saving,
)
from gpulayer.cloud.lifecycle.states import GONE, HOLDS_WORKER, check_transition
from gpulayer.cloud.lifecycle.sync import Local, end_key, gather, launch_key
from gpulayer.cloud.protocol import (
    GangProvider,
    Instance,
    OffersAreMachines,
    OutlivesReclaim,
    Provider,
    node_install_dir,
    shared_wheelhouse_dir,
)
from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.cloud.lifecycle.ports import JobPort, JobView
    from gpulayer.cloud.lifecycle.records import InstanceRecord
    from gpulayer.cloud.offer import Offer
    from gpulayer.spec import JobSpec

log = logging.getLogger("gpulayer.lifecycle")

ProvidersLoader = Callable[[tuple[str, ...]], Mapping[str, Provider]]
"""The enabled providers (those named, when any are): a control plane's ProviderRegistry
builds each once per settings change, so asking at every step costs a file read."""

DEFAULT_DEADMAN_SECONDS = 600.0
DEFAULT_PROVISIONING_SECONDS = 600.0
INSTALL_ROOT = "/var/tmp/gpulayer"
REAP_EVERY_SECONDS = 60.0
IDLE_RECHECK_SECONDS = 1.0
"""How often a loop with no cloud work asks the store again without being told of any."""
HOLD_RECLAIMED_SECONDS = 600.0
REQUEST_TAG = "gpulayer:request"
GANG_SIZE_TAG = "gpulayer:gang-size"
_RECLAIMED = "reclaimed by the provider"
LEASE_SECONDS = 20.0
"""How long a step's lease outlives the last pass of the controller running it: a controller
that died holds its steps back no longer than this."""
"""Past a reclaimed job's grace: time for its worker to upload what it wrote and report."""


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
        self.control_port = control_port
        self.owner = owner
        self.load_providers = load_providers
        self._settings = settings or dict
        self.keys_dir = service.layout.root / "keys"
        self.links = Links()
        self._pool = ThreadPoolExecutor(parallel_steps, thread_name_prefix="gpulayer-lifecycle")
        # A launch may wait long inside its provider (a Slurm allocation pending in the queue
        # behind others): launches have threads of their own, so machines already up are still
        # prepared meanwhile, and their jobs end and free what the waiting launches wait for.
        self._launch_pool = ThreadPoolExecutor(
            parallel_launches, thread_name_prefix="gpulayer-launch"
        )
        # Drains and terminates have threads of their own: slow bootstraps filling the pool
        # must not keep a machine billing after its job ended.
        self._teardown_pool = ThreadPoolExecutor(
            parallel_teardowns, thread_name_prefix="gpulayer-teardown"
        )
        self._lock = threading.Lock()
        self._placing = threading.Lock()
        self._held: dict[str, str] = {}
        """Step key -> the token of this process's lease on it (the store's lease is what
        every controller reads; this is what this one renews and ends)."""
        self._unleased: set[str] = set()
        """Steps of this process alone in flight (the reaper: two controllers reaping the
        same stray machine both ask for its terminate, which is harmless)."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._capacity_freed_at = 0.0
        self._reconnecting: set[str] = set()
        self._last_reap = 0.0
        self._idle_since_check: float | None = None
        """When the store last showed no cloud work (None: it may hold some)."""
        self._cloud_news = threading.Event()
        self._thread: threading.Thread | None = None
        service.on_work(self._on_work)
        service.on_cloud_work(self._on_cloud_work)

    @property
    def settings(self) -> Mapping[str, Any]:
        """Read at each use, so an edited providers.yaml applies to the next step."""
        return self._settings()

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self.resume()
        self._thread = threading.Thread(target=self._loop, name="gpulayer-lifecycle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._launch_pool.shutdown(wait=False, cancel_futures=True)
        self._teardown_pool.shutdown(wait=False, cancel_futures=True)
        self.links.close_all()
        # A controller started after this one takes its steps over at once, as after a clean
        # restart; one that died leaves its leases to expire.
        with self._lock:
            held, self._held = list(self._held.items()), {}
        with contextlib.suppress(Exception):
            self.store.drop_leases(held)

    def resume(self) -> None:
        """What a previous controller left mid-way: workers whose tunnel is to be reopened are
        not counted lost meanwhile; a job it was about to provision is queued again."""
        for record in self.store.list_instances(live_only=True):
            if record.state in HOLDS_WORKER:
                reservation = self.store.reservation(record.request_id)
                if reservation is not None and reservation.worker_id:
                    self._reconnecting.add(reservation.worker_id)
        live_jobs = {r.job_id for r in self.store.list_instances(live_only=True)}
        for job in self.store.list_jobs(states=["provisioning"], limit=10_000):
            if job.target == "cloud" and job.id not in live_jobs:
                self.service.requeue_for_provisioning(job.id, "the controller restarted")

    def reconnecting_workers(self) -> set[str]:
        """Workers whose instance's tunnel is being reopened: their silence is ours."""
        with self._lock:
            return set(self._reconnecting)

    def has_live_instances(self) -> bool:
        return bool(self.store.list_instances(live_only=True))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                self.reconcile_once()
            except Exception:
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
        if self._idle(now):
            # Nothing cloud-bound anywhere: no instance and no queued job is read.
            if now - self._last_reap > REAP_EVERY_SECONDS:
                self._last_reap = now
                self._submit("reap", self._reap_unknown, lease=False)
            return
        records = self.store.list_instances(live_only=True)
        busy_jobs = {r.job_id for r in records}
        limits = self.settings.get("state_timeouts") or {}
        deadman = self._deadman_seconds()
        every_facts = gather(self.store, records, now, limits, self._local(now))
        for record, facts in zip(records, every_facts, strict=True):
            try:
                actions = decide(facts, now, limits=limits, deadman_seconds=deadman)
                self._carry_out(record, facts, actions, now)
            except Exception:
                log.exception("driving instance %s failed", record.request_id)
        waiting = [
            *self.store.queued_jobs(),
            *self.store.list_jobs(states=["provisioning"], limit=10_000),
        ]
        self.service.forget_cloud_environments(busy_jobs)
        waiting_for_machines = [(job.id, job.target) for job in waiting]
        waits = self.store.capacity_waits()
        stale = waits.keys() - {job.id for job in waiting}
        if stale:  # jobs that stopped waiting (cancelled, planned by another controller)
            self.store.end_capacity_waits(stale)
        for job_id in jobs_to_plan(waiting_for_machines, busy_jobs, waits, now):
            self._submit(f"plan:{job_id}", self._plan_job, job_id, job_id=job_id)
        if now - self._last_reap > REAP_EVERY_SECONDS:
            self._last_reap = now
            self._submit("reap", self._reap_unknown, lease=False)

    def _renew_leases(self, now: float) -> None:
        """Every pass holds this process's leases on for another LEASE_SECONDS: a step stays
        in flight for every controller while it runs here, however long it hangs."""
        with self._lock:
            tokens = list(self._held.values())
        if tokens:
            self.store.renew_leases(tokens, now + LEASE_SECONDS)

    def _submit(
        self,
        key: str,
        step: Callable[..., object],
        *args: Any,
        job_id: str | None = None,
        teardown: bool = False,
        launch: bool = False,
        lease: bool = True,
    ) -> None:
        """Run a step in the pool (a launch or a teardown in the pool of its kind); a job's
        steps call its provider with the credentials of the submit that sent it (see
        gpulayer.cloud.credentials)."""
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
            pool = self._teardown_pool if teardown else self._launch_pool if launch else self._pool
            pool.submit(run)
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

    # --- one instance: its facts, the pure decision, and carrying it out ------------------------

    def _local(self, now: float) -> Local:
        """What a pass reads beside the instances' rows: the steps in flight (every
        controller's leases) and this process's links."""
        leased = self.store.leased_keys(now)
        with self._lock:
            leased |= self._held.keys()

        def link_alive(request_id: str) -> bool:
            link = self.links.get(request_id)
            return link is not None and link.alive

        return Local(leased.__contains__, link_alive)

    def _carry_out(
        self, r: InstanceRecord, facts: InstanceFacts, actions: list[Action], now: float
    ) -> None:
        """Each action in turn; a move another controller won ends the list."""
        rid = r.request_id
        for action in actions:
            if isinstance(action, Move):
                if not self._carry_out_move(r, action, now):
                    return
            elif isinstance(action, Submit):
                self._submit_step(r, action.step, now)
            elif isinstance(action, Release):
                self._release(r, action.why)
            elif isinstance(action, LoseWorker):
                self._lose(r, facts.worker_id, action.reason, action.why)
            elif isinstance(action, EndGangNode):
                if action.end_attempt and facts.worker_id is not None:
                    self.service.end_worker_attempts(facts.worker_id, "worker_lost", action.why)
                self._release(r, action.why)
            elif isinstance(action, MarkUnreachable):
                self.store.update_instance(rid, unreachable_since=action.at)
            elif isinstance(action, MarkReachable):
                self.store.update_instance(rid, unreachable_since=None)
            elif isinstance(action, RememberReclaim):
                self._remember_reclaim(r)
            elif isinstance(action, HandOver):
                self.service.hand_to_reserved_worker(r.job_id)

    def _carry_out_move(self, r: InstanceRecord, move: Move, now: float) -> bool:
        values: dict[str, Any] = {}
        if move.failed_try:
            values.update(planning.failed(move.reason).columns())
        if move.gone:
            values["ended_at"] = now
        if not self._move(r, move.to, move.reason, **values):
            return False
        if move.announce:
            log.warning("instance %s: %s", r.request_id, move.reason)
            self._note(r.job_id, f"instance {r.request_id}: {move.reason}; moved to {move.to}")
        if move.gone:
            self._gone(r)
        return True

    def _submit_step(self, r: InstanceRecord, step: Step, now: float) -> None:
        rid, job_id = r.request_id, r.job_id
        if step == "launch":
            self._submit(launch_key(rid), self._launch, rid, job_id=job_id, launch=True)
        elif step == "prepare":
            self._submit(rid, self._prepare, rid, job_id=job_id)
        elif step == "reconnect":
            self._submit(rid, self._reconnect, rid, job_id=job_id)
        elif step == "check":
            self.store.update_instance(rid, checked_at=now)
            self._submit(rid, self._check, rid, job_id=job_id)
        elif step == "drain":
            self._submit(end_key(rid), self._drain, rid, job_id=job_id, teardown=True)
        else:
            self._submit(end_key(rid), self._terminate, rid, job_id=job_id, teardown=True)

    # --- state changes --------------------------------------------------------------------------

    def _move(self, r: InstanceRecord, to: str, reason: str, **values: Any) -> bool:
        check_transition(r.state, to)
        moved = self.store.move_instance(
            r.request_id, expect=r.state, to=to, reason=reason, **values
        )
        if moved:
            log.info("instance %s: %s -> %s (%s)", r.request_id, r.state, to, reason)
            r.state = to
            self._wake.set()
        return moved

    def _fresh(self, request_id: str) -> InstanceRecord:
        return self.store.get_instance(request_id)

    def _release(self, r: InstanceRecord, why: str) -> None:
        """The job is done with the instance: no one may be dispatched to its worker now."""
        self.store.release_reservation(r.request_id)
        self._move(r, "draining", why)

    def _lose(self, r: InstanceRecord, worker_id: str | None, reason: str, why: str) -> None:
        if worker_id is not None:
            self.service.end_worker_attempts(worker_id, reason, why)
        self.service.log_system(r.job_id, 0, [f"instance {r.request_id}: {why}"])
        self._release(r, why)

    def _gone(self, r: InstanceRecord) -> None:
        """Nothing is left in the cloud: forget the link and remove the instance's keys."""
        from gpulayer.ssh.keys import KeyPair, remove_keypair

        self.links.close(r.request_id)
        self.store.release_reservation(r.request_id)
        shared = r.launch_id is not None and any(
            i.key_path == r.key_path and i.request_id != r.request_id and not i.gone
            for i in self._gang(r)
        )
        if r.key_path and not shared:
            private = Path(r.key_path)
            remove_keypair(KeyPair(private, private.with_suffix(".pub"), ""))
        pinned = host_keys_path(self.keys_dir, r.request_id)
        if pinned.is_dir():
            shutil.rmtree(pinned, ignore_errors=True)
        else:
            pinned.unlink(missing_ok=True)

    def _gang(self, r: InstanceRecord) -> list[InstanceRecord]:
        """The records launched with ``r`` (itself included); just ``r`` when it is alone."""
        if r.launch_id is None:
            return [r]
        return [i for i in self.store.list_instances(job_id=r.job_id) if i.launch_id == r.launch_id]

    # --- steps (each runs in the pool and ends in a state change) --------------------------------

    def _plan_job(self, job_id: str) -> None:
        from gpulayer.spec import JobSpec

        job = self.store.get_job(job_id)
        if job.target != "cloud" or job.state not in ("queued", "provisioning"):
            return
        if self.store.list_instances(job_id=job_id, live_only=True):
            return
        spec = JobSpec.model_validate(job.spec)
        placement = spec.placement
        providers = self.load_providers(tuple(placement.providers))
        found = candidates(
            spec,
            providers,
            self.store.list_instances(live_only=True),
            job_id,
            lambda text: self._note(job_id, text),
            wait_seconds=self.settings.get("cloud_wait_seconds"),
        )
        if found.never is not None:
            return self._next_target_or_fail(job, spec, found.never)
        now = time.time()
        tries = planning.tries_of(self.store.list_instances(job_id=job_id))
        held = planning.held_offers(self.store.instances_holding_offers(now), now)
        provisioning = placement.provisioning

        def choose(unavailable: Mapping[planning.OfferKey, str]) -> planning.Decision:
            return planning.choose(
                found.fitting,
                tries,
                now=now,
                capacity_freed_at=self._capacity_freed_at,
                held_offers={**held, **unavailable},
                busy=found.busy,
                queue=placement.on_unschedulable == "queue",
                wait_limit=provisioning.provisioning_timeout_seconds if provisioning else None,
                wait_started=job.created_at,
            )

        decision = choose({})
        if decision.offer is not None:
            with self._placing:
                # Plans run side by side: an offer that is one machine (an ssh host) goes to
                # the first job that records it, and a job planned at the same instant
                # chooses again rather than reaching for the same host.
                taken = self._machines_taken(job_id, providers)
                if planning.offer_key(decision.offer) in taken:
                    decision = choose(taken)
                if decision.offer is not None:
                    self.store.end_capacity_waits([job_id])
                    self._record(job, spec, decision.offer)
                    return
        if decision.wait is not None:
            retry_in = decision.retry_in or planning.backoff_seconds(1)
            self.store.wait_for_capacity_until(job_id, now + retry_in)
            self.service.wait_for_capacity(job_id, decision.wait)
        else:
            self._next_target_or_fail(job, spec, decision.give_up or "no offer left")

    def _machines_taken(
        self, job_id: str, providers: Mapping[str, Provider]
    ) -> dict[planning.OfferKey, str]:
        """Offers that are one machine and that another job's live instance holds now."""
        taken: dict[planning.OfferKey, str] = {}
        for record in self.store.list_instances(live_only=True):
            if record.job_id == job_id or not record.offer:
                continue
            provider = providers.get(record.provider)
            if isinstance(provider, OffersAreMachines):
                taken[planning.offer_key(record.offer)] = f"in use by job {record.job_id}"
        return taken

    def _record(self, job: JobView, spec: JobSpec, offer: Offer) -> None:
        """Write the instance down (with its reservation) before anything is created."""
        from gpulayer.ids import new_id
        from gpulayer.ssh.keys import generate_keypair

        nodes = gangs.nodes_of(spec)
        request_ids = [new_id("r", 12) for _ in range(nodes)]
        request_id = request_ids[0]
        # One key for the gang: its nodes come from one launch call, which takes one key.
        keys = generate_keypair(self.keys_dir, request_id)
        tags = {"gpulayer:owner": self.owner, "gpulayer:job": job.id, REQUEST_TAG: request_id}
        if nodes > 1:
            tags[GANG_SIZE_TAG] = str(nodes)
        self.store.record_instances(
            [
                {
                    "request_id": node_request,
                    "job_id": job.id,
                    "owner": self.owner,
                    "provider": offer.provider,
                    "region": offer.region,
                    "zone": offer.zone,
                    "instance_type": offer.instance_type,
                    "state": "requested",
                    "key_path": str(keys.private_path),
                    "hourly_price": offer.hourly_price,
                    "currency": offer.currency,
                    "spot": offer.spot,
                    "tags": tags,
                    "offer": offer.model_dump(mode="json"),
                    "launch_id": request_id if nodes > 1 else None,
                    "node_rank": rank,
                }
                for rank, node_request in enumerate(request_ids)
            ],
            reason=f"offer {offer.label} for job {job.id}"
            + (f" (gang of {nodes})" if nodes > 1 else ""),
        )
        what = offer.label if nodes == 1 else f"{nodes} x {offer.label}"
        if not self.service.begin_provisioning(job.id, f"provisioning {what}"):
            return  # cancelled meanwhile: the next pass ends the record as never launched
        self._submit(launch_key(request_id), self._launch, request_id, job_id=job.id, launch=True)

    def _launch(self, request_id: str) -> None:
        from gpulayer.cloud.errors import ProviderError
        from gpulayer.cloud.offer import Offer
        from gpulayer.cloud.protocol import LaunchRequest
        from gpulayer.spec import JobSpec
        from gpulayer.ssh.keys import load_keypair

        r = self._fresh(request_id)
        if r.state == "requested" and not self._move(r, "launching", "calling the provider"):
            return
        job = self.store.get_job(r.job_id)
        if r.state != "launching" or job.terminal:
            return  # an ended job's record is ended by the next pass
        gang = sorted(self._gang(r), key=lambda node: node.node_rank)
        for node in gang:
            if node.state == "requested" and node.request_id != request_id:
                # The one call may create every node: each is launching from here on.
                self._move(node, "launching", f"node 0 ({request_id}) calls the provider")
        if any(node.state != "launching" for node in gang):
            return  # a node ended meanwhile: the next pass ends the gang
        spec = JobSpec.model_validate(job.spec)
        offer = Offer.model_validate(r.offer)
        provider = self._provider(r)
        if provider is None:
            return
        keys = load_keypair(self.keys_dir, request_id)
        release = spec.placement.provisioning.release if spec.placement.provisioning else None
        count = len(gang)
        what = offer.label if count == 1 else f"{count} x {offer.label} together"
        self._note(r.job_id, f"launching {what} at {_price(offer)}{' each' if count > 1 else ''}")
        try:
            request = LaunchRequest(
                request_id=request_id,
                job_id=r.job_id,
                owner=self.owner,
                tags=r.tags,
                ssh_public_key=keys.public_key,
                allowed_ssh_cidr=self._ssh_cidr(),
                image_release=release,
                image=self._image_for(offer.provider, release),
                disk_gb=int(spec.resources.disk_gb) if spec.resources.disk_gb else None,
                spot=offer.spot,
                time_limit_seconds=spec.timeout_seconds,
                provisioning_timeout_seconds=(
                    spec.placement.provisioning.provisioning_timeout_seconds
                    if spec.placement.provisioning
                    else DEFAULT_PROVISIONING_SECONDS
                ),
                count=count,
                progress=lambda text: self._launch_progress(r.job_id, text),
            )
            if count == 1:
                instances = [provider.launch(offer, request)]
            elif isinstance(provider, GangProvider):
                instances = list(provider.launch_gang(offer, request))
            else:
                raise UsageError(f"provider {offer.provider} cannot launch {count} nodes together")
            if len(instances) != count:
                raise ProviderError(
                    f"asked for {count} instances, the provider answered {len(instances)}",
                    provider=offer.provider,
                )
        except Exception as exc:
            failed = launch_failed(exc)  # what it means is decided as data, not here
            self._end_launch(gang, failed.to, failed.reason, failed.end)
            then = failed.then
            if failed.config:
                tries = [
                    i
                    for i in self.store.list_instances(job_id=r.job_id)
                    if i.provider == offer.provider and i.outcome == "config"
                ]
                then = after_config_error(offer.provider, len(tries))
            self._note(r.job_id, f"{offer.label}: {exc}; {then}")
            return
        for node, instance in zip(gang, instances, strict=True):
            price = (
                instance.hourly_price if instance.hourly_price is not None else offer.hourly_price
            )
            self._move(
                node,
                "booting",
                f"launched {instance.id}" + (f" as node {node.node_rank}" if count > 1 else ""),
                instance_id=instance.id,
                ssh_host=instance.ssh_host,
                launched_at=time.time(),
                hourly_price=price,
                machine=instance.model_dump(mode="json"),
            )
        if count > 1:
            self._note(
                r.job_id,
                f"gang of {count} launched together: "
                + ", ".join(
                    f"node {n.node_rank} on {i.id}" for n, i in zip(gang, instances, strict=True)
                ),
            )

    def _launch_progress(self, job_id: str, text: str) -> None:
        self._note(job_id, text)
        if text.startswith("waiting for capacity"):
            # A launch that waits in a provider's queue says why in the job's status too.
            self.service.begin_provisioning(job_id, text)

    def _end_launch(
        self, gang: list[InstanceRecord], to: str, reason: str, end: planning.TryEnd
    ) -> None:
        """The launch call did not give the gang: every node moves to ``to``. Node 0's record
        alone carries the outcome, so one gang counts as one try when the next offer is
        chosen."""
        for node in gang:
            values: dict[str, Any] = end.columns() if node.node_rank == 0 else {}
            if to == "never_launched":
                values["ended_at"] = time.time()
            # A node the stuck pass moved on meanwhile is its teardown's now.
            if self._move(node, to, reason, **values) and to == "never_launched":
                self._gone(node)

    def _prepare(self, request_id: str) -> None:
        """booting -> bootstrapping -> ready: wait for SSH, install and start the worker."""
        from gpulayer.cloud.bootstrap import BootstrapPlan, bootstrap_worker
        from gpulayer.cloud.wheelhouse import build_wheelhouse
        from gpulayer.spec import JobSpec

        r = self._fresh(request_id)
        if r.state != "booting" or not r.machine or not r.key_path:
            return
        job = self.store.get_job(r.job_id)
        spec = JobSpec.model_validate(job.spec)
        provisioning = spec.placement.provisioning
        budget = (
            provisioning.provisioning_timeout_seconds
            if provisioning
            else DEFAULT_PROVISIONING_SECONDS
        )
        deadline = (r.launched_at or r.created_at) + budget
        machine = r.machine
        described = Instance.model_validate(machine)  # what the provider said of the machine
        offer_label = _label(r)
        session = None
        link: Link | None = None
        try:
            self._note(r.job_id, f"waiting for SSH on {ssh_target(machine, Path(r.key_path))}")
            session = connect(
                machine,
                Path(r.key_path),
                self.keys_dir,
                request_id,
                _left(deadline),
                on_progress=lambda text: self._note(r.job_id, text),
            )
            install_dir = r.install_dir or node_install_dir(
                described.install_root or INSTALL_ROOT, r.job_id, r.node_rank
            )
            if r.token_hash is not None:
                self._clear_earlier_bootstrap(r, session, install_dir)
            token, token_hash = self.service.worker_credential(f"cloud worker {request_id}")
            self.store.update_instance(request_id, token_hash=token_hash, install_dir=install_dir)
            if not self._move(r, "bootstrapping", "SSH answered"):
                return
            self._note(r.job_id, "bootstrapping the worker")
            wheelhouse = build_wheelhouse(self.service.layout.root / "cache" / "wheelhouse")
            plan = BootstrapPlan(
                install_dir=install_dir,
                control_plane_port=self.control_port,
                worker_token=token,
                worker_name=request_id,
                labels={"gpulayer.request": request_id, "gpulayer.job": r.job_id},
                provider=r.provider,
                region=r.region,
                zone=r.zone,
                hourly_price=r.hourly_price,
                currency=r.currency,
                deadman_seconds=self._deadman_seconds(),
                deadman_action=self._deadman_action(r.provider),
                python=described.python or "python3",
                hand_off=described.worker_start == "launcher",
                instance_request_id=request_id,
                system_site_packages=bool(self.settings.get("system_site_packages", False)),
                wheelhouse_dir=shared_wheelhouse_dir(described.shared_dir, wheelhouse.key),
                # The other nodes of a gang reach this one where the provider says it is.
                node_address=(
                    str(machine.get("private_ip") or machine["ssh_host"]) if r.launch_id else None
                ),
            )
            remote = bootstrap_worker(
                session,
                plan,
                wheelhouse,
                on_output=lambda line: self._note(r.job_id, line),
                timeout=_left(deadline),
            )
            link = Link(session, remote.tunnel, install_dir)
            self.links.put(request_id, link)
            self.store.update_instance(request_id, tunnel_port=remote.remote_port)
            worker_id = self._wait_for_binding(request_id, deadline)
            if not self._move(r, "ready", f"worker {worker_id} joined", ready_at=time.time()):
                # Moved on meanwhile (timed out, or its job ended): its teardown may have run
                # before this link existed, so the worker it started is stopped here.
                self._abandon_worker(request_id)
                return
            self._note(r.job_id, f"worker {request_id} is ready on {machine['ssh_host']}")
            if gangs.all_ready(r, self._gang(r)):
                self.service.hand_to_reserved_worker(r.job_id)
        except Exception as exc:
            if link is not None:
                self.links.close(request_id)
            elif session is not None:
                session.close()
            current = self._fresh(request_id)
            if current.state in ("booting", "bootstrapping"):
                # One node of a gang failing is a partial launch: every node goes, and the
                # gang's zone is not tried again for the job.
                end = (
                    planning.partial("zone", f"node {r.node_rank} {exc}")
                    if r.launch_id
                    else planning.failed(str(exc))
                )
                self._move(
                    current, "draining", f"could not be made a worker: {exc}", **end.columns()
                )
            if r.launch_id:
                self._note(
                    r.job_id,
                    f"{offer_label}: node {r.node_rank} could not be made a worker "
                    f"({type(exc).__name__}: {exc}); tearing the whole gang down and "
                    f"blocking zone {r.zone or r.region} for this job",
                )
            else:
                self._note(
                    r.job_id, f"{offer_label}: {type(exc).__name__}: {exc}; trying the next offer"
                )

    def _clear_earlier_bootstrap(self, r: InstanceRecord, session: Any, install_dir: str) -> None:
        """A restart cut a bootstrap off: end what it started, so the new one starts clean."""
        from gpulayer.cloud.bootstrap import remove_command, stop_command

        for command in (stop_command(install_dir, 2), remove_command(install_dir)):
            with contextlib.suppress(Exception):
                session.run(command, timeout=60)
        if r.token_hash:
            self.store.remove_token(r.token_hash)
        reservation = self.store.reservation(r.request_id)
        if reservation is not None and reservation.worker_id:
            self.service.retire_worker(reservation.worker_id)
        self._note(r.job_id, f"instance {r.request_id}: cleared the bootstrap a restart cut off")

    def _wait_for_binding(self, request_id: str, deadline: float) -> str:
        while True:
            reservation = self.store.reservation(request_id)
            if reservation is not None and reservation.worker_id:
                return reservation.worker_id
            _left(deadline, "the worker did not join the control plane in time")
            self.service.wait_for_change(self.service.version, 0.5)

    def _reconnect(self, request_id: str) -> None:
        r = self._fresh(request_id)
        reservation = self.store.reservation(request_id)
        if r.state not in HOLDS_WORKER or not r.machine or not r.key_path or not r.tunnel_port:
            return
        if self._ended_outside(r):
            return
        try:
            link = reopen(
                r.machine,
                Path(r.key_path),
                self.keys_dir,
                request_id,
                control_port=self.control_port,
                tunnel_port=r.tunnel_port,
                install_dir=r.install_dir or "",
                timeout=30,
            )
        except Exception as exc:
            log.warning("instance %s: reopening its tunnel failed: %s", request_id, exc)
            self.store.update_instance(request_id, next_step_at=time.time() + 5)
            return
        self.links.put(request_id, link)
        worker_id = reservation.worker_id if reservation is not None else None
        if worker_id:
            # The worker was silent because we were gone: count from now.
            self.service.credit_worker_silence(worker_id)
        with self._lock:
            self._reconnecting.discard(worker_id or "")
        self._note(r.job_id, f"instance {request_id}: SSH tunnel reopened on port {r.tunnel_port}")

    def _check(self, request_id: str) -> None:
        r = self._fresh(request_id)
        if r.state in HOLDS_WORKER:
            self._ended_outside(r)

    def _ended_outside(self, r: InstanceRecord) -> bool:
        """Does the provider still have it? A reclaimed instance ends its attempt as
        preempted. True when the instance is gone and that was dealt with."""
        request_id, instance_id = r.request_id, r.instance_id
        provider = self._provider(r) if instance_id else None
        if provider is None or instance_id is None:
            return False
        try:
            found = [i for i in provider.describe([instance_id]) if i.id == instance_id]
        except Exception as exc:
            log.info("instance %s: describe failed (%s); checking again later", request_id, exc)
            return False
        instance = found[0] if found else None
        fate = machine_fate(instance, r.outcome)
        if fate == "there":
            return False
        reservation = self.store.reservation(request_id)
        worker_id = reservation.worker_id if reservation is not None else None
        where = f"{r.provider} {r.instance_id}"
        if fate == "reclaimed":
            if r.reclaimed_at is None:
                self._remember_reclaim(r)
            if worker_id is not None and self._saving_its_work(r, worker_id):
                return False
            if r.reclaimed_at is not None:
                self.store.update_instance(request_id, reclaimed_at=None)
            self._lose(r, worker_id, "preempted", f"{where} was reclaimed by the provider")
        else:
            state = instance.state if instance is not None else "gone"
            self._lose(r, worker_id, "worker_lost", f"{where} is {state}")
        return True

    def _remember_reclaim(self, r: InstanceRecord) -> None:
        """The provider took the machine back: its offer is held for a while, and the record
        says why its try ended."""
        until = time.time() + float(
            self.settings.get("hold_reclaimed_seconds", HOLD_RECLAIMED_SECONDS)
        )
        self.store.update_instance(
            r.request_id,
            note=_RECLAIMED,
            outcome="reclaimed",
            outcome_scope=None,
            outcome_message=_RECLAIMED,
            hold_until=until,
        )
        r.note, r.outcome, r.hold_until = _RECLAIMED, "reclaimed", until

    def _saving_its_work(self, r: InstanceRecord, worker_id: str) -> bool:
        """Whether a reclaimed machine's job still saves its work (see results.still_saving):
        the tunnel stays open meanwhile. The first time, when that wait began is stored."""
        answers = bool(self.store.active_attempts(worker_id))
        if not answers or self.store.get_worker(worker_id).state != "ready":
            return False
        now = time.time()
        grace = float(self.store.get_job(r.job_id).spec.get("grace_seconds", 30))
        if r.reclaimed_at is None:
            self.store.update_instance(r.request_id, reclaimed_at=now)
            r.reclaimed_at = now
            self._note(
                r.job_id,
                f"instance {r.request_id}: reclaimed by the provider; its job has up to "
                f"{grace:g} s to save its work",
            )
        return still_saving(r.reclaimed_at, now, grace, worker_answers=True)

    def _abandon_worker(self, request_id: str, *, stop: bool = True) -> None:
        """Stop the worker over its link (when it answers) and close the link."""
        from gpulayer.cloud.bootstrap import remove_command, stop_command

        link = self.links.pop(request_id)
        if link is None:
            return
        if stop and link.alive and link.install_dir:
            for command in (stop_command(link.install_dir, 10), remove_command(link.install_dir)):
                try:
                    link.session.run(command, timeout=60)
                except Exception as exc:
                    log.warning("instance %s: %s", request_id, exc)
                    break
        link.close()

    def _drain(self, request_id: str) -> None:
        """Take the worker off: stop it, close the tunnel, revoke its token."""
        r = self._fresh(request_id)
        if r.state != "draining":
            return
        reclaimed = r.outcome == "reclaimed"
        self._abandon_worker(
            request_id, stop=not reclaimed or isinstance(self._provider(r), OutlivesReclaim)
        )
        reservation = self.store.reservation(request_id)
        if reservation is not None and reservation.worker_id:
            self.service.retire_worker(reservation.worker_id)
        self.store.release_reservation(request_id)
        if r.token_hash:
            self.store.remove_token(r.token_hash)
        if self._move(r, "terminating", "worker stopped"):
            self._terminate(request_id)

    def _terminate(self, request_id: str) -> None:
        r = self._fresh(request_id)
        if r.state != "terminating":
            return
        gang = self._gang(r)
        if not gangs.terminate_leader(r, gang):
            return  # the gang's nodes end in one call, made once all of them are here
        nodes = gangs.terminating(gang) if r.launch_id else [r]
        provider = self._provider(r)
        if provider is None:
            return self._terminate_later(r, f"provider {r.provider} is not enabled")
        try:
            ids = [n.instance_id for n in nodes if n.instance_id]
            if len(ids) < len(nodes):
                # The launch may have gone through without an answer: find it by its tag.
                tag = r.launch_id or request_id
                ids += [i.id for i in provider.list_owned({REQUEST_TAG: tag}) if i.id not in ids]
            if ids:
                provider.terminate(ids)
                still = [i.id for i in provider.describe(ids) if i.state != "terminated"]
                if still:
                    raise RuntimeError(f"{', '.join(still)} not terminated yet")
        except Exception as exc:
            return self._terminate_later(r, str(exc))
        ended_at = time.time()  # one confirmation ends every node at once
        for node in nodes:
            self._move(node, "terminated", "the provider confirmed", ended_at=ended_at)
        for node in nodes:
            self._gone(node)
        if ids:
            self._capacity_freed_at = time.time()
            self.store.end_capacity_waits()  # jobs waiting for capacity look again now
        if r.launch_id:
            self._note(
                r.job_id,
                f"gang of {len(nodes)} torn down together: "
                + ", ".join(n.request_id for n in nodes),
            )
        else:
            self._note(r.job_id, f"instance {request_id} torn down")

    def _terminate_later(self, r: InstanceRecord, why: str) -> None:
        failures = self._fresh(r.request_id).step_failures + 1
        # The error has its own column: the outcome of the try stays what the next choice
        # reads, and the backoff survives a restart.
        self.store.update_instance(
            r.request_id,
            last_error=f"terminate failed: {why}",
            step_failures=failures,
            next_step_at=time.time() + CLOUD_TERMINATE_RETRY.delay(failures),
        )
        log.warning("terminating %s failed (%s); retrying", r.request_id, why)
        if failures == 1:
            self._note(r.job_id, f"instance {r.request_id}: terminating failed ({why}); retrying")

    # --- the reaper -------------------------------------------------------------------------

    def reap(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        """What is (or would be) ended: instances of ended jobs, and owned instances no record
        knows of. Without dry_run it drives them now rather than at the next pass."""
        ended = [
            _entry(r.request_id, r.provider, r.instance_id, r.job_id)
            for r in self.store.list_instances(live_only=True)
            if self.store.get_job(r.job_id).terminal or r.state in ("draining", "terminating")
        ]
        ended += self._reap_unknown(dry_run=dry_run)
        if not dry_run:
            self.store.clear_step_retries()
            self._wake.set()
        return ended

    def _reap_unknown(self, *, dry_run: bool = False) -> list[dict[str, Any]]:
        try:
            providers = self.load_providers(())
        except Exception as exc:
            log.warning("reaper: %s", exc)
            return []
        known = {r.request_id for r in self.store.list_instances(live_only=True)}
        known_ids = {r.instance_id for r in self.store.list_instances(live_only=True)}
        ended = []
        for name, provider in providers.items():
            try:
                owned = provider.list_owned({"gpulayer:owner": self.owner})
            except Exception as exc:
                log.warning("reaper: listing %s failed: %s", name, exc)
                continue
            for instance in owned:
                if instance.tags.get(REQUEST_TAG) in known or instance.id in known_ids:
                    continue
                ended.append(
                    _entry(
                        instance.tags.get(REQUEST_TAG),
                        name,
                        instance.id,
                        instance.tags.get("gpulayer:job"),
                    )
                )
                if not dry_run:
                    try:
                        provider.terminate([instance.id])
                    except Exception as exc:
                        log.warning("reaper: terminating %s failed: %s", instance.id, exc)
        return ended

    # --- helpers -----------------------------------------------------------------------------

    def _provider(self, r: InstanceRecord) -> Provider | None:
        try:
            return self.load_providers((r.provider,)).get(r.provider)
        except Exception as exc:
            log.warning("instance %s: provider %s: %s", r.request_id, r.provider, exc)
            return None

    def _note(self, job_id: str, text: str) -> None:
        self.service.log_system(job_id, 0, [text])

    def _next_target_or_fail(self, job: JobView, spec: JobSpec, why: str) -> None:
        target, refused = self.service.next_target(spec)
        if target is not None:
            moving = f"cloud: {why}; trying target {target}"
            self._note(job.id, moving)
            self.service.move_to_target(job.id, target, moving)
            return
        if refused:
            why = f"{why}; fallback: {'; '.join(refused)}"
        self._note(job.id, f"unschedulable: {why}")
        self.service.fail_unplaced(job.id, "unschedulable", why)

    def _ssh_cidr(self) -> str:
        configured = self.settings.get("ssh_cidr")
        if configured:
            return str(configured)
        from gpulayer.cloud.network import controller_cidr

        return controller_cidr()

    def _image_for(self, provider: str, release: str | None) -> dict[str, Any]:
        from gpulayer.cloud.images import resolve_release

        return dict(resolve_release(provider, release).selector)

    def _deadman_seconds(self) -> float:
        return float(self.settings.get("deadman_seconds", DEFAULT_DEADMAN_SECONDS))

    def _deadman_action(self, provider: str) -> str:
        configured = os.environ.get("GPULAYER_DEADMAN_ACTION") or self.settings.get(
            "deadman_action"
        )
        if configured:
            return str(configured)
        # Powering off is how a cloud instance stops billing; on a host we do not own (an ssh
        # host, a Slurm node, whose allocation ends by its time limit), only the worker stops.
        return "stop" if provider in ("ssh", "slurm") else "poweroff"


def _left(deadline: float, why: str = "provisioning_timeout_seconds ran out") -> float:
    from gpulayer.cloud.errors import ProvisionTimeout

    left = deadline - time.time()
    if left <= 0:
        raise ProvisionTimeout(why)
    return left


def _price(offer: Offer) -> str:
    if offer.hourly_price is None:
        return "an unknown price"
    return f"{offer.hourly_price} {offer.currency}/h"


def _label(r: InstanceRecord) -> str:
    if r.offer:
        return planning.key_label(planning.offer_key(r.offer))
    return f"{r.provider}/{r.zone or r.region}/{r.instance_type}"


def _entry(
    request_id: str | None, provider: str, instance_id: str | None, job_id: str | None
) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "provider": provider,
        "instance_id": instance_id,
        "job_id": job_id,
    }


__all__ = ["GONE", "Reconciler"]

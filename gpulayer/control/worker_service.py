"""Workers: their registrations (with the credential bound to each), heartbeats, the silence
that loses them, and the moves their machines' lifecycle makes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.control.attempt_ends import AttemptEnds
from gpulayer.control.auth import Principal, issue_token
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.dispatch import LivePlacement
from gpulayer.control.dispatcher import Dispatcher
from gpulayer.control.progress import ServerProgress
from gpulayer.control.serving_clock import ServingClock
from gpulayer.control.store import Store, WorkerRecord
from gpulayer.control.token_service import TokenService
from gpulayer.control.worker_access import WorkerAccess
from gpulayer.errors import ForbiddenError, NotFoundError
from gpulayer.ids import new_id
from gpulayer.protocol.messages import HeartbeatReply, Registration
from gpulayer.spec.capabilities import BoundedCapabilities


class WorkerService:
    def __init__(
        self,
        store: Store,
        *,
        placement: LivePlacement,
        dispatcher: Dispatcher,
        ends: AttemptEnds,
        tokens: TokenService,
        changes: ChangeFeed,
        progress: ServerProgress,
        clock: ServingClock,
        heartbeat_timeout: float,
        silence_excused: Callable[[], set[str]],
    ) -> None:
        self.store = store
        self.placement = placement
        self.dispatcher = dispatcher
        self.ends = ends
        self.tokens = tokens
        self.changes = changes
        self.progress = progress
        self.clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self.silence_excused = silence_excused
        """Workers whose silence is the control plane's own (their tunnel is being reopened)."""
        self._degraded: dict[str, str | None] = {}
        """What each worker last said of why it takes no job (see _note_degraded)."""

    def register_worker(
        self, registration: Registration, caller: Principal | None = None
    ) -> tuple[WorkerRecord, str | None]:
        """Add a worker (or a new epoch of one); returns it and, for a caller over the API, the
        credential bound to it. ``caller`` None is the control plane's own in-process worker."""
        if caller is not None:
            _check_registration(registration, caller)
        capabilities = BoundedCapabilities.model_validate(registration.capabilities)
        worker_id = registration.worker_id or new_id("w")
        join_token = caller.token_id if caller is not None and caller.kind == "join" else None
        if join_token is not None and not self.store.count_registration(join_token):
            raise ForbiddenError("this join token has registered all the workers it may")
        worker = self.store.upsert_worker(
            worker_id=worker_id,
            name=registration.name,
            kind=registration.kind,
            labels=registration.labels,
            capabilities=capabilities.model_dump(mode="json"),
        )
        self._degraded.pop(worker.id, None)  # its capabilities were replaced whole
        if registration.instance_request_id:
            # A cloud worker: it runs its instance's job, found by the reservation, not by name.
            self.store.bind_reservation(registration.instance_request_id, worker.id)
        credential = None
        if caller is not None and caller.kind != "worker":
            parent = caller.token_id if caller.kind == "join" else None
            credential, _ = issue_token(
                self.store, "worker", f"worker {worker.name}", worker_id=worker.id, parent_id=parent
            )
        if worker.epoch > 1:
            # Whatever it ran before it came back is gone with its old process.
            for attempt in self.store.active_attempts(worker.id):
                self.ends.lose_attempt(attempt, "the worker restarted")
        self.placement.worker_changed(worker.id)
        self.dispatcher.dispatch()
        return worker, credential

    def list_workers(self) -> list[WorkerRecord]:
        return self.store.list_workers()

    def heartbeat(
        self,
        worker_id: str,
        running: Sequence[int] = (),
        caller: Principal | None = None,
        degraded: str | None = None,
    ) -> HeartbeatReply:
        """Note the worker alive; settle what it runs against what the store says it runs.

        An attempt the worker reports but no longer owns is fenced (the worker ends it). An
        attempt the store has running there that the worker does not report, once it had a
        heartbeat timeout to show up (a claim whose reply was lost), is lost and retried."""
        WorkerAccess.check_worker(caller, worker_id)
        self.store.worker_heartbeat(worker_id)
        self.placement.worker_alive(worker_id)
        self._note_degraded(worker_id, degraded)
        reply = self.pending_signals(worker_id)
        reported = set(running)
        active = self.store.active_attempts(worker_id)
        active_ids = {a.id for a in active}
        # Attempts given up on while it was silent may already run elsewhere: fence them.
        reply.fenced_attempts = [a for a in running if a not in active_ids]
        unreported_before = time.time() - self.heartbeat_timeout
        for attempt in active:
            if (
                attempt.state == "running"
                and attempt.id not in reported
                and (attempt.started_at or attempt.created_at) < unreported_before
            ):
                self.ends.lose_attempt(
                    attempt, f"worker {worker_id} does not report attempt running"
                )
        return reply

    def leave(self, worker_id: str, caller: Principal | None = None) -> WorkerRecord:
        """The worker said, as it began to stop, that it goes away: nothing more is placed on
        it from now (a job submitted meanwhile waits for another worker rather than being
        handed to one that will not run it). Its running attempts end as its stop ends them;
        once it falls silent the sweep finds it lost as any other."""
        WorkerAccess.check_worker(caller, worker_id)
        if self.store.move_worker(worker_id, "leaving"):
            self.placement.worker_changed(worker_id)
            self.changes.notify()
        return self.store.get_worker(worker_id)

    def _note_degraded(self, worker_id: str, reason: str | None) -> None:
        """A worker that says it takes no job (its disk is full) is placed nothing until it
        says it takes them again; read from the store once per worker per control plane life,
        then only on a change."""
        known = self._degraded.get(worker_id, ...)
        if known is ...:
            try:
                known = self.store.get_worker(worker_id).capabilities.get("degraded")
            except NotFoundError:
                return  # no such worker: nothing to note, as its heartbeat itself is
        if known != reason:
            self.store.set_worker_degraded(worker_id, reason)
            self.placement.worker_changed(worker_id)
        self._degraded[worker_id] = reason

    def pending_signals(self, worker_id: str) -> HeartbeatReply:
        return HeartbeatReply(cancel_attempts=self.store.cancelled_attempt_ids(worker_id))

    def sweep_lost_workers(self) -> None:
        # Silence while this control plane was down is not held against a worker: its
        # heartbeats had nowhere to go. It gets a full timeout from our start. Nor is silence
        # while this control plane was stalled (frozen, or too busy to take the heartbeats
        # waiting for it): only time it could have heard the worker counts (progress.py).
        now = time.time()
        exempt = self.silence_excused()
        for worker in self.store.list_workers():
            silent_since = max(worker.last_heartbeat, self.clock.started)
            if (
                worker.kind != "local"
                and worker.state in ("ready", "leaving")
                and self.progress.silence(silent_since, now) > self.heartbeat_timeout
                and worker.id not in exempt
            ):
                self.store.move_worker(worker.id, "lost")
                self.placement.worker_changed(worker.id)
                for attempt in self.store.active_attempts(worker.id):
                    self.ends.lose_attempt(attempt, f"worker {worker.name} stopped heartbeating")

    def end_worker_attempts(self, worker_id: str, reason: str, why: str) -> None:
        """The worker's machine is gone (reclaimed, unreachable): its attempts end with
        ``reason``, and their jobs retry if their retry_on says so."""
        self.ends.end_on_worker(worker_id, reason, why)
        self.store.move_worker(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.dispatcher.dispatch()

    def retire_worker(self, worker_id: str) -> None:
        """Its machine is being handed back."""
        self.store.move_worker(worker_id, "gone")
        self.placement.worker_changed(worker_id)
        self.changes.notify()

    def worker_credential(self, name: str) -> tuple[str, str]:
        """A new join token for a machine's worker, and the hash the store keeps of it."""
        return self.tokens.worker_credential(name)

    def credit_worker_silence(self, worker_id: str) -> None:
        """The worker could not reach us because we were down: its silence starts now."""
        self.store.credit_worker_silence(worker_id)

    def worker_views(self, *, only_ready: bool = False) -> list[Any]:
        from gpulayer.control.dispatch import worker_snapshots

        return worker_snapshots(self.store, only_ready=only_ready)


def _check_registration(registration: Registration, caller: Principal) -> None:
    if registration.kind == "local":
        raise ForbiddenError("kind: local is the control plane's own worker")
    if caller.kind == "worker":
        if registration.worker_id != caller.worker_id:
            raise ForbiddenError("a worker credential re-registers only its own worker")
    elif registration.worker_id is not None and caller.kind != "admin":
        raise ForbiddenError("worker_id: a join token registers new workers only")

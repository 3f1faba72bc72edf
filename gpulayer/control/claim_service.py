"""A worker's claims: the assignments made for its current life, started as they are handed
over, with the cancels it has not been told of yet. Every claim comes here through
claim_poll (the HTTP route, the local link, tests alike)."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpulayer.control import gangs
from gpulayer.control.auth import Principal
from gpulayer.control.bundle_store import BundleStore
from gpulayer.control.gang_service import GangService
from gpulayer.control.job_states import JobStates
from gpulayer.control.paths import HomeLayout
from gpulayer.control.secret_vault import SecretVault
from gpulayer.control.store import AttemptRecord, JobRecord, Store
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.control.worker_access import WorkerAccess
from gpulayer.control.worker_news import WorkerNews
from gpulayer.protocol.messages import Assignment, ClaimReply


def bundle_digest_of(job: JobRecord, layout: HomeLayout) -> str | None:
    if job.bundle_digest is not None or not job.has_bundle:
        return job.bundle_digest
    return BundleStore.digest_of(layout.job_dir(job.id))  # stored before schema 10


class ClaimService:
    def __init__(
        self,
        store: Store,
        states: JobStates,
        gangs: GangService,
        news: WorkerNews,
        layout: HomeLayout,
        environments: SubmitEnvironments,
        secrets: SecretVault,
    ) -> None:
        self.store = store
        self.environments = environments
        self.secrets = secrets
        self.states = states
        self.gangs = gangs
        self.news = news
        self.layout = layout
        # Per worker, its life's epoch and the cancels its claim replies already carried.
        self._told_cancels: dict[str, tuple[int, set[int]]] = {}
        self._told_lock = threading.Lock()
        # Per worker, the life a claim last started for and its kind then: a new life (a new
        # registration, the only way a worker's kind can change) comes with a new epoch.
        self._kinds: dict[str, tuple[int, str]] = {}
        # Per worker, its life's epoch and its news count when its last look began. News
        # (an assignment, a cancel) is told after it is stored, so while the count stays the
        # same a look would find nothing that look did not: the worker that claims again at
        # once after taking work (at its capacity, mostly) is not looked up for nothing.
        self._looked: dict[str, tuple[int, int]] = {}

    def claim_start(self, worker_id: str, caller: Principal | None) -> tuple[int, int]:
        """A claim poll's start: the worker's news count it waits past, and its life's epoch.

        A poll belongs to the worker's life that sent it: once the worker registered again
        (restarted), a poll still open from before must not take the new life's work."""
        since = self.news.count(worker_id)
        WorkerAccess.check_worker(caller, worker_id)
        epoch, kind = self.store.worker_life(worker_id)
        self._kinds[worker_id] = (epoch, kind)
        return since, epoch

    def claim_now(
        self, worker_id: str, caller: Principal | None, epoch: int, *, with_cancels: bool
    ) -> ClaimReply:
        """One look for what waits for this worker's life ``epoch``, without waiting: its
        attempts and their jobs' cancels read in one query."""
        WorkerAccess.check_worker(caller, worker_id)
        news = self.news.count(worker_id)
        if self._looked.get(worker_id) == (epoch, news):
            return ClaimReply()
        active, cancelled = self.store.active_attempts_and_cancels(worker_id)
        reply = ClaimReply(assignments=self._claim(worker_id, active, epoch))
        if with_cancels:
            reply.cancel_attempts = self._untold_cancels(worker_id, epoch, cancelled)
            # Only a look that told the cancels too stands for the next: one without them
            # leaves them to the next look.
            self._looked[worker_id] = (epoch, news)
        return reply

    def _untold_cancels(self, worker_id: str, epoch: int, pending: list[int]) -> list[int]:
        """Of ``pending`` (this worker's cancelled attempts), those its life ``epoch`` has not
        had in a claim reply; noted as told. Memory only: after a restart each is told once
        more, which a worker takes as the same cancel."""
        with self._told_lock:
            told_epoch, told = self._told_cancels.get(worker_id, (epoch, set()))
            if told_epoch != epoch:
                told = set()
            untold = [a for a in pending if a not in told]
            # Only what is still pending is kept: the memory stays as small as the cancels.
            self._told_cancels[worker_id] = (epoch, set(pending))
        return untold

    def _claim(self, worker_id: str, active: list[AttemptRecord], epoch: int) -> list[Assignment]:
        """Of the worker's ``active`` attempts, those assigned to its life ``epoch`` that it
        has not started yet, started now."""
        waiting = [
            attempt
            for attempt in active
            if attempt.state == "assigned" and attempt.worker_epoch in (None, epoch)
        ]
        if not waiting:
            return []
        moved = self.states.start_attempts([a.id for a in waiting], started_at=time.time())
        started = [attempt for attempt in waiting if attempt.id in moved]
        if not started:
            return []
        on_this_machine = self._kind(worker_id, epoch) == "local"
        jobs = {job.id: job for job in self.store.get_jobs([a.job_id for a in started])}
        claimed = []
        for attempt in started:
            job = jobs.get(attempt.job_id)
            if job is None:
                continue  # deleted meanwhile: nothing is left to run
            self.gangs.note_size(job)  # its logs and outcome need not read the job again
            claimed.append(
                Assignment(
                    attempt_id=attempt.id,
                    job_id=job.id,
                    attempt=attempt.number,
                    spec=job.spec,
                    gpu_indices=attempt.gpu_indices,
                    **self.source_for(job, on_this_machine=on_this_machine),
                    gang=gangs.gang_node(self.store, job, attempt),
                    secret_values=self._secret_values(job),
                )
            )
        return claimed

    def _secret_values(self, job: JobRecord) -> dict[str, str]:
        """The values the worker reads the job's secrets from, where the control plane holds
        them: the submitting shell's (a cloud job of the local control plane), else the secret
        store's; those it holds neither way the worker reads from its own environment."""
        keys = [s.get("key") or s.get("name") for s in job.spec.get("secrets") or []]
        if not keys:
            return {}
        held = self.environments.secrets_for(job.id)
        missing = [key for key in keys if key and key not in held]
        return {**self.secrets.values(missing), **held} if missing else held

    def _kind(self, worker_id: str, epoch: int) -> str:
        known = self._kinds.get(worker_id)
        if known is not None and known[0] == epoch:
            return known[1]
        return self.store.get_worker(worker_id).kind

    def source_for(self, job: JobRecord, *, on_this_machine: bool) -> dict[str, Any]:
        """Where an assignment's source comes from: this machine's own worker runs in the
        submit folder itself; any other worker gets the bundle taken at submit (by digest,
        which workers cache), never a path of ours."""
        if on_this_machine and job.working_dir:
            return {"working_dir": job.working_dir, "has_bundle": False, "bundle_digest": None}
        return {
            "working_dir": None,
            "has_bundle": job.has_bundle,
            "bundle_digest": bundle_digest_of(job, self.layout),
        }

"""Jobs once stored: read, followed, cancelled, and deleted with their files once finished."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpulayer.control import gangs
from gpulayer.control.bundle_store import BundleStore
from gpulayer.control.changes import ChangeFeed
from gpulayer.control.claim_service import bundle_digest_of
from gpulayer.control.job_refs import resolve_job_id
from gpulayer.control.job_states import ACTIVE_ATTEMPT_STATES, JobStates
from gpulayer.control.paths import HomeLayout
from gpulayer.control.store import TERMINAL_STATES, AttemptRecord, JobRecord, LogLine, Store
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.errors import NotFoundError, UsageError
from gpulayer.spec import JobSpec


class JobService:
    def __init__(
        self,
        store: Store,
        states: JobStates,
        *,
        layout: HomeLayout,
        bundles: BundleStore,
        environments: SubmitEnvironments,
        changes: ChangeFeed,
        worker_views: Callable[[], list[Any]],
    ) -> None:
        self.store = store
        self.states = states
        self.layout = layout
        self.bundles = bundles
        self.environments = environments
        self.changes = changes
        self.worker_views = worker_views

    def resolve_job_id(self, job_ref: str) -> str:
        return resolve_job_id(self.store, job_ref)

    def get_job(self, job_ref: str) -> JobRecord:
        return self.store.get_job(self.resolve_job_id(job_ref))

    def list_jobs(
        self,
        *,
        states: Sequence[str] | None = None,
        labels: dict[str, str] | None = None,
        limit: int = 50,
    ) -> list[JobRecord]:
        """Newest first; with labels, only jobs holding every one of those pairs."""
        if not labels:
            return self.store.list_jobs(states=states, limit=limit)
        jobs, _ = self.store.jobs_page(states=states, labels=labels, limit=limit)
        # The store narrows by the labels' JSON text; the exact pairs are checked here.
        return [j for j in jobs if all(j.labels.get(k) == v for k, v in labels.items())]

    def attempts(self, job_id: str) -> list[AttemptRecord]:
        return self.store.attempts_for(job_id)

    def is_terminal(self, job_id: str) -> bool:
        return self.store.get_job(job_id).state in TERMINAL_STATES

    def live_jobs(self) -> int:
        return self.store.count_live_jobs()

    def cancel(self, job_ref: str) -> JobRecord:
        job = self.get_job(job_ref)
        if job.terminal:
            return job
        if self.states.move_job(
            job.id,
            "cancelled",
            only_from=["queued", "provisioning"],
            reason="cancelled",
            message="cancelled before it started",
        ):
            self.changes.log_system(job.id, job.attempts, ["cancelled"])
            self.environments.forget(job.id)
        else:
            self.store.update_job(job.id, cancel_requested=True)
            self.changes.wake_workers(
                a.worker_id
                for a in self.store.attempts_for(job.id)
                if a.state in ACTIVE_ATTEMPT_STATES
            )
        self.changes.notify()
        return self.store.get_job(job.id)

    def array_jobs(self, array_id: str) -> list[JobRecord]:
        """A job array's jobs (submit --array), by index."""
        from gpulayer.control.arrays import ARRAY_LABEL, INDEX_LABEL

        jobs = self.store.jobs_with_label(ARRAY_LABEL, array_id)
        if not jobs:
            raise NotFoundError(f"array {array_id!r} not found")
        return sorted(jobs, key=lambda j: int(j.labels.get(INDEX_LABEL, "0") or 0))

    def cancel_array(self, array_id: str) -> list[JobRecord]:
        for job in self.array_jobs(array_id):
            if not job.terminal:
                self.cancel(job.id)
        return self.array_jobs(array_id)

    def read_logs(
        self, job_ref: str, *, after: int = 0, wait: float = 0.0, node: int | None = None
    ) -> tuple[list[LogLine], JobRecord]:
        """Lines after the given id; with wait, block up to that long for news."""
        job_id = self.resolve_job_id(job_ref)
        if node is not None:
            owner = self.store.get_job(job_id)
            gangs.check_node_rank(owner, node)
            if gangs.gang_size(owner) == 1:
                node = None  # a single-node job's lines carry no rank; node 0 is all of them
        deadline = time.monotonic() + wait
        while True:
            since = self.changes.version
            # Woken by every change anywhere (each item of a map ending): only the state is
            # read to decide, the whole job once this answers.
            state = self.store.job_state(job_id)
            lines = self.store.read_logs(job_id, after=after, node=node)
            remaining = deadline - time.monotonic()
            if lines or state in TERMINAL_STATES or remaining <= 0:
                job = self.store.get_job(job_id)
                return lines, job
            self.changes.wait_for_job_change(job_id, since, min(remaining, 1.0))

    def artifacts(self, job_ref: str) -> list[dict[str, Any]]:
        return self.store.list_artifacts(self.resolve_job_id(job_ref))

    def artifact_path(self, job_ref: str, path: str) -> Path:
        job_id = self.resolve_job_id(job_ref)
        root = self.layout.outputs_dir(job_id).resolve()
        target = (root / path).resolve()
        if not target.is_relative_to(root) or not target.exists():
            raise NotFoundError(f"job {job_id} has no output {path!r}")
        return target

    def bundle_path(self, job_id: str) -> Path:
        """Where the job's source bundle is (NotFoundError when it has none)."""
        job = self.store.get_job(job_id)
        path = (
            self.bundles.path(job.bundle_digest)
            if job.bundle_digest is not None
            else self.layout.bundle_file(job_id)
        )
        if not job.has_bundle or not path.is_file():
            raise NotFoundError(f"job {job_id} has no source bundle")
        return path

    def release_unused_bundle(self, digest: str) -> None:
        """Drop a kept bundle no job names (holding the bundle store's lock)."""
        if not self.store.bundle_in_use(digest):
            self.bundles.release(digest)

    def delete_jobs(self, job_refs: Sequence[str], *, dry_run: bool = False) -> list[JobRecord]:
        """Remove finished jobs: their rows (logs, attempts, artifacts, ledger) and files
        (outputs, bundle, attempt folders). All or nothing: a live job among them refuses
        the whole call before anything is removed."""
        jobs = [self.get_job(ref) for ref in dict.fromkeys(job_refs)]
        live = [j for j in jobs if not j.terminal]
        if live:
            listed = ", ".join(f"{j.id} is {j.state}" for j in live)
            raise UsageError(f"JOB: {listed}; cancel it first (nothing was deleted)")
        if dry_run:
            return jobs
        return [job for job in jobs if self._delete_finished(job)]

    def prune(self, *, older_than_seconds: float, dry_run: bool = False) -> list[JobRecord]:
        """Remove finished jobs that ended more than ``older_than_seconds`` ago."""
        ids = self.store.finished_job_ids(ended_before=time.time() - older_than_seconds)
        jobs = [self.store.get_job(job_id) for job_id in ids]
        if dry_run:
            return jobs
        return [job for job in jobs if self._delete_finished(job)]

    def _delete_finished(self, job: JobRecord) -> bool:
        if not self.store.delete_finished_job(job.id):
            return False  # a live cloud instance still bills to it: the reaper comes first
        digest = bundle_digest_of(job, self.layout)
        # Rows first: a crash between the two leaves stray files, never rows without them.
        shutil.rmtree(self.layout.job_dir(job.id), ignore_errors=True)
        if digest is not None:
            with self.bundles.lock:
                self.release_unused_bundle(digest)
        self.environments.forget(job.id)
        return True

    def waiting_reasons(self, job: JobRecord) -> list[str]:
        """Why a queued job has not started: per worker of its target, what does not fit now."""
        from gpulayer.control.targets import TARGET_WORKER_KIND
        from gpulayer.scheduler import WorkerIndex, fitting_now, node_count, reasons_now

        try:
            spec = JobSpec.model_validate(job.spec)
        except ValueError:
            return ["its stored spec does not validate; delete the job and submit it again"]
        if job.target == "cloud":
            return [job.message or "waiting for a machine to be provisioned"]
        views = [v for v in self.worker_views() if v.kind == TARGET_WORKER_KIND.get(job.target)]
        if not views:
            return [f"no {job.target} worker is registered"]
        reasons: list[str] = []
        nodes = node_count(spec)
        if nodes > 1:
            fit = fitting_now(spec, WorkerIndex(v.snapshot for v in views))
            reasons.append(f"{fit} of {nodes} nodes fit now")
        for view in views:
            found = reasons_now(spec, view.snapshot)
            reasons.extend(f"worker {view.snapshot.name}: {r}" for r in found)
        return (
            reasons
            if len(reasons) > (nodes > 1)
            else [*reasons, "waiting for its turn in the queue"]
        )

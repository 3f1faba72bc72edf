"""The moves the cloud lifecycle makes on jobs and workers: the control plane's side of the
lifecycle's ``JobPort`` (gpulayer.cloud.lifecycle.ports), so the lifecycle sees this and
nothing else of the control plane."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpulayer.control.changes import ChangeFeed
from gpulayer.control.dispatcher import Dispatcher
from gpulayer.control.job_service import JobService
from gpulayer.control.job_states import JobStates
from gpulayer.control.paths import HomeLayout
from gpulayer.control.store import Store
from gpulayer.control.submit_environments import SubmitEnvironments
from gpulayer.control.targets import target_after_cloud
from gpulayer.control.worker_service import WorkerService
from gpulayer.spec import JobSpec


class CloudJobMoves:
    def __init__(
        self,
        store: Store,
        states: JobStates,
        *,
        layout: HomeLayout,
        changes: ChangeFeed,
        dispatcher: Dispatcher,
        jobs: JobService,
        workers: WorkerService,
        environments: SubmitEnvironments,
    ) -> None:
        self.store = store
        self.states = states
        self.layout = layout
        self.changes = changes
        self.dispatcher = dispatcher
        self.jobs = jobs
        self.workers = workers
        self.environments = environments

    # --- what the lifecycle waits on ----------------------------------------------------------

    @property
    def version(self) -> int:
        return self.changes.version

    def on_work(self, listener: Callable[[], None]) -> None:
        self.changes.on_work(listener)

    def on_cloud_work(self, listener: Callable[[], None]) -> None:
        self.changes.on_cloud_work(listener)

    def wait_for_change(self, since: int, timeout: float) -> int:
        return self.changes.wait_for_change(since, timeout)

    def log_system(self, job_id: str, attempt: int, notes: Sequence[str]) -> None:
        self.changes.log_system(job_id, attempt, notes)

    # --- jobs ---------------------------------------------------------------------------------

    def begin_provisioning(self, job_id: str, message: str) -> bool:
        """A machine is being prepared for the job."""
        moved = self.states.move_job(
            job_id, "provisioning", only_from=["queued"], message=message
        ) or self.store.update_job(job_id, expect_states=["provisioning"], message=message)
        self.changes.notify()
        return moved

    def requeue_for_provisioning(self, job_id: str, why: str) -> None:
        if self.states.move_job(job_id, "queued", only_from=["provisioning"]):
            self.changes.log_system(job_id, 0, [f"provisioning starts over: {why}"])

    def wait_for_capacity(self, job_id: str, why: str) -> None:
        """The job stays queued until capacity frees; says why once per change of reason."""
        job = self.store.get_job(job_id)
        moved = self.states.move_job(
            job_id, "queued", only_from=["provisioning"], message=why
        ) or self.store.update_job(job_id, expect_states=["queued"], message=why)
        if moved and job.message != why:
            self.changes.log_system(job_id, 0, [why])

    def hand_to_reserved_worker(self, job_id: str) -> None:
        """The job's machine is ready: queue it for dispatch to its reserved worker. What it
        waited for (capacity, a launch) no longer holds: its message goes."""
        self.states.move_job(job_id, "queued", only_from=["provisioning"], message=None)
        self.dispatcher.dispatch()

    def hand_to_warm_machine(self, job_id: str, note: str) -> None:
        """The job took an idle machine (its reservation is bound to the machine's worker):
        it is dispatched there now, with no provisioning; what it waited for no longer holds."""
        self.states.move_job(
            job_id, "queued", only_from=["provisioning"], message=None
        ) or self.store.update_job(job_id, expect_states=["queued"], message=None)
        self.changes.log_system(job_id, 0, [note])
        self.dispatcher.dispatch()

    def move_to_target(self, job_id: str, target: str, why: str | None = None) -> None:
        """The cloud cannot run it: the next fallback target in its chain may. ``why`` replaces
        the job's message (the cloud's last word, "waiting for capacity", no longer holds)."""
        values: dict[str, Any] = {"target": target}
        if why is not None:
            values["message"] = why
        self.states.move_job(
            job_id, "queued", only_from=["provisioning"], **values
        ) or self.store.update_job(job_id, expect_states=["queued"], **values)
        self.dispatcher.dispatch()

    def fail_unplaced(self, job_id: str, reason: str, message: str) -> None:
        """A job that never ran ends: nothing can place it."""
        self.states.move_job(
            job_id, "failed", only_from=["queued", "provisioning"], reason=reason, message=message
        )
        self.changes.notify()

    def next_target(self, spec: JobSpec) -> tuple[str | None, list[str]]:
        """The target after cloud in the job's chain that can take it now, else None and,
        per fallback target, why not."""
        return target_after_cloud(spec, self.workers.worker_views())

    def cloud_environment(self, job_id: str) -> dict[str, str] | None:
        return self.environments.cloud_environment(job_id)

    def forget_cloud_environments(self, keep: set[str]) -> None:
        self.environments.forget_cloud_environments(keep, self.jobs.is_terminal)

    # --- workers ------------------------------------------------------------------------------

    def end_worker_attempts(self, worker_id: str, reason: str, why: str) -> None:
        self.workers.end_worker_attempts(worker_id, reason, why)

    def retire_worker(self, worker_id: str) -> None:
        self.workers.retire_worker(worker_id)

    def credit_worker_silence(self, worker_id: str) -> None:
        self.workers.credit_worker_silence(worker_id)

    def worker_credential(self, name: str) -> tuple[str, str]:
        return self.workers.worker_credential(name)

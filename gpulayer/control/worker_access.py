"""What a caller over the worker API may touch: its own worker, its own current attempts,
the bundles of the jobs it runs and the outputs its jobs name as inputs. ``caller`` None is
the control plane's own in-process worker; an admin token may act for any worker."""

from __future__ import annotations

from gpulayer.control.auth import Principal
from gpulayer.control.job_refs import resolve_job_id
from gpulayer.control.job_states import ACTIVE_ATTEMPT_STATES
from gpulayer.control.store import AttemptRecord, Store
from gpulayer.errors import ForbiddenError, NotFoundError, StaleAttemptError


class WorkerAccess:
    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def check_worker(caller: Principal | None, worker_id: str) -> None:
        if caller is None or caller.kind == "admin":
            return
        if caller.kind != "worker":
            raise ForbiddenError("a join token only registers workers")
        if caller.worker_id != worker_id:
            raise ForbiddenError(f"this credential is not worker {worker_id}'s")

    def own_attempt(self, attempt_id: int, caller: Principal | None) -> AttemptRecord:
        """The attempt, if it is the caller's and still its job's current one.

        ForbiddenError for another worker's attempt; StaleAttemptError once it was given up
        on (lost, fenced, finished) or its worker has registered again since."""
        return self.owned(*self.store.attempt_and_epoch(attempt_id), caller)

    @staticmethod
    def owned(
        attempt: AttemptRecord, current_epoch: int | None, caller: Principal | None
    ) -> AttemptRecord:
        """The checks of own_attempt on an attempt and its worker's epoch as read."""
        attempt_id = attempt.id
        if (
            caller is not None
            and caller.kind != "admin"
            and (caller.kind != "worker" or attempt.worker_id != caller.worker_id)
        ):
            raise ForbiddenError(f"attempt {attempt_id} is not this worker's")
        if attempt.state not in ACTIVE_ATTEMPT_STATES:
            raise StaleAttemptError(f"attempt {attempt_id} is no longer current ({attempt.state})")
        if attempt.worker_id is not None and attempt.worker_epoch is not None:
            if current_epoch is None:
                raise NotFoundError(f"worker {attempt.worker_id!r} not found")
            if current_epoch != attempt.worker_epoch:
                raise StaleAttemptError(
                    f"attempt {attempt_id} belongs to an earlier life of its worker"
                )
        return attempt

    def check_job_access(self, job_id: str, caller: Principal | None) -> None:
        """A worker reads a job's bundle only while it runs an attempt of that job."""
        if caller is None or caller.kind == "admin":
            return
        if caller.kind == "worker" and any(
            a.job_id == job_id for a in self.store.active_attempts(caller.worker_id)
        ):
            return
        raise ForbiddenError(f"job {job_id} is not one this worker runs")

    def check_artifact_access(self, job_id: str, caller: Principal | None) -> None:
        """A worker reads another job's outputs only as an input of an attempt it runs."""
        if caller is None or caller.kind == "admin":
            return
        if caller.kind == "worker":
            for attempt in self.store.active_attempts(caller.worker_id):
                spec = self.store.get_job(attempt.job_id).spec
                for item in spec.get("inputs", []) or []:
                    # InputRef names it "artifact"; "source" is what older specs said.
                    source = (
                        str(item.get("artifact") or item.get("source") or "")
                        if isinstance(item, dict)
                        else ""
                    )
                    if self._names_job(source, job_id):
                        return
        raise ForbiddenError(f"job {job_id}'s outputs are not an input of this worker's jobs")

    def _names_job(self, source: str, job_id: str) -> bool:
        from gpulayer.protocol.messages import JOB_ARTIFACT_PREFIX, split_job_reference

        if not source.startswith(JOB_ARTIFACT_PREFIX):
            return False
        try:
            return resolve_job_id(self.store, split_job_reference(source)[0]) == job_id
        except Exception:
            return False

"""What changed, told to whoever waits: followers of logs and job states (a version they wait
past), the in-process listeners (the local worker, the cloud lifecycle), and the claim polls
of the workers given work (only theirs)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from gpulayer.control.store import Store
from gpulayer.control.worker_news import WorkerNews

_JOBS_KEPT = 4096
"""Jobs whose last change is kept apart at most; past it the lot counts as one of any job."""


class ChangeFeed:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.news = WorkerNews()
        self._changed = threading.Condition()
        self._version = 0
        self._any_at = 0
        """The version of the last change that may concern any job."""
        self._job_at: dict[str, int] = {}
        """Per job, the version of the last change said to concern only some jobs, it among
        them (what a follower of one job waits for: see wait_for_job_change)."""
        self._listeners: list[Callable[[], None]] = []
        self._cloud_listeners: list[Callable[[], None]] = []

    def on_work(self, listener: Callable[[], None]) -> None:
        """Call listener whenever new assignments or cancellations may be waiting."""
        self._listeners.append(listener)

    def on_cloud_work(self, listener: Callable[[], None]) -> None:
        """Call listener whenever a job that a cloud may run was stored."""
        self._cloud_listeners.append(listener)

    def cloud_work_stored(self) -> None:
        for listener in self._cloud_listeners:
            listener()

    def notify(self, job_ids: Iterable[str] | None = None) -> None:
        """Something changed; ``job_ids``: it concerns only these jobs (None: any job)."""
        with self._changed:
            self._version += 1
            if job_ids is None:
                self._any_at = self._version
            else:
                for job_id in job_ids:
                    self._job_at[job_id] = self._version
                if len(self._job_at) > _JOBS_KEPT:
                    self._job_at.clear()  # told as a change of any job: every follower looks
                    self._any_at = self._version
            self._changed.notify_all()
        for listener in self._listeners:
            listener()

    def wait_for_change(self, since: int, timeout: float) -> int:
        with self._changed:
            self._changed.wait_for(lambda: self._version != since, timeout=timeout)
            return self._version

    def wait_for_job_change(self, job_id: str, since: int, timeout: float) -> int:
        """wait_for_change for a follower of one job: a change said to concern only other
        jobs (each item of a map placed or ended) does not wake it."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._any_at > since or self._job_at.get(job_id, 0) > since,
                timeout=timeout,
            )
            return self._version

    @property
    def version(self) -> int:
        return self._version

    def wake_workers(self, worker_ids: Iterable[str | None]) -> None:
        """Wake these workers' claim long-polls (and only theirs)."""
        self.news.wake(worker_ids)

    def wake_unclaimed(self) -> None:
        """Wake every worker with an assignment it has not claimed: another control plane
        sharing the store may have made it, and only this one holds the worker's long-poll."""
        self.wake_workers(self.store.workers_with_assigned())

    def log_system(self, job_id: str, attempt: int, notes: Sequence[str]) -> None:
        """gpulayer's own notes in a job's logs (streamed to whoever follows it)."""
        self.store.append_logs(job_id, attempt, [("system", note) for note in notes])
        self.notify()

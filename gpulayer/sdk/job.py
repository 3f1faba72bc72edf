"""The Job handle the SDK returns: status, wait, result, logs, cancel."""

from __future__ import annotations

import time
from typing import Any

from gpulayer.errors import GpulayerError
from gpulayer.protocol.client import ControlClient

TERMINAL_STATES = ("succeeded", "failed", "cancelled")


class JobFailed(GpulayerError):
    """The job ended without succeeding; `reason` says why (exit_code, timeout, cancelled, ...)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.job_id: str = job["id"]
        self.state: str = job["state"]
        self.reason: str | None = job.get("reason")
        self.job_exit_code: int | None = job.get("exit_code")
        detail = f": {job['message']}" if job.get("message") else ""
        super().__init__(f"job {self.job_id} {self.state} ({self.reason}){detail}")


class JobTimeout(GpulayerError):
    """wait() or result() ran out of time; the job itself goes on. ``state`` is the job's state
    when the wait gave up (queued, provisioning or running)."""

    def __init__(self, job_id: str, state: str, timeout: float | None) -> None:
        self.job_id = job_id
        self.state = state
        super().__init__(f"job {job_id} still {state} after {timeout} s")


class Job:
    def __init__(self, client: ControlClient, job_id: str) -> None:
        self._client = client
        self.id = job_id

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    @property
    def client(self) -> ControlClient:
        """The control plane this job was submitted to."""
        return self._client

    def status(self) -> dict[str, Any]:
        """The job as `gpulayer status --json` shows it."""
        return self._client.job(self.id)

    @property
    def state(self) -> str:
        return str(self.status()["state"])

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the job ends (or timeout seconds pass: JobTimeout). Returns its status."""
        deadline = None if timeout is None else time.monotonic() + timeout
        after = 0
        state = "queued"
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise JobTimeout(self.id, state, timeout)
            wait = 10.0 if remaining is None else max(0.0, min(10.0, remaining))
            page = self._client.logs(self.id, after=after, wait=wait)
            if page["lines"]:
                after = page["lines"][-1]["id"]
            state = str(page["job"]["state"])
            if state in TERMINAL_STATES:
                return self.status()

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then return the job's result, or raise JobFailed carrying the reason."""
        job = self.wait(timeout)
        if job["state"] != "succeeded":
            raise JobFailed(job)
        return job.get("result")

    def logs(self) -> str:
        """Everything the job printed so far, stdout and stderr interleaved as they came."""
        parts = []
        after = 0
        while True:
            page = self._client.logs(self.id, after=after)
            if not page["lines"]:
                break
            for line in page["lines"]:
                if line["stream"] in ("stdout", "stderr"):
                    text = line["text"]
                    parts.append(text if text.endswith("\n") else text + "\n")
            after = page["lines"][-1]["id"]
        return "".join(parts)

    def artifacts(self) -> list[dict[str, Any]]:
        """The job's outputs: path, size and sha256 of each file."""
        return self._client.artifacts(self.id)

    def cancel(self) -> dict[str, Any]:
        return self._client.cancel(self.id)

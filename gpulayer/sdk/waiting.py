"""Waiting for many jobs at once (a map's items): their views fetched in one request per
round, and between rounds one long poll on the last job still running (queued last, it
mostly ends last), so that a thousand items cost a few requests rather than two each."""

from __future__ import annotations

import time
from typing import Any

from gpulayer.protocol.client import ControlClient
from gpulayer.sdk.job import TERMINAL_STATES, JobTimeout

# A log cursor past every line: the long poll then returns when the job ends (or at its wait).
_PAST_EVERY_LINE = 2**31 - 1
_POLL_SECONDS = 5.0


def wait_all(
    client: ControlClient, job_ids: list[str], timeout: float | None = None
) -> list[dict[str, Any]]:
    """Each job's view once every one has ended, in the order given; JobTimeout names the
    first job still running when ``timeout`` seconds have passed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    ended: dict[str, dict[str, Any]] = {}
    pending = list(dict.fromkeys(job_ids))
    while pending:
        views: list[dict[str, Any]] = client.request("POST", "/v1/jobs/views", {"jobs": pending})
        for view in views:
            if view["state"] in TERMINAL_STATES:
                ended[view["id"]] = view
        still = [job_id for job_id in pending if job_id not in ended]
        if not still:
            break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise JobTimeout(still[0], _state_of(client, still[0]), timeout)
        wait = _POLL_SECONDS if left is None else min(_POLL_SECONDS, left)
        client.logs(still[-1], after=_PAST_EVERY_LINE, wait=wait)
        pending = still
    return [ended[job_id] for job_id in job_ids]


def _state_of(client: ControlClient, job_id: str) -> str:
    return str(client.job(job_id)["state"])

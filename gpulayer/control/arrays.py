"""Job arrays on the control plane's side: their members are the jobs labelled with the
array's id, and a ``gpulayer.array.limit`` label caps how many of them run at once.

The server makes an array whole from one request (a spec, its indices and limit): it picks
the id and writes the labels, so an array id names the jobs of the request that made it and
no other request can add jobs to it or hold its jobs back (reserved_labels.py refuses
``gpulayer.*`` labels a client sends)."""

from __future__ import annotations

import copy
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

ARRAY_LABEL = "gpulayer.array"
INDEX_LABEL = "gpulayer.array.index"
LIMIT_LABEL = "gpulayer.array.limit"
SIZE_LABEL = "gpulayer.array.size"
"""How many jobs the array was made with: the cloud lifecycle plans them together once all wait."""
ARRAY_ID = re.compile(r"a-[0-9a-f]{10}")


def new_array_id() -> str:
    return "a-" + secrets.token_hex(5)


def array_members(
    data: dict[str, Any], indices: Sequence[int], limit: int | None, array_id: str
) -> list[dict[str, Any]]:
    """The spec data of each of the array's jobs, by index, labelled as its members."""
    jobs = []
    for index in indices:
        job = copy.deepcopy(data)
        labels = job.get("labels")
        job["labels"] = {
            **(labels if isinstance(labels, dict) else {}),
            ARRAY_LABEL: array_id,
            INDEX_LABEL: str(index),
            SIZE_LABEL: str(len(indices)),
        }
        if limit is not None:
            job["labels"][LIMIT_LABEL] = str(limit)
        jobs.append(job)
    return jobs


def array_limit(labels: Mapping[str, str]) -> tuple[str, int] | None:
    """(array id, its limit) for a job of an array with a parallelism limit."""
    array_id = labels.get(ARRAY_LABEL)
    limit = labels.get(LIMIT_LABEL)
    if not array_id or not limit or not limit.isdigit():
        return None
    return array_id, int(limit)


def held_back(
    queued: Iterable[tuple[str, Mapping[str, str]]],
    running_of: Callable[[str], int],
) -> set[str]:
    """Ids of queued jobs (id, labels), FIFO, that their array's limit keeps from starting
    now: those past the room the limit leaves, after the array's running jobs."""
    held: set[str] = set()
    room: dict[str, int] = {}
    for job_id, labels in queued:
        limited = array_limit(labels)
        if limited is None:
            continue
        array_id, limit = limited
        if array_id not in room:
            room[array_id] = limit - running_of(array_id)
        if room[array_id] > 0:
            room[array_id] -= 1
        else:
            held.add(job_id)
    return held

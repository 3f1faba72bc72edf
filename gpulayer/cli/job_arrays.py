"""`gpulayer submit --array 0-99%10`: one job per index, asked for in one request, as Slurm's
job arrays are. The control plane makes the jobs, picks the array's id and labels each job
with it and its index (``gpulayer.array``, ``gpulayer.array.index``, and
``gpulayer.array.limit`` when a parallelism limit is given, which it holds when it places
them); the worker sets $GPULAYER_ARRAY_INDEX from the index. The id (``a-...``) works where a
job id does in status, cancel and logs, and ``ls --array ID`` lists its jobs."""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpulayer.errors import UsageError

if TYPE_CHECKING:
    from gpulayer.sdk.connection import Connection

ARRAY_LABEL = "gpulayer.array"
INDEX_LABEL = "gpulayer.array.index"
MAX_TASKS = 10_000
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_ARRAY_ID = re.compile(r"a-[0-9a-f]{10}")


@dataclass(frozen=True)
class ArrayTasks:
    indices: tuple[int, ...]
    limit: int | None


def is_array_id(ref: str) -> bool:
    return _ARRAY_ID.fullmatch(ref) is not None


def parse_array(text: str) -> ArrayTasks:
    """``0-99``, ``1,3,5-7``, each with an optional ``%K`` (at most K running at once)."""
    body, sep, limit_text = text.strip().partition("%")
    limit = None
    if sep:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise UsageError(f"--array: %{limit_text} is not a limit of 1 or more")
        limit = int(limit_text)
    indices: list[int] = []
    for part in body.split(","):
        found = _RANGE.fullmatch(part.strip())
        if found is None:
            raise UsageError(f"--array: {part!r} is not an index or a range like 0-99")
        first = int(found.group(1))
        last = int(found.group(2)) if found.group(2) is not None else first
        if last < first:
            raise UsageError(f"--array: {part!r} ends before it starts")
        if len(indices) + last - first + 1 > MAX_TASKS:
            raise UsageError(f"--array: at most {MAX_TASKS} jobs in one array")
        indices.extend(range(first, last + 1))
    if len(set(indices)) != len(indices):
        raise UsageError("--array: an index is given twice")
    return ArrayTasks(tuple(indices), limit)


def array_request(data: dict[str, Any], tasks: ArrayTasks) -> dict[str, Any]:
    """What a submit of the array asks for: the spec, once, with its indices and limit."""
    return {"spec": data, "array": {"indices": list(tasks.indices), "limit": tasks.limit}}


def submit_array(
    connection: Connection, data: dict[str, Any], tasks: ArrayTasks, *, detach: bool
) -> int:
    from gpulayer.sdk.submission import source_fields

    warnings: list[str] = []
    body = {**array_request(data, tasks), **source_fields(connection, data, warnings)}
    if connection.embedded:
        body["client_env"] = dict(os.environ)
    views: list[dict[str, Any]] = connection.client.request("POST", "/v1/jobs", body, timeout=600)
    for warning in warnings:
        sys.stderr.write(f"warning: {warning}\n")
    array_id = str(views[0]["labels"][ARRAY_LABEL])
    print(array_id, flush=True)
    if detach:
        return 0
    while True:
        states = [job["state"] for job in array_members(connection, array_id)]
        if all(state in ("succeeded", "failed", "cancelled") for state in states):
            break
        time.sleep(1.0)
    counts = {state: states.count(state) for state in sorted(set(states))}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    sys.stderr.write(f"gpulayer: array {array_id}: {summary}\n")
    return 0 if counts.get("succeeded", 0) == len(states) else 1


def array_members(connection: Connection, array_id: str) -> list[dict[str, Any]]:
    """The array's jobs, by index."""
    found: list[dict[str, Any]] = connection.client.request("GET", f"/v1/arrays/{array_id}")
    return found


def counts_of(jobs: list[dict[str, Any]]) -> dict[str, int]:
    states = [str(job["state"]) for job in jobs]
    return {state: states.count(state) for state in sorted(set(states))}


def show_status(connection: Connection, array_id: str, *, as_json: bool) -> None:
    from gpulayer.cli.output import print_json

    jobs = array_members(connection, array_id)
    counts = counts_of(jobs)
    if as_json:
        print_json({"id": array_id, "counts": counts, "jobs": jobs})
        return
    from gpulayer.cli.render import jobs_table

    jobs_table(jobs)
    print(f"array {array_id}: " + ", ".join(f"{n} {state}" for state, n in counts.items()))


def cancel(connection: Connection, array_id: str, *, as_json: bool) -> None:
    from gpulayer.cli.output import print_json

    jobs: list[dict[str, Any]] = connection.client.request("POST", f"/v1/arrays/{array_id}/cancel")
    if as_json:
        print_json(jobs)
        return
    counts = counts_of(jobs)
    print(f"{array_id}: " + ", ".join(f"{n} {state}" for state, n in counts.items()))


def print_logs(
    connection: Connection, array_id: str, *, follow: bool, timestamps: bool, as_json: bool
) -> None:
    """Each job's output in index order, under one header line per job (on stderr)."""
    from gpulayer.cli.output import print_json_items
    from gpulayer.cli.submit_flow import print_line, say_reconnecting

    client = connection.client
    jobs = array_members(connection, array_id)

    def lines_of(job_id: str) -> Any:
        if follow:
            followed = client.follow_logs(job_id, on_reconnect=say_reconnecting)
            return (item for item in followed if "job" not in item)
        return client.iter_logs(job_id)

    if as_json:
        print_json_items(
            {**line, "job": job["id"], "index": job["labels"].get(INDEX_LABEL)}
            for job in jobs
            for line in lines_of(str(job["id"]))
        )
        return
    for job in jobs:
        index = job["labels"].get(INDEX_LABEL)
        sys.stderr.write(f"==> {array_id}[{index}] {job['id']} ({job['state']}) <==\n")
        for line in lines_of(str(job["id"])):
            print_line(line, timestamps=timestamps)

"""The jobs of one job array that wait for a machine together are launched together, where
their provider can make one array of them (a Slurm job array: one ``sbatch --array``).

Unlike a gang's nodes, an array's tasks are jobs of their own that start and end on their own:
each task is an instance record of its own job, written before the provider call as a gang's
nodes are, and tagged with the request id of the task whose launch step makes the one call
(:data:`ARRAY_LAUNCH_TAG`) and with its task id (its array index). That call creates every
task; each task's own launch step then waits for its task to run, as a lone machine's does.
The pure parts are here: which waiting jobs are planned together, and which task records
wait for their array's call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gpulayer.cloud.offer import Offer
    from gpulayer.cloud.protocol import LaunchRequest

ARRAY_LABEL = "gpulayer.array"
INDEX_LABEL = "gpulayer.array.index"
LIMIT_LABEL = "gpulayer.array.limit"
SIZE_LABEL = "gpulayer.array.size"
"""The labels the control plane gives each job of an array (its id, index, limit, size)."""

ARRAY_MISSING_SECONDS = 10.0
"""An array's waiting jobs are planned once all its jobs wait (its size label says how many);
while some do not (the local control plane stores them one by one, or one was cancelled), once
none joined it for this long."""
ARRAY_GATHER_SECONDS = 1.0
"""The same for an array whose jobs carry no size."""

ARRAY_LAUNCH_TAG = "gpulayer:array-launch"
"""On each task's record: the request id of the task whose launch makes the array's call."""
ARRAY_TASK_TAG = "gpulayer:array-task"
"""On each task's record and request: its task id, the job's array index."""
ARRAY_LIMIT_TAG = "gpulayer:array-limit"
"""On each task's record: how many of the array's tasks may run at once (none: no limit)."""


@runtime_checkable
class ArrayProvider(Protocol):
    """An ability: the provider can create the tasks of a job array in one call (each task a
    machine of its own, started and ended by the provider's scheduler, at most ``limit`` at
    once). The call returns once every task is created, not running: each task's own
    ``launch`` (its request id) then waits for it and returns its machine. A provider
    without it launches an array's jobs one by one."""

    def launch_array(
        self, offer: Offer, requests: Sequence[LaunchRequest], limit: int | None
    ) -> list[str]: ...


def array_of(spec_labels: Mapping[str, Any] | None) -> str | None:
    """The array id of a job (its spec's labels), None for a job of no array."""
    value = (spec_labels or {}).get(ARRAY_LABEL)
    return str(value) if value else None


def index_of(spec_labels: Mapping[str, Any] | None) -> int | None:
    value = str((spec_labels or {}).get(INDEX_LABEL, ""))
    return int(value) if value.isdigit() else None


def size_of(spec_labels: Mapping[str, Any] | None) -> int | None:
    value = str((spec_labels or {}).get(SIZE_LABEL, ""))
    return int(value) if value.isdigit() and int(value) > 0 else None


def limit_of(spec_labels: Mapping[str, Any] | None) -> int | None:
    value = str((spec_labels or {}).get(LIMIT_LABEL, ""))
    return int(value) if value.isdigit() and int(value) > 0 else None


def plan_groups(
    plan: Sequence[str], arrays: Mapping[str, str]
) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The jobs to plan, each array's under its first (in ``plan``'s order), and for each
    such first job the other jobs of its array planned with it."""
    firsts: list[str] = []
    first_of: dict[str, str] = {}
    together: dict[str, list[str]] = {}
    for job_id in plan:
        array_id = arrays.get(job_id)
        if array_id is None:
            firsts.append(job_id)
        elif array_id in first_of:
            together[first_of[array_id]].append(job_id)
        else:
            first_of[array_id] = job_id
            together[job_id] = []
            firsts.append(job_id)
    return tuple(firsts), {job: tuple(rest) for job, rest in together.items() if rest}


def waits_for_array_call(request_id: str, state: str, tags: Mapping[str, str]) -> bool:
    """A task's record that waits for its array's call (made by another task's launch,
    which moves it to launching once the call is made): it makes no call of its own."""
    leader = tags.get(ARRAY_LAUNCH_TAG)
    return state == "requested" and leader is not None and leader != request_id


def array_limit(tags: Mapping[str, str]) -> int | None:
    value = tags.get(ARRAY_LIMIT_TAG, "")
    return int(value) if value.isdigit() else None

"""The allocations this provider asked Slurm for, written down before ``sbatch`` runs.

One JSON file per launch request: a retried launch finds its allocation again (by the Slurm job
id recorded, else by the job name on the cluster), and ``describe``/``terminate`` know which
cluster and Slurm job an instance id stands for after a controller restart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpulayer.cloud import write_json_atomically
from gpulayer_slurm.regions import region

_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Allocation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str
    job_id: str
    cluster: str
    partition: str
    instance_type: str
    nodes: int
    tags: dict[str, str] = Field(default_factory=dict)
    slurm_job_id: str | None = None
    """None until sbatch answered (or when it never did)."""
    node_names: list[str] = Field(default_factory=list)
    """In SLURM_NODEID order, once the allocation runs."""
    instances: list[dict[str, Any]] = Field(default_factory=list)
    """The instances launch returned, one per node rank."""
    ran: bool = False
    """The allocation was seen running (so pending again means Slurm requeued it)."""
    cancelled: bool = False
    """gpulayer itself asked for it to end (recorded before scancel)."""
    released: list[int] = Field(default_factory=list)
    """Node ranks whose machine gpulayer let go of: the allocation ends once every one is
    (its nodes may serve other jobs after a warm gang's, each ended on its own)."""

    name: str | None = None
    """The user's job name, part of the allocation's (None in records of older releases)."""
    array_name: str | None = None
    """A job array's task: the array's job name (its first task's request), which squeue
    shows for every task."""

    @property
    def job_name(self) -> str:
        return self.array_name or job_name(self.request_id, self.name)

    @property
    def region(self) -> str:
        """Where its offer was: the partition in its cluster."""
        return region(self.cluster, self.partition) if self.partition else self.cluster


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME_CHARS = 40


def job_name(request_id: str, name: str | None = None) -> str:
    """``gpulayer-NAME-REQUEST``, as squeue shows it to the cluster's users: the job's name
    in what sbatch and squeue's output take as one word (letters, digits, '_', '.', '-'),
    shortened; ``gpulayer-REQUEST`` when the job has none."""
    word = _UNSAFE.sub("-", name or "").strip("-.")[:_NAME_CHARS].strip("-.")
    return f"gpulayer-{word}-{request_id}" if word else f"gpulayer-{request_id}"


def instance_id(cluster: str, slurm_job_id: str, rank: int) -> str:
    return f"{cluster}.{slurm_job_id}.{rank}"


_SLURM_JOB_ID = re.compile(r"^\d+(?:_\d+)?$")
"""A job's id, or a job array's task's (``JOBID_TASK``)."""


def split_instance_id(value: str) -> tuple[str, str, int] | None:
    """(cluster, Slurm job id, node rank) of an instance id; None when it is not one."""
    parts = value.rsplit(".", 2)
    if len(parts) != 3 or not _SLURM_JOB_ID.match(parts[1]) or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])


class AllocationStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, request_id: str) -> Path:
        if not _REQUEST_ID.match(request_id):
            raise ValueError(f"request id {request_id!r} cannot name a record")
        return self.directory / f"{request_id}.json"

    def read(self, request_id: str) -> Allocation | None:
        try:
            return Allocation.model_validate_json(self._path(request_id).read_text())
        except FileNotFoundError:
            return None

    def write(self, allocation: Allocation) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json_atomically(self._path(allocation.request_id), allocation.model_dump(mode="json"))

    def all(self) -> list[Allocation]:
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                found.append(Allocation.model_validate(json.loads(path.read_text())))
            except (OSError, ValueError):
                continue
        return found

    def by_slurm_job(self, cluster: str, slurm_job_id: str) -> Allocation | None:
        return next(
            (a for a in self.all() if a.cluster == cluster and a.slurm_job_id == slurm_job_id),
            None,
        )

    def remove(self, request_id: str) -> None:
        self._path(request_id).unlink(missing_ok=True)

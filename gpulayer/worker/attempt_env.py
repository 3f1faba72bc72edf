"""What an attempt's process is told about its place: its GPUs, its array index, its node in
a gang. Pure functions of the assignment, kept apart from the agent that runs it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpulayer.protocol.messages import Assignment
from gpulayer.worker.distributed import NodePlace


def node_place(assignment: Assignment) -> NodePlace | None:
    gang = assignment.gang
    if gang is None:
        return None
    return NodePlace(
        gang.node_rank, gang.num_nodes, gang.master_addr, gang.node_addr, tuple(gang.node_addrs)
    )


def with_secrets(
    given: Mapping[str, str] | None, assignment: Assignment
) -> Mapping[str, str] | None:
    """What the job starts from: its submitter's environment where the control plane hands it
    over (the local worker), else the worker's own (None), with the values of the job's
    secrets its submitting shell had (a rented machine's worker has none of its own)."""
    if not assignment.secret_values:
        return given
    return {**(os.environ if given is None else given), **assignment.secret_values}


def array_env(labels: Mapping[str, str]) -> dict[str, str]:
    """A job array's task sees its index (submit --array labels each job with it)."""
    index = labels.get("gpulayer.array.index")
    return {"GPULAYER_ARRAY_INDEX": index} if index is not None and index.isdigit() else {}


def device_env(accelerator: str, gpu_indices: list[int]) -> dict[str, str]:
    """Give a job exactly its GPUs, and none to a job that asked for none."""
    visible = ",".join(str(i) for i in gpu_indices)
    if accelerator == "rocm":
        return {"ROCR_VISIBLE_DEVICES": visible, "HIP_VISIBLE_DEVICES": visible}
    if accelerator == "mps":
        return {}
    return {"CUDA_VISIBLE_DEVICES": visible}

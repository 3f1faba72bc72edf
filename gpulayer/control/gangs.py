"""Multi-node jobs in the control plane: a gang's nodes, their addresses and how it ends.

A gang is one attempt per node under one attempt number, all created together. It ends as a
whole: the first node to fail (or be lost, or time out) fails the job with its node and worker
named, which ends every other node's attempt (their workers are then fenced and end their
process trees); it succeeds once every node has succeeded, with torch rank 0's return value.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpulayer.control.store import AttemptRecord, JobRecord, NotFoundError, Store
from gpulayer.errors import UsageError
from gpulayer.protocol.messages import GangNode


def gang_size(job: JobRecord) -> int:
    workload = job.spec.get("workload") or {}
    if workload.get("kind") != "distributed":
        return 1
    return int(workload.get("num_workers") or 1)


def check_node_rank(job: JobRecord, node: int, *, name: str = "node") -> None:
    """UsageError, naming the parameter, for a rank the job has no node of."""
    size = gang_size(job)
    if not 0 <= node < size:
        nodes = f"{size} node" if size == 1 else f"{size} nodes"
        raise UsageError(
            f"{name}: job {job.id} has {nodes} (ranks 0 to {size - 1}); there is no node {node}"
        )


def worker_address(store: Store, worker_id: str | None) -> str:
    """The address the other nodes reach this worker on: what it registered, else its host."""
    if worker_id is None:
        return ""
    try:
        caps = store.get_worker(worker_id).capabilities
    except NotFoundError:
        return ""
    return str(caps.get("address") or caps.get("hostname") or "")


def worker_name(store: Store, worker_id: str | None) -> str:
    if worker_id is None:
        return "?"
    try:
        return store.get_worker(worker_id).name
    except NotFoundError:
        return worker_id


def node_label(store: Store, attempt: AttemptRecord) -> str:
    """ "node 1 (worker gpu-b)": how a gang's failure names where it happened."""
    return f"node {attempt.node_rank} (worker {worker_name(store, attempt.worker_id)})"


def gang_node(store: Store, job: JobRecord, attempt: AttemptRecord) -> GangNode | None:
    nodes = gang_size(job)
    if nodes <= 1:
        return None
    gang = sorted(store.gang_of(attempt), key=lambda a: a.node_rank)
    leader = next(a for a in gang if a.node_rank == 0)
    return GangNode(
        node_rank=attempt.node_rank,
        num_nodes=nodes,
        master_addr=worker_address(store, leader.worker_id),
        node_addr=worker_address(store, attempt.worker_id),
        node_addrs=[worker_address(store, a.worker_id) for a in gang],
    )


def placed_note(store: Store, nodes: Sequence[tuple[str, Sequence[int]]]) -> str:
    placed = ", ".join(
        f"node {rank} on worker {worker_name(store, worker_id)}"
        for rank, (worker_id, _) in enumerate(nodes)
    )
    return f"gang of {len(nodes)} nodes placed together: {placed}"


@dataclass(frozen=True)
class GangEnd:
    """What the job becomes after one node's report: None while other nodes still run."""

    state: str | None
    result: Any = None


def after_node_success(gang: Sequence[AttemptRecord]) -> GangEnd:
    """Every node succeeded: the job succeeds with the result a node kept (rank 0's)."""
    if any(a.state != "succeeded" for a in gang):
        return GangEnd(None)
    results = [a.result for a in gang if a.result is not None]
    return GangEnd("succeeded", results[0] if results else None)


# Endings that reach every node alike: each node gets its grace to end and upload what it
# wrote, and the gang ends once all have reported (a node that fails on its own, in contrast,
# ends the others at once: they would wait for it forever).
_WIND_DOWN_REASONS = frozenset({"timeout"})
_ENDED = frozenset({"succeeded", "failed", "cancelled"})


def winding_down(gang: Sequence[AttemptRecord], cancel_requested: bool) -> bool:
    """Whether the gang is ending by a cancel or a timeout rather than by a node's failure."""
    return cancel_requested or any(
        a.state in _ENDED and a.reason in _WIND_DOWN_REASONS for a in gang
    )


def all_ended(gang: Sequence[AttemptRecord]) -> bool:
    return all(a.state in _ENDED for a in gang)


def first_timed_out(gang: Sequence[AttemptRecord]) -> AttemptRecord | None:
    """The node whose timeout ended the gang: the first to report one."""
    timed_out = [a for a in gang if a.reason in _WIND_DOWN_REASONS]
    return min(timed_out, key=lambda a: (a.finished_at or 0.0, a.node_rank), default=None)


def leader_result(gang: Sequence[AttemptRecord]) -> Any:
    """What node 0 kept (a Trainer's reports when the run did not return)."""
    return next((a.result for a in gang if a.node_rank == 0), None)


NODE_OUTPUT_PATTERN = "node-*"


def node_output_prefix(node_rank: int) -> str:
    """Where a node's outputs go among the job's: the top for node 0, else node-<r>/."""
    return "" if node_rank == 0 else f"node-{node_rank}/"


def carry_node_outputs(destination: Path, staging: Path) -> None:
    """Node 0's outputs replace the top of the job's, but not the other nodes' folders."""
    if not destination.is_dir():
        return
    staging.mkdir(parents=True, exist_ok=True)
    for folder in destination.glob(NODE_OUTPUT_PATTERN):
        if folder.is_dir() and not (staging / folder.name).exists():
            shutil.move(str(folder), staging / folder.name)

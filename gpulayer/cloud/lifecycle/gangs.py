"""The instances of a cloud gang as one unit: launched together, handed to their job together,
ended together. Pure: each function reads the gang's records (all N, the asking one included)
and says what the asking one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from gpulayer.spec import JobSpec

ENDING_OR_GONE = frozenset({"draining", "terminating", "terminated", "never_launched"})


def nodes_of(spec: JobSpec) -> int:
    """How many machines the job rents at once: num_workers for a distributed job, else 1."""
    from gpulayer.spec.models import DistributedWorkload

    workload = spec.workload
    return workload.num_workers if isinstance(workload, DistributedWorkload) else 1


class NodeRecord(Protocol):
    request_id: str
    state: str
    node_rank: int
    launch_id: str | None


def broken_by(record: NodeRecord, gang: Sequence[NodeRecord]) -> str | None:
    """Why ``record`` ends with its gang: another node is ending or gone (it failed to come
    up, was lost, or its job ended) while this one is not. None: the gang holds."""
    if record.launch_id is None or record.state in ENDING_OR_GONE:
        return None
    for other in sorted(gang, key=lambda node: node.node_rank):
        if other.request_id != record.request_id and other.state in ENDING_OR_GONE:
            return f"node {other.node_rank} of its gang is {other.state.replace('_', ' ')}"
    return None


def all_ready(record: NodeRecord, gang: Sequence[NodeRecord]) -> bool:
    """Every node's worker joined (or already runs its part): the job may be handed over."""
    if record.launch_id is None:
        return True
    return all(node.state in ("ready", "in_use") for node in gang)


def terminate_leader(record: NodeRecord, gang: Sequence[NodeRecord]) -> bool | None:
    """Does ``record`` make the gang's one terminate call? None: not yet, some node is still
    on its way there (draining); False: another node makes it; True: this one, for every node
    in terminating."""
    if record.launch_id is None:
        return True
    live = [node for node in gang if node.state not in ("terminated", "never_launched")]
    if any(node.state != "terminating" for node in live):
        return None
    return min(live, key=lambda node: node.node_rank).request_id == record.request_id


N = TypeVar("N", bound=NodeRecord)


def terminating(gang: Sequence[N]) -> list[N]:
    return [node for node in gang if node.state == "terminating"]

"""Launch line for a distributed workload on each node: torch.distributed.run (torchrun), or
the workload's own command, run once per node with the gang's variables (GPULAYER_NODE_RANK,
GPULAYER_NUM_NODES, GPULAYER_MASTER_ADDR, GPULAYER_MASTER_PORT, GPULAYER_NODES,
GPULAYER_PROCS_PER_NODE), as a launcher script, DeepSpeed, Accelerate, MPI or JAX expects.

A job of one node uses torchrun's standalone rendezvous. A gang's nodes meet at a static
rendezvous on node 0's worker: each node says its own rank, so torch's group rank r (and its
global ranks) run on gpulayer's node r. c10d's rendezvous would number nodes in the order they
arrive, putting rank 0, and with it the job's outputs, on whichever node came first.

torchrun is started as ``<python> -m torch.distributed.run`` so its ranks use the same
interpreter as the rest of the job, whatever ``torchrun`` is first on PATH.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import GpulayerError
from gpulayer.spec.models import DistributedWorkload
from gpulayer.worker.netif import interface_of


class MultiNodeNotSupportedError(GpulayerError):
    """A distributed workload of several nodes reached a worker without its gang."""


@dataclass(frozen=True)
class NodePlace:
    """This node's place in a gang of several (none for a job of one node)."""

    node_rank: int
    num_nodes: int
    master_addr: str
    node_addr: str
    node_addrs: tuple[str, ...] = ()
    """Every node's address, by node rank."""


def launch_argv(
    workload: DistributedWorkload,
    *,
    python: str,
    function_shim: Path,
    job_id: str = "",
    node: NodePlace | None = None,
) -> list[str]:
    """The argv that runs ``workload`` on this node: torchrun, running ``function_shim`` in
    every rank for a function; a command as it is."""
    if node is None and workload.num_workers != 1:
        raise MultiNodeNotSupportedError(
            f"workload.num_workers: {workload.num_workers} nodes need a multi-node launcher: "
            "this assignment came without its gang (node rank and rendezvous address)"
        )
    if workload.command is not None:
        return list(workload.command)
    join_timeout = math.ceil(workload.rendezvous.join_timeout_seconds)
    argv = [python, "-m", "torch.distributed.run"]
    if node is None:
        argv += [
            "--nnodes=1",
            f"--nproc-per-node={workload.procs_per_worker}",
            # One node needs no agreed port: a free local one avoids clashes between jobs
            # sharing this machine. rendezvous.port is for jobs that span nodes.
            "--standalone",
            f"--rdzv-conf=join_timeout={join_timeout}",
        ]
    else:
        # Node 0's agent serves the rendezvous store; the others wait up to join_timeout for
        # it (the static rendezvous's timeout is how long every node may take to join).
        argv += [
            f"--nnodes={node.num_nodes}",
            f"--node-rank={node.node_rank}",
            f"--nproc-per-node={workload.procs_per_worker}",
            "--rdzv-backend=static",
            f"--master-addr={node.master_addr}",
            f"--master-port={workload.rendezvous.port}",
            f"--rdzv-id={job_id}",
            f"--rdzv-conf=timeout={join_timeout}",
            f"--local-addr={node.node_addr}",
        ]
    # Distributed jobs are never retried, not even rank by rank.
    argv.append("--max-restarts=0")
    if workload.function is not None:
        return [*argv, str(function_shim)]
    assert workload.entrypoint is not None  # the spec requires one of the two
    return [*argv, workload.entrypoint, *workload.args]


def launch_env(workload: DistributedWorkload, node: NodePlace | None = None) -> dict[str, str]:
    env: dict[str, str] = {
        "GPULAYER_COMM_BACKEND": workload.comm_backend or "gloo",
        "GPULAYER_NODE_RANK": str(node.node_rank if node else 0),
        "GPULAYER_NUM_NODES": str(node.num_nodes if node else 1),
    }
    if workload.function is not None:
        env["GPULAYER_FUNCTION_RANKED"] = "1"
    if workload.command is not None:
        # torchrun sets MASTER_ADDR and the like for its ranks; a command is told where node 0
        # is itself, and who the others are (an MPI hostfile, DeepSpeed's, JAX's coordinator).
        master = node.master_addr if node else "127.0.0.1"
        env["GPULAYER_MASTER_ADDR"] = master
        env["GPULAYER_MASTER_PORT"] = str(workload.rendezvous.port)
        env["GPULAYER_NODES"] = ",".join(node.node_addrs) if node and node.node_addrs else master
        env["GPULAYER_PROCS_PER_NODE"] = str(workload.procs_per_worker)
    if node is not None:
        interface = interface_of(node.node_addr)
        if interface is not None:
            # Collectives go over the interface the nodes reach each other on, not whichever
            # gloo or NCCL would guess from the host name.
            env["GLOO_SOCKET_IFNAME"] = interface
            env["NCCL_SOCKET_IFNAME"] = interface
    return env

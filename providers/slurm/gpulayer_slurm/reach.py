"""Where an allocation's worker is installed, and how the lifecycle reaches it: over SSH to each
node (through the login node), or, with a shared install root, only the login node, the worker
started on each node from the cluster's shared filesystem by the batch script."""

from __future__ import annotations

from typing import Any

from gpulayer_slurm.login import LoginNode

DEFAULT_INSTALL_ROOT = "/var/tmp/gpulayer"


def install_root_of(login: LoginNode) -> str:
    """Where each job's worker is installed: below the shared install root (as the login
    node reads it), else below install_root on each node's own disk."""
    cluster = login.cluster
    if cluster.shared_install_root is not None:
        return login.path(cluster.shared_install_root)
    return cluster.install_root or DEFAULT_INSTALL_ROOT


def reach_nodes(login: LoginNode) -> dict[str, Any] | None:
    """With a shared install root, how the lifecycle reaches a node's worker: not the node
    but the login node (the bootstrap runs there, onto the shared filesystem, and the worker
    on the node reaches its tunnel at the login node's address). None: over SSH to the node."""
    cluster = login.cluster
    if cluster.shared_install_root is None:
        return None
    return {
        "ssh_host": cluster.login,
        "ssh_port": cluster.port,
        "host_key": cluster.host_key,
        "tunnel_address": cluster.login,
    }


def over_ssh(login: LoginNode, node_address: str) -> dict[str, Any]:
    return {
        "ssh_host": node_address,
        "ssh_port": login.cluster.node_ssh_port,
        "ssh_via": login.ssh_via(),
    }

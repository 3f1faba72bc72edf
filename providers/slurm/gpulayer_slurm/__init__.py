"""gpulayer's provider for Slurm clusters, reached over SSH to a login node.

Importing this package does not import paramiko; the first command on a login node does."""

from gpulayer_slurm.connections import close_login_connections
from gpulayer_slurm.errors import ClusterUnreachable, SlurmCommandError
from gpulayer_slurm.provider import SlurmProvider
from gpulayer_slurm.settings import SlurmCluster, SlurmProviderSettings

__all__ = [
    "ClusterUnreachable",
    "SlurmCluster",
    "SlurmCommandError",
    "SlurmProvider",
    "SlurmProviderSettings",
    "close_login_connections",
]

"""Typed failures of the slurm provider."""

from __future__ import annotations

from gpulayer.cloud import CapacityError, ProviderError

PROVIDER = "slurm"


class ClusterUnreachable(CapacityError):
    """A cluster's login node cannot be reached, or refuses the key. Scoped to the cluster
    (a region), so the other clusters are still tried."""

    kind = "unreachable"

    def __init__(self, cluster: str, message: str) -> None:
        super().__init__("region", PROVIDER, cluster, None, message)


class SlurmCommandError(ProviderError):
    """A Slurm command on the login node failed; the message carries its last lines."""

    def __init__(self, cluster: str, command: str, exit_code: int, output: str) -> None:
        lines = " | ".join(output.strip().splitlines()[-3:]) or "(no output)"
        super().__init__(f"{cluster}: {command} exited {exit_code}: {lines}", provider=PROVIDER)
        self.exit_code = exit_code

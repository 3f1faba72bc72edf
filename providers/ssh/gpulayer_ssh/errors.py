"""Typed failures of the ssh provider."""

from __future__ import annotations

from gpulayer.cloud import CapacityError

PROVIDER = "ssh"


class HostUnreachable(CapacityError):
    """A configured host cannot be reached or refuses the configured key. Scoped to that host
    (each host is its own zone), so the other hosts are still tried."""

    kind = "unreachable"

    def __init__(self, host: str, region: str, message: str) -> None:
        super().__init__("zone", PROVIDER, region, host, message)

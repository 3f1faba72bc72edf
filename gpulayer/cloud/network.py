"""Where this controller reaches rented machines from: the CIDR their SSH admits.

A security group should admit SSH from the controller only. Configured (`gpulayer: ssh_cidr`),
that is the answer; otherwise the controller's public address as a public echo service sees it,
else (no internet, e.g. a controller inside the VPC) its primary local address.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.request
from functools import lru_cache

ECHO_URL = "https://checkip.amazonaws.com"


def normalized_cidr(value: str) -> str:
    """``203.0.113.7`` -> ``203.0.113.7/32``; ValueError naming the value when it is none."""
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise ValueError(f"{value!r} is not a CIDR such as 203.0.113.7/32") from None


@lru_cache(maxsize=1)
def controller_cidr(timeout: float = 3.0) -> str:
    try:
        with urllib.request.urlopen(ECHO_URL, timeout=timeout) as answer:
            address = ipaddress.ip_address(answer.read().decode().strip())
            return f"{address}/{address.max_prefixlen}"
    except (OSError, ValueError):
        pass
    return f"{_primary_local_address()}/32"


def _primary_local_address() -> str:
    # Connecting a UDP socket sends nothing; it only asks the kernel which address it would use.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"

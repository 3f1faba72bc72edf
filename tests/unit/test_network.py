"""The controller's SSH CIDR falls back to a local address when no echo service answers."""

from __future__ import annotations

import ipaddress

from gpulayer.cloud.network import controller_cidr


def test_without_internet_the_cidr_is_a_single_local_address() -> None:
    controller_cidr.cache_clear()
    network = ipaddress.ip_network(controller_cidr(timeout=1.0))  # tests route HTTPS to a dead proxy
    assert network.num_addresses == 1
    controller_cidr.cache_clear()

"""Which address and network interface a worker's nodes talk to each other on."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import socket
import struct
from urllib.parse import urlsplit

_SIOCGIFADDR = 0x8915


def address_towards(url: str) -> str:
    """This machine's address on the route to ``url``'s host (no packet is sent): the one
    a peer on that network reaches it by."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def interface_of(address: str) -> str | None:
    """The name of the interface that holds the IPv4 ``address``, or None if none does."""
    try:
        wanted = ipaddress.ip_address(socket.gethostbyname(address))
    except (OSError, ValueError):
        return None
    if wanted.is_loopback:
        return _loopback_name()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                reply = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, packed)
                if ipaddress.ip_address(socket.inet_ntoa(reply[20:24])) == wanted:
                    return name
    return None


def _loopback_name() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names or not names else names[0]

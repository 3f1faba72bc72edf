"""A local port forward over an SSH session: connections to a port of this machine's loopback
are carried to a port of the remote machine's loopback (``ssh -L``), each in a direct-tcpip
channel of the session, relayed both ways until either side closes."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any

from gpulayer.ssh.errors import SshTunnelError
from gpulayer.ssh.session import SshSession

_CHUNK = 64 * 1024


class LocalForward:
    """``127.0.0.1:local_port`` here to ``127.0.0.1:remote_port`` on the session's machine."""

    def __init__(self, session: SshSession, local_port: int, remote_port: int) -> None:
        self.session = session
        self.remote_port = remote_port
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind(("127.0.0.1", local_port))
        except OSError as exc:
            self._listener.close()
            raise SshTunnelError(f"127.0.0.1:{local_port} cannot be listened on: {exc}") from None
        self._listener.listen(16)
        self.local_port = int(self._listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="local-forward", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, peer = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._carry, args=(client, peer), name="local-forward-conn", daemon=True
            ).start()

    def _carry(self, client: socket.socket, peer: Any) -> None:
        try:
            channel = self.session.transport.open_channel(
                "direct-tcpip", ("127.0.0.1", self.remote_port), peer, timeout=10
            )
        except Exception:
            client.close()  # nothing listens there (yet): the client sees the connection close
            return
        with contextlib.closing(client), contextlib.closing(channel):
            _relay(client, channel, self._closing)

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=5)


def _relay(client: socket.socket, channel: Any, closing: threading.Event) -> None:
    while not closing.is_set():
        ready, _, _ = select.select([client, channel], [], [], 0.5)
        for end in ready:
            other = channel if end is client else client
            data = end.recv(_CHUNK)
            if not data:
                return
            other.sendall(data)

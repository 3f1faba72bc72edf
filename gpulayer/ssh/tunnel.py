"""Reverse tunnels: a port on the host's loopback that leads back to a service on this side.

A cloud worker reaches the control plane through one, so nothing new listens on the internet.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import select
import socket
import threading
import weakref
from types import TracebackType
from typing import TYPE_CHECKING

from gpulayer.ssh.errors import InvalidSshArgument, SshTunnelError
from gpulayer.ssh.session import SshSession

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

_CHUNK = 65536
_POLL_SECONDS = 0.5
_LOCAL_CONNECT_SECONDS = 10.0


class _Router:
    """paramiko keeps one forwarded-connection handler per transport; this one shares it
    between all tunnels of the transport, routing by the port the host says was connected."""

    def __init__(self) -> None:
        self._routes: dict[int, ReverseTunnel] = {}
        self._lock = threading.Lock()

    def add(self, port: int, tunnel: ReverseTunnel) -> None:
        with self._lock:
            self._routes[port] = tunnel

    def remove(self, port: int) -> None:
        with self._lock:
            self._routes.pop(port, None)

    def handle(
        self,
        channel: paramiko.Channel,
        origin: tuple[str, int],
        server: tuple[str, int],
    ) -> None:
        # Runs on the transport's own thread: anything that blocks here stalls every channel.
        with self._lock:
            tunnel = self._routes.get(server[1])
            if tunnel is None and len(self._routes) == 1:
                tunnel = next(iter(self._routes.values()))
        if tunnel is None:
            channel.close()
        else:
            tunnel._incoming.put(channel)


_routers: weakref.WeakKeyDictionary[paramiko.Transport, _Router] = weakref.WeakKeyDictionary()
_routers_lock = threading.Lock()


def _router_for(transport: paramiko.Transport) -> _Router:
    with _routers_lock:
        router = _routers.get(transport)
        if router is None:
            router = _routers[transport] = _Router()
        return router


class ReverseTunnel:
    """Connections to ``remote_bind:remote_port`` on the host are relayed to
    ``local_host:local_port`` here. Open with :func:`open_reverse_tunnel`."""

    def __init__(
        self,
        session: SshSession,
        *,
        local_host: str,
        local_port: int,
        remote_port: int,
        remote_bind: str,
    ) -> None:
        self.session = session
        self.local_host = local_host
        self.local_port = local_port
        self.remote_bind = remote_bind
        self.remote_port = remote_port
        self._incoming: queue.Queue[paramiko.Channel | None] = queue.Queue()
        self._closing = threading.Event()
        self._relays: set[threading.Thread] = set()
        self._open_ends: set[paramiko.Channel | socket.socket] = set()
        self._lock = threading.Lock()
        self._dispatcher = threading.Thread(
            target=self._dispatch, name=f"tunnel-{remote_port}", daemon=True
        )
        self._transport: paramiko.Transport | None = None

    def __repr__(self) -> str:
        return (
            f"<ReverseTunnel {self.session.target.host}:{self.remote_bind}:{self.remote_port}"
            f" -> {self.local_host}:{self.local_port}>"
        )

    def _start(self) -> None:
        import paramiko

        transport = self.session.transport
        router = _router_for(transport)
        try:
            bound = transport.request_port_forward(
                self.remote_bind, self.remote_port, handler=router.handle
            )
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise SshTunnelError(
                f"{self.session.target} refused to forward "
                f"{self.remote_bind}:{self.remote_port}: {exc}"
            ) from exc
        self.remote_port = bound
        self._transport = transport
        router.add(bound, self)
        self._dispatcher.name = f"tunnel-{bound}"
        self._dispatcher.start()

    def _dispatch(self) -> None:
        while True:
            channel = self._incoming.get()
            if channel is None:
                return
            if self._closing.is_set():
                channel.close()
                continue
            relay = threading.Thread(
                target=self._relay,
                args=(channel,),
                name=f"{self._dispatcher.name}-relay",
                daemon=True,
            )
            with self._lock:
                self._relays.add(relay)
            relay.start()

    def _relay(self, channel: paramiko.Channel) -> None:
        sock: socket.socket | None = None
        try:
            try:
                sock = socket.create_connection(
                    (self.local_host, self.local_port), timeout=_LOCAL_CONNECT_SECONDS
                )
            except OSError as exc:
                log.warning(
                    "tunnel %s: cannot reach %s:%s: %s", self, self.local_host, self.local_port, exc
                )
                return
            sock.settimeout(None)
            with self._lock:
                self._open_ends.update((channel, sock))
            _splice(sock, channel, self._closing)
        except (OSError, EOFError) as exc:
            log.debug("tunnel %s: connection ended: %s", self, exc)
        finally:
            channel.close()
            if sock is not None:
                sock.close()
            with self._lock:
                self._open_ends.discard(channel)
                if sock is not None:
                    self._open_ends.discard(sock)
                self._relays.discard(threading.current_thread())

    @property
    def active_connections(self) -> int:
        with self._lock:
            return len(self._relays)

    def close(self, timeout: float = 5.0) -> None:
        """Stop forwarding, end relayed connections and wait for their threads. Idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        transport = self._transport
        if transport is not None:
            _router_for(transport).remove(self.remote_port)
            if transport.is_active():
                self._cancel_forward(transport, timeout)
        self._incoming.put(None)
        if self._dispatcher.is_alive():
            self._dispatcher.join(timeout)
        with self._lock:
            ends = list(self._open_ends)
            relays = list(self._relays)
        for end in ends:
            with contextlib.suppress(OSError):
                end.close()
        for relay in relays:
            relay.join(timeout)

    def _cancel_forward(self, transport: paramiko.Transport, timeout: float) -> None:
        """Ask the host to stop listening, waiting at most ``timeout`` for its answer.

        Straight to the global request: paramiko's cancel_port_forward would also drop the
        handler that the transport's other tunnels still use. paramiko waits for the answer
        while the transport is active, which a host that dropped off the network (its TCP
        connection still open) keeps it forever: the request waits on a thread of its own,
        which ends when the session closes."""

        def cancel() -> None:
            with contextlib.suppress(Exception):
                transport.global_request(
                    "cancel-tcpip-forward", (self.remote_bind, self.remote_port), wait=True
                )

        asking = threading.Thread(target=cancel, name="tunnel-cancel", daemon=True)
        asking.start()
        asking.join(timeout)
        if asking.is_alive():
            log.warning(
                "no answer to closing port %s on the host within %g s", self.remote_port, timeout
            )

    def __enter__(self) -> ReverseTunnel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _splice(sock: socket.socket, channel: paramiko.Channel, closing: threading.Event) -> None:
    """Copy both ways until both directions reached EOF or the tunnel closes.

    Half-closes are passed on, so a client that shuts its sending side still gets its answer."""
    sock_open = chan_open = True
    while (sock_open or chan_open) and not closing.is_set():
        readers: list[socket.socket | paramiko.Channel] = []
        if sock_open:
            readers.append(sock)
        if chan_open:
            readers.append(channel)
        ready, _, _ = select.select(readers, [], [], _POLL_SECONDS)
        if sock in ready:
            data = sock.recv(_CHUNK)
            if data:
                channel.sendall(data)
            else:
                sock_open = False
                if not chan_open:
                    # Both ways are done: a close carries its own EOF in order, where a
                    # half-close sent as the far side closes can reach sshd after the CLOSE
                    # and end the whole connection (see session._WITHOUT_INPUT).
                    channel.close()
                    return
                channel.shutdown_write()
        if channel in ready:
            data = channel.recv(_CHUNK)
            if data:
                sock.sendall(data)
            else:
                chan_open = False
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
        if channel.closed:
            return


def open_reverse_tunnel(
    session: SshSession,
    local_port: int,
    *,
    local_host: str = "127.0.0.1",
    remote_port: int = 0,
    remote_bind: str = "127.0.0.1",
) -> ReverseTunnel:
    """Forward ``remote_bind:remote_port`` on the session's host to ``local_host:local_port``.

    ``remote_port=0`` lets the host pick a free port; read it from ``tunnel.remote_port``.
    ``remote_bind`` stays on the host's loopback unless sshd's GatewayPorts allows more."""
    for name, port, low in (("local_port", local_port, 1), ("remote_port", remote_port, 0)):
        if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
            raise InvalidSshArgument(f"{name} must be an integer {low}-65535, got {port!r}")
    tunnel = ReverseTunnel(
        session,
        local_host=local_host,
        local_port=local_port,
        remote_port=remote_port,
        remote_bind=remote_bind,
    )
    tunnel._start()
    return tunnel

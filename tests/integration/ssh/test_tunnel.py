"""Reverse tunnels: the host reaches a service on the controller side through its own loopback."""

from __future__ import annotations

import http.server
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulayer.ssh.errors import InvalidSshArgument, SshTunnelError
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.tunnel import open_reverse_tunnel
from tests.support.sshd_hosts import SshdHost


class _Server:
    """A tiny HTTP server on the controller's loopback answering a token of its own."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(8)
        token = self.token.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = token + b" " + self.path.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[::-1])

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    yield srv
    srv.close()


def _curl(session: SshSession, port: int, path: str = "/hello") -> tuple[int, str]:
    """GET through the host's own Python: a bare host has python3 and no curl."""
    script = (
        "import sys, urllib.request as u\n"
        "try:\n"
        f"    r = u.build_opener(u.ProxyHandler({{}})).open('http://127.0.0.1:{port}{path}', timeout=20)\n"
        "except OSError as exc:\n"
        "    sys.exit(f'unreachable: {exc}')\n"
        "sys.stdout.write(r.read().decode())\n"
    )
    result = session.run(["python3", "-c", script], timeout=60)
    return result.exit_code, result.stdout


def test_host_reaches_the_controller_service_through_the_tunnel(
    ssh_host: SshdHost, server: _Server
) -> None:
    with SshSession(ssh_host.target()) as session:
        tunnel = open_reverse_tunnel(session, server.port)
        try:
            assert tunnel.remote_port > 0
            assert _curl(session, tunnel.remote_port) == (0, f"{server.token} /hello")
            # Python on the host, as the worker would call the control plane.
            script = (
                "import urllib.request as u, sys; "
                f"r = u.Request('http://127.0.0.1:{tunnel.remote_port}/x', data=b'abc123'); "
                "sys.stdout.write(u.build_opener(u.ProxyHandler({})).open(r).read().decode())"
            )
            assert session.run(["python3", "-c", script], timeout=60).stdout == "321cba"
        finally:
            tunnel.close()
        code, _ = _curl(session, tunnel.remote_port)
        assert code != 0  # the port is gone on the host once the tunnel is closed


def test_closing_a_tunnel_to_a_host_gone_from_the_network_returns(
    ssh_host: SshdHost, server: _Server
) -> None:
    """The host's cable is pulled, its TCP connection still open: closing the tunnel and the
    session gives up on the host's answer instead of waiting for it forever."""
    if not ssh_host.lab.namespaced:
        pytest.skip("a loopback host has no cable to pull")
    session = SshSession(ssh_host.target()).connect()
    tunnel = open_reverse_tunnel(session, server.port)
    closed = threading.Event()

    def close_both() -> None:
        tunnel.close(timeout=2)
        session.close()
        closed.set()

    ssh_host.lab.unplug(ssh_host)
    try:
        threading.Thread(target=close_both, daemon=True).start()
        assert closed.wait(30), "closing waited on a host that cannot answer"
    finally:
        ssh_host.lab.plug(ssh_host)


def test_without_the_tunnel_the_host_cannot_reach_the_service(
    ssh_host: SshdHost, server: _Server
) -> None:
    if not ssh_host.lab.namespaced:
        pytest.skip("loopback hosts share this machine's 127.0.0.1")
    with SshSession(ssh_host.target()) as session:
        code, _ = _curl(session, server.port)
    assert code != 0


def test_requested_remote_port_is_used(ssh_host: SshdHost, server: _Server) -> None:
    with SshSession(ssh_host.target()) as session:
        free = session.run(
            [
                "python3",
                "-c",
                "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])",
            ]
        ).stdout.strip()
        with open_reverse_tunnel(session, server.port, remote_port=int(free)) as tunnel:
            assert tunnel.remote_port == int(free)
            assert _curl(session, int(free)) == (0, f"{server.token} /hello")


def test_two_tunnels_on_one_session_reach_their_own_service(ssh_host: SshdHost) -> None:
    first, second = _Server(), _Server()
    try:
        with SshSession(ssh_host.target()) as session:
            one = open_reverse_tunnel(session, first.port)
            two = open_reverse_tunnel(session, second.port)
            assert _curl(session, one.remote_port, "/a") == (0, f"{first.token} /a")
            assert _curl(session, two.remote_port, "/b") == (0, f"{second.token} /b")
            one.close()
            # Closing one leaves the other working.
            assert _curl(session, two.remote_port, "/c") == (0, f"{second.token} /c")
            two.close()
    finally:
        first.close()
        second.close()


def test_many_connections_at_once(ssh_host: SshdHost, server: _Server) -> None:
    with (
        SshSession(ssh_host.target()) as session,
        open_reverse_tunnel(session, server.port) as tunnel,
    ):
        port = tunnel.remote_port
        script = (
            "import concurrent.futures as f, urllib.request as u; "
            "o = u.build_opener(u.ProxyHandler({})); "
            f"get = lambda i: o.open('http://127.0.0.1:{port}/%d' % i, timeout=30).read().decode(); "
            "print('\\n'.join(f.ThreadPoolExecutor(8).map(get, range(40))))"
        )
        result = session.run(["python3", "-c", script], timeout=120)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [f"{server.token} /{i}" for i in range(40)]


def test_controller_service_down_fails_the_remote_request_only(ssh_host: SshdHost) -> None:
    srv = _Server()
    port = srv.port
    srv.close()
    with SshSession(ssh_host.target()) as session, open_reverse_tunnel(session, port) as tunnel:
        code, _ = _curl(session, tunnel.remote_port)
        assert code != 0
        assert session.run("echo alive").stdout == "alive\n"


def test_forwarding_refused_by_the_host_is_typed(ssh_host: SshdHost, server: _Server) -> None:
    ssh_host.configure("AllowTcpForwarding no")
    ssh_host.restart()
    with SshSession(ssh_host.target()) as session, pytest.raises(SshTunnelError):
        open_reverse_tunnel(session, server.port)


@pytest.mark.parametrize(
    ("local_port", "remote_port", "name"),
    [(0, 0, "local_port"), (70000, 0, "local_port"), (8080, -1, "remote_port")],
)
def test_bad_ports_name_the_argument(
    ssh_host: SshdHost, local_port: int, remote_port: int, name: str
) -> None:
    with (
        SshSession(ssh_host.target()) as session,
        pytest.raises(InvalidSshArgument, match=name),
    ):
        open_reverse_tunnel(session, local_port, remote_port=remote_port)


def test_tunnels_on_parallel_sessions(ssh_hosts, server: _Server) -> None:
    hosts = ssh_hosts(3)

    def through(host: SshdHost) -> tuple[int, str]:
        with SshSession(host.target()) as session, open_reverse_tunnel(session, server.port) as t:
            return _curl(session, t.remote_port, f"/{host.name}")

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(through, hosts))
    assert results == [(0, f"{server.token} /{h.name}") for h in hosts]

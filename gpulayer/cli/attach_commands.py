"""`gpulayer attach JOB`: a running job's ports on this machine's localhost, for as long as the
job runs (or until Ctrl-C). The control plane forwards each port of the job's machine to its own
loopback through an SSH session to the machine; this command carries them on to the ports asked
for here. `gpulayer exec JOB -- CMD`: a command run on the job's machine as the job runs."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Any, Optional
from urllib.parse import quote

import typer

from gpulayer.errors import UsageError

_TERMINAL = {"succeeded", "failed", "cancelled"}
_CHUNK = 64 * 1024


def parse_port(text: str) -> tuple[int, int]:
    """``PORT`` or ``LOCAL:PORT`` -> (local, remote)."""
    local, sep, remote = text.partition(":")
    try:
        numbers = (int(local), int(remote if sep else local))
    except ValueError:
        numbers = (0, 0)
    if not all(1 <= n <= 65535 for n in numbers):
        raise UsageError(f"--port: expected PORT or LOCAL:PORT (1-65535), got {text!r}")
    return numbers


def attach(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    port: list[str] = typer.Option(
        [],
        "--port",
        "-p",
        help="PORT or LOCAL:PORT to forward (repeatable); default: the job's ports.",
    ),
    node: int = typer.Option(0, "--node", help="The node whose ports to forward (gangs)."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """Forward a running job's ports to localhost while it runs."""
    from gpulayer.sdk.connection import connect

    asked = [parse_port(p) for p in port]  # bad input fails before anything is asked
    client = connect(server).client
    view = client.job(job)
    wanted = asked or [
        (p, p) for p in dict.fromkeys(view.get("ports") or [])
    ]
    if not wanted:
        raise UsageError("--port: the job names no ports (its spec's ports); give --port PORT")
    relays = []
    try:
        for local, remote in wanted:
            reached = client.request(
                "POST", f"/v1/jobs/{view['id']}/ports", {"port": remote, "node": node}
            )
            host, _, there = reached["address"].rpartition(":")
            relays.append(_Relay(local, (host, int(there))))
            typer.echo(f"localhost:{relays[-1].port} -> job {view['id']} port {remote}")
        typer.echo("forwarding while the job runs (Ctrl-C to stop)")
        while client.job(view["id"])["state"] not in _TERMINAL:
            time.sleep(2)
        typer.echo(f"job {view['id']} ended; forwarding stopped")
    finally:
        for relay in relays:
            relay.close()


class _Relay:
    """127.0.0.1:port here, carried to ``target`` (the control plane's forward)."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.target = target
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind(("127.0.0.1", port))
        except OSError as exc:
            self._listener.close()
            raise UsageError(f"--port: localhost:{port} is taken ({exc.strerror})") from None
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._carry, args=(client,), daemon=True).start()

    def _carry(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        with contextlib.closing(client), contextlib.closing(upstream):
            _pump(client, upstream, self._closing)

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self._listener.close()


def _pump(a: socket.socket, b: socket.socket, closing: threading.Event) -> None:
    ends: dict[Any, socket.socket] = {a: b, b: a}
    while not closing.is_set():
        ready, _, _ = select.select(list(ends), [], [], 0.5)
        for end in ready:
            data = end.recv(_CHUNK)
            if not data:
                return
            ends[end].sendall(data)


def exec_command(
    job: str = typer.Argument(..., help="Job id (or a unique prefix)."),
    argv: list[str] = typer.Argument(..., metavar="-- CMD...", help="The command to run."),
    node: int = typer.Option(0, "--node", help="The node to run it on (gangs)."),
    timeout: float = typer.Option(300, "--timeout", help="Seconds before it is given up."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """Run a command on a running job's rented machine, in its folder and environment, as
    its user; exit as the command did. Recorded in the job's log."""
    import sys

    from gpulayer.sdk.connection import connect

    if not 0 < timeout <= 3600:
        raise UsageError(f"--timeout: between 0 and 3600 seconds, got {timeout:g}")
    client = connect(server).client
    ran = client.request(
        "POST",
        f"/v1/jobs/{quote(job, safe='')}/exec",
        {"argv": list(argv), "node": node, "timeout": timeout},
        timeout=timeout + 30,
    )
    sys.stdout.write(ran["stdout"])
    sys.stderr.write(ran["stderr"])
    raise typer.Exit(int(ran["exit_code"]) & 0xFF if ran["exit_code"] >= 0 else 255)


def register(app: typer.Typer) -> None:
    app.command()(attach)
    app.command("exec")(exec_command)

"""Find the control plane: a configured server, or the local one, started on demand."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpulayer.control.paths import home
from gpulayer.control.tokens import read_token
from gpulayer.errors import UsageError
from gpulayer.protocol.client import ControlClient


@dataclass
class Connection:
    client: ControlClient
    embedded: bool


def connect(server: str | None = None, token: str | None = None) -> Connection:
    server = server or os.environ.get("GPULAYER_SERVER")
    if server:
        token = (
            token or os.environ.get("GPULAYER_TOKEN") or read_token(home().root / "server-token")
        )
        if not token:
            raise UsageError("GPULAYER_TOKEN: a token is required to use the server at " + server)
        return Connection(ControlClient(server, token), embedded=False)
    return Connection(local_control_plane(), embedded=True)


def local_control_plane() -> ControlClient:
    """The local control plane's client: the running one, restarted first when it runs other
    code or environment and no job is live, else a new one (see local_daemon)."""
    from gpulayer.control.local_daemon import current

    return current(home().ensure())

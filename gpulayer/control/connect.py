"""Find the control plane: a configured server, or the local one, started on demand."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from gpulayer.control.paths import home
from gpulayer.control.tokens import read_token
from gpulayer.errors import UsageError
from gpulayer.protocol.client import ControlClient

# What the local control plane keeps of the environment of the `submit` that starts it: what
# a process needs to run at all, gpulayer's own settings, and the cloud SDKs' credential chains
# that its provisioning reads. Everything else (another shell's secrets, unrelated keys) stays
# out of its /proc environ; each local job gets its own submitter's environment, in memory.
_DAEMON_NAMES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ",
        "TMPDIR", "TEMP", "TMP", "LD_LIBRARY_PATH",
        "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX",
        "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR",
        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
        "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    }
)  # fmt: skip
_DAEMON_PREFIXES = ("LC_", "GPULAYER_", "AWS_", "GOOGLE_", "CLOUDSDK_")
_CLIENT_ONLY = frozenset({"GPULAYER_TOKEN", "GPULAYER_SERVER"})


def daemon_environment(environ: Mapping[str, str], home_root: str) -> dict[str, str]:
    """The scrubbed environment the local control plane starts with."""
    kept = {
        name: value
        for name, value in environ.items()
        if (name in _DAEMON_NAMES or name.startswith(_DAEMON_PREFIXES)) and name not in _CLIENT_ONLY
    }
    kept["GPULAYER_HOME"] = home_root
    return kept


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


def check_daemon_settings() -> None:
    """Refuse a bad setting here, naming it, rather than as a daemon that failed to start."""
    from gpulayer.control.log_cap import MAX_LOG_BYTES_ENV, parse_byte_size

    configured = os.environ.get(MAX_LOG_BYTES_ENV)
    if configured:
        parse_byte_size(configured, MAX_LOG_BYTES_ENV)

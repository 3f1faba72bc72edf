"""Where an SSH session goes: address, port, login user, client key and the host key to trust."""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY, dataclass
from pathlib import Path

from gpulayer.ssh.errors import InvalidSshTarget


@dataclass(frozen=True)
class SshTarget:
    """One SSH endpoint.

    ``host_key`` is the host's public key as the provider reported it (one OpenSSH line per key,
    ``"ssh-ed25519 AAAA..."``); when set it is the only key accepted, when None the first key
    seen is recorded and later ones must match it.
    """

    host: str
    port: int = 22
    user: str = "root"
    _: KW_ONLY
    key_path: Path
    host_key: str | None = None
    via: SshTarget | None = None
    """A host to go through (OpenSSH's ProxyJump): this target's address and port are
    reached from there, over a channel of that session, as a cluster's compute nodes are
    reached from its login node."""

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise InvalidSshTarget("ssh target field 'host' must be a non-empty address")
        if any(c.isspace() for c in self.host):
            raise InvalidSshTarget(f"ssh target field 'host' contains whitespace: {self.host!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise InvalidSshTarget(f"ssh target field 'port' must be an integer, got {self.port!r}")
        if not 1 <= self.port <= 65535:
            raise InvalidSshTarget(f"ssh target field 'port' must be 1-65535, got {self.port}")
        if not isinstance(self.user, str) or not self.user.strip():
            raise InvalidSshTarget("ssh target field 'user' must be a non-empty name")
        if not isinstance(self.key_path, (str, Path)) or not str(self.key_path):
            raise InvalidSshTarget("ssh target field 'key_path' must be a file path")
        # Frozen: normalise through object.__setattr__ so callers may pass a str.
        object.__setattr__(self, "key_path", Path(self.key_path))
        if self.host_key is not None and not self.host_key.strip():
            raise InvalidSshTarget(
                "ssh target field 'host_key' is empty; use None to trust on first use"
            )

        if self.via is not None and not isinstance(self.via, SshTarget):
            raise InvalidSshTarget("ssh target field 'via' must be another ssh target")

    def with_host_key(self, host_key: str | None) -> SshTarget:
        return dataclasses.replace(self, host_key=host_key)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        through = f" via {self.via}" if self.via is not None else ""
        return f"{self.user}@{host}:{self.port}{through}"

"""What the ssh provider is told: the hosts it may hand out and where it keeps its state.

Each host is a machine the user already has. Its hardware is probed over SSH (or described
statically with ``hardware``), it has no price unless one is configured (so a job with a
cost cap never lands on it), and gpulayer writes on it only below ``install_root`` and in the
login user's ``authorized_keys``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpulayer.cloud import Hardware, check_currency

HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PATH_CHARS = re.compile(r"^[A-Za-z0-9_.@+/-]+$")


class HostHardware(Hardware):
    """A host described by hand instead of probed (hosts where probing is unwanted)."""

    _noun: ClassVar[str] = "host"


class SshHost(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str
    """Names the host in offers and is the instance id; unique among the hosts."""
    address: str
    """Host name or IP address gpulayer connects to."""
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    """sshd's port."""
    user: str = "root"
    """Login user."""
    key_path: Path
    """The private key gpulayer logs in with to probe, hand out and clean up the host."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels of the worker started on the host (jobs can pin to them)."""
    hourly_price: Annotated[float, Field(ge=0)] | None = None
    """None: no price, so jobs with a cost cap do not use the host."""
    currency: str = "USD"
    """ISO 4217 currency of hourly_price."""
    region: str = "on-prem"
    """Region the host's offers carry (jobs can restrict to it)."""
    host_key: str | None = None
    """The host's public key line; None trusts the first key seen and pins it."""
    python: str = "python3"
    """The python the worker bootstrap runs on the host."""
    install_root: str = "/var/tmp/gpulayer"
    """Each job installs into ``install_root/<job id>``; only that directory is removed."""
    authorized_keys: str = "~/.ssh/authorized_keys"
    """The file each job's key is added to: the one the host's sshd reads keys from (its
    AuthorizedKeysFile; `gpulayer config check` tries it); ``~/`` is the user's home on the host."""
    hardware: HostHardware | None = None
    """Described by hand: not probed."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not HOST_NAME.match(value):
            raise ValueError("1-63 letters, digits, '_', '.' and '-', starting alphanumeric")
        return value

    @field_validator("key_path")
    @classmethod
    def _key_in_home(cls, value: Path) -> Path:
        # providers.yaml is read by the control plane, not a shell: `~/` is expanded here.
        return value.expanduser()

    @field_validator("address", "user", "region", "python")
    @classmethod
    def _word(cls, value: str) -> str:
        if not value or any(c.isspace() or c in "\0'\"" for c in value):
            raise ValueError(f"{value!r} must be one non-empty word")
        return value

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str) -> str:
        return check_currency(value)

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, value: str | None) -> str | None:
        from gpulayer.cloud import valid_host_key_line

        return valid_host_key_line(value)

    @field_validator("install_root")
    @classmethod
    def _install_root(cls, value: str) -> str:
        from gpulayer.cloud import install_dir_problem

        value = value.rstrip("/") or "/"
        # The root itself is never removed, but every job dir below it must be removable.
        problem = install_dir_problem(f"{value}/job")
        if problem is not None:
            raise ValueError(f"job directories below {value!r}: {problem}")
        return value

    @field_validator("authorized_keys")
    @classmethod
    def _authorized_keys(cls, value: str) -> str:
        rest = value[2:] if value.startswith("~/") else value
        if not (value.startswith(("~/", "/")) and rest and _PATH_CHARS.match(rest)):
            raise ValueError("must be an absolute path or one starting with ~/")
        if ".." in rest.split("/"):
            raise ValueError("must not contain '..'")
        return value

    def install_dir(self, job_id: str) -> str:
        return f"{self.install_root}/{job_id}"


class SshProviderSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    hosts: Annotated[list[SshHost], Field(min_length=1)]
    """The machines this provider hands out, one job at a time each."""
    state_dir: Path | None = None
    """Claims, probe results and recorded host keys; None: $GPULAYER_HOME/ssh-provider."""
    probe_ttl_seconds: Annotated[float, Field(ge=0)] = 600
    """How long a host's probed hardware is reused."""
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = 10
    """How long one SSH connection attempt may take."""
    launch_wait_seconds: Annotated[float, Field(ge=0)] = 120
    """How long launch waits for a host's SSH to answer (a host that is rebooting)."""
    probe_timeout_seconds: Annotated[float, Field(gt=0)] = 30
    """How long probing a host's hardware over SSH may take."""

    @model_validator(mode="after")
    def _unique_names(self) -> SshProviderSettings:
        seen: set[str] = set()
        for index, host in enumerate(self.hosts):
            if host.name in seen:
                raise ValueError(f"hosts.{index}.name: {host.name!r} names two hosts")
            seen.add(host.name)
        return self

    def resolved_state_dir(self) -> Path:
        from gpulayer.cloud import default_state_dir

        return self.state_dir or default_state_dir("ssh")

    def host(self, name: str) -> SshHost | None:
        return next((h for h in self.hosts if h.name == name), None)

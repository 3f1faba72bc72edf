"""What the slurm provider is told: the clusters it may submit to, reached over a login node.

Each partition of a cluster is one region of offers (``CLUSTER/PARTITION``). gpulayer logs
into the login node as the user does and runs Slurm's own commands there (``scontrol``,
``sbatch``, ``squeue``, ``scancel``); ``login: local`` runs them on this machine, when it is
itself a login node.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from gpulayer.cloud import InstallRootSetting, PythonSetting, check_currency

CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# Slurm's own names (partitions, accounts, QOS): no spaces, quotes or shell syntax.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$")
LOCAL_LOGIN = "local"
_PATH_CHARS = re.compile(r"^[A-Za-z0-9_.@+/-]+$")


def _slurm_name(value: str) -> str:
    if not SLURM_NAME.match(value):
        raise ValueError(f"{value!r} is not a Slurm name (letters, digits, '_', '.', '+', '-')")
    return value


class SlurmCluster(BaseModel):
    """One Slurm cluster, as its users reach it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    login: str
    """The login node's host name or address; `local` runs Slurm's commands on this machine."""
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    """The login node's sshd port."""
    user: str | None = None
    """Login user on the login node (jobs run as this user); required unless login is local."""
    key_file: Path | None = None
    """Private key gpulayer logs in with; required unless login is local."""
    host_key: str | None = None
    """The login node's public host key line; None trusts the first key seen and pins it."""
    partitions: list[str] = Field(default_factory=list)
    """Partitions gpulayer offers and submits to; empty: every partition that is up."""
    account: str | None = None
    """Charged account (`sbatch --account`); None: the user's default."""
    qos: str | None = None
    """Quality of service (`sbatch --qos`); None: the default."""
    hourly_price: dict[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    """Price of one node-hour per partition, for cost caps and the ledger; unset: 0 (owned)."""
    currency: str = "USD"
    """ISO 4217 currency of hourly_price."""
    gpu_types: dict[str, str] = Field(default_factory=dict)
    """GPU model per partition, for nodes whose GRES names no type (`gpu:4`)."""
    authorized_keys: str = "~/.ssh/authorized_keys"
    """Where a job's key is added on the login node, for the allocated nodes to accept (the
    home directory a cluster shares); `~/` is the login user's home."""
    node_ssh_port: Annotated[int, Field(ge=1, le=65535)] = 22
    """The sshd port of the compute nodes, where the worker is started inside the allocation."""
    nodes_via_login: StrictBool = True
    """Reach the compute nodes' sshd through the login node, as `ssh -J` does: the bootstrap,
    its wheels and the worker's tunnel to the control plane all go through it. false: reach
    them directly, where they answer SSH from the controller's network."""
    install_root: InstallRootSetting = None
    """Each job's worker installs below it on its nodes; None: /var/tmp/gpulayer."""
    shared_dir: InstallRootSetting = None
    """A directory every node sees (the cluster's shared filesystem): the worker's wheels are
    uploaded there once, through the login node, and every node installs from them; None:
    each node keeps its own below install_root."""
    python: PythonSetting = None
    """The python the worker bootstrap runs on the nodes; None: python3."""
    shared_install_root: str | None = None
    """A directory of the cluster's shared filesystem (the same path on the login node and
    every compute node; `~/` is the login user's home): the worker is installed below it once
    per version, through the login node, and each allocation's batch script starts it from
    there, so gpulayer never logs into a compute node (the worker reaches the control plane
    through the login node, whose sshd must allow `GatewayPorts clientspecified`). None: each
    node is bootstrapped over SSH below install_root."""

    @field_validator("login")
    @classmethod
    def _login(cls, value: str) -> str:
        if not value or any(c.isspace() or c in "\0'\"@" for c in value):
            raise ValueError(f"{value!r} must be a host name or address, or 'local'")
        return value

    @field_validator("user")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() or c in "\0'\"@" for c in value)):
            raise ValueError(f"{value!r} must be one non-empty word")
        return value

    @field_validator("key_file")
    @classmethod
    def _key_in_home(cls, value: Path | None) -> Path | None:
        # providers.yaml is read by the control plane, not a shell: `~/` is expanded here.
        return value.expanduser() if value is not None else None

    @field_validator("host_key")
    @classmethod
    def _host_key(cls, value: str | None) -> str | None:
        from gpulayer.cloud import valid_host_key_line

        return valid_host_key_line(value)

    @field_validator("partitions")
    @classmethod
    def _partitions(cls, values: list[str]) -> list[str]:
        for value in values:
            _slurm_name(value)
        if len(set(values)) != len(values):
            raise ValueError("names a partition twice")
        return values

    @field_validator("account", "qos")
    @classmethod
    def _names(cls, value: str | None) -> str | None:
        return None if value is None else _slurm_name(value)

    @field_validator("currency")
    @classmethod
    def _currency(cls, value: str) -> str:
        return check_currency(value)

    @field_validator("gpu_types")
    @classmethod
    def _gpu_types(cls, values: dict[str, str]) -> dict[str, str]:
        from gpulayer.cloud import gpu_facts

        for partition, model in values.items():
            _slurm_name(partition)
            if gpu_facts(model) is None:
                raise ValueError(f"{partition}: {model!r} is not a GPU model gpulayer knows")
        return values

    @model_validator(mode="after")
    def _consistent(self) -> SlurmCluster:
        if self.login == LOCAL_LOGIN and self.shared_install_root is not None:
            raise ValueError("shared_install_root: needs a login node reached over SSH")
        if self.login != LOCAL_LOGIN:
            if self.user is None:
                raise ValueError("user: required when login is a host")
            if self.key_file is None:
                raise ValueError("key_file: required when login is a host")
        for field in ("hourly_price", "gpu_types"):
            for partition in getattr(self, field):
                _slurm_name(partition)
                if self.partitions and partition not in self.partitions:
                    raise ValueError(
                        f"{field}.{partition}: not one of the partitions "
                        f"({', '.join(self.partitions)})"
                    )
        return self

    @field_validator("shared_install_root")
    @classmethod
    def _shared_install_root(cls, value: str | None) -> str | None:
        from gpulayer.cloud import install_dir_problem

        if value is None:
            return None
        if not value.startswith(("~/", "/")):
            raise ValueError("must be an absolute path or one starting with ~/")
        value = value.rstrip("/")
        # Checked as it will be once ~/ is the login user's home: every job dir below it must
        # be one gpulayer may remove.
        problem = install_dir_problem(f"{value.replace('~/', '/home/user/', 1)}/job")
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

    @property
    def local(self) -> bool:
        return self.login == LOCAL_LOGIN

    def price(self, partition: str) -> float:
        return self.hourly_price.get(partition, 0.0)


class SlurmProviderSettings(BaseModel):
    """Slurm clusters, each reached over SSH to a login node (or on this machine)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    clusters: Annotated[dict[str, SlurmCluster], Field(min_length=1)]
    """The clusters by name; each partition's offers are in region CLUSTER/PARTITION, and
    a job's placement.regions names a cluster (all its partitions) or CLUSTER/PARTITION."""
    state_dir: Path | None = None
    """Recorded allocations and login host keys; None: $GPULAYER_HOME/slurm-provider."""
    connect_timeout_seconds: Annotated[float, Field(gt=0)] = 10
    """How long one SSH connection to a login node may take."""
    command_timeout_seconds: Annotated[float, Field(gt=0)] = 30
    """How long one Slurm command on a login node may take."""
    pending_timeout_seconds: Annotated[float, Field(gt=0)] = 600
    """How long a launch waits for its allocation to leave the queue before it gives up (and
    scancels it) as a lack of capacity; a job's provisioning_timeout_seconds bounds it too."""
    finish_wait_seconds: Annotated[float, Field(gt=0)] = 30
    """How long the allocation of a job that ended by itself may take to end once its batch
    script is told to return (it ends COMPLETED) before it is scancelled."""
    time_margin_seconds: Annotated[float, Field(ge=0)] = 600
    """Added to a job's timeout_seconds for the allocation's time limit (--time): time to
    install the worker and to upload outputs."""

    @field_validator("clusters")
    @classmethod
    def _cluster_names(cls, values: dict[str, SlurmCluster]) -> dict[str, SlurmCluster]:
        for name in values:
            if not CLUSTER_NAME.match(name):
                raise ValueError(
                    f"{name!r}: 1-63 letters, digits, '_', '.' and '-', starting alphanumeric"
                )
        return values

    def resolved_state_dir(self) -> Path:
        from gpulayer.cloud import default_state_dir

        return self.state_dir or default_state_dir("slurm")

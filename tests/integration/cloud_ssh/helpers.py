"""Helpers of the cloud_ssh tests: a control plane handle, plans, process and polling checks."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpulayer.cloud.bootstrap import BootstrapPlan
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.wait import wait_for_ssh
from tests.support.servers import ServerProcess
from tests.support.sshd_hosts import SshdHost

PYTHON = "python3"
"""A test host is a machine of its own: it runs its own python3, found on its PATH."""


class ControlPlane:
    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.client = server.client()
        self.port = server.port

    def worker_token(self) -> str:
        return str(self.client.request("POST", "/v1/tokens", {"kind": "worker"})["token"])

    def worker(self, worker_id: str) -> dict[str, Any]:
        return next(w for w in self.client.workers() if w["id"] == worker_id)


def connect(host: SshdHost, **kwargs: Any) -> SshSession:
    return wait_for_ssh(host.target(**kwargs), 15)


def make_plan(install_dir: Path, port: int, token: str, **overrides: Any) -> BootstrapPlan:
    fields: dict[str, Any] = {
        "install_dir": str(install_dir),
        "control_plane_port": port,
        "worker_token": token,
        "worker_name": "cloud-1",
        "labels": {"pool": "test"},
        "provider": "ssh",
        "region": "on-prem",
        "zone": "node0",
        "hourly_price": 0.25,
        "deadman_seconds": 600,
        # Test hosts share this machine's kernel: the dead-man switch only records what it would do.
        "deadman_action": f"record:{install_dir.parent / 'deadman.jsonl'}",
        "python": PYTHON,
        "heartbeat_seconds": 0.5,
    }
    fields.update(overrides)
    return BootstrapPlan(**fields)


def processes_mentioning(host: SshdHost, text: str) -> list[int]:
    """Live processes on ``host`` whose command line contains ``text``, by the host's own pids:
    a worker's pid is the one its host gave it, which means nothing in this machine's /proc."""
    return host.processes_mentioning(text)


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        time.sleep(0.1)

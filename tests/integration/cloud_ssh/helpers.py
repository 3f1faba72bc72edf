"""Helpers of the cloud_ssh tests: a control plane handle, plans, process and polling checks."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpulayer.cloud.bootstrap import BootstrapPlan
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.wait import wait_for_ssh
from tests.support.servers import ServerProcess
from tests.support.sshd_hosts import SshdHost

PYTHON = sys.executable
"""Test hosts share this machine's filesystem, so they run this very interpreter."""


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
        # Test hosts are this machine: the dead-man switch only records what it would do.
        "deadman_action": f"record:{install_dir.parent / 'deadman.jsonl'}",
        "python": PYTHON,
        "heartbeat_seconds": 0.5,
    }
    fields.update(overrides)
    return BootstrapPlan(**fields)


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (test hosts share our pid space)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


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

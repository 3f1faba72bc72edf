"""A server with workers as separate processes on loopback, for integration tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpulayer.protocol.client import ControlClient
from tests.support.servers import ServerProcess, WorkerProcess, wait_for_workers


def command_job(argv: list[str], **placement: Any) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": argv},
        "placement": {"target": "remote", **placement},
    }


def submit(client: ControlClient, spec: dict[str, Any]) -> str:
    # An empty bundle: these jobs need no source.
    return str(client.submit(spec)["id"])


class Cluster:
    def __init__(self, base: Path, database_url: str | None, heartbeat_timeout: float) -> None:
        self.base = base
        self.server = ServerProcess(
            base / "server", database_url=database_url, heartbeat_timeout=heartbeat_timeout
        )
        self.workers: list[WorkerProcess] = []
        self.worker_token = ""

    def start(self, workers: int, labels: list[dict[str, str]] | None = None) -> Cluster:
        self.server.start()
        self.worker_token = self.server.client().request("POST", "/v1/tokens", {"kind": "worker"})[
            "token"
        ]
        for i in range(workers):
            self.add_worker(f"w{i}", (labels or [{}] * workers)[i])
        wait_for_workers(self.client, workers)
        return self

    def add_worker(
        self, name: str, labels: dict[str, str] | None = None, *extra: str
    ) -> WorkerProcess:
        worker = WorkerProcess(
            self.server.url, self.worker_token, self.base / name, name, labels
        ).start(0.5, *extra)
        self.workers.append(worker)
        return worker

    @property
    def client(self) -> ControlClient:
        return self.server.client()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.server.stop()

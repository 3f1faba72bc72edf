"""Teardown is never held up by machines that do not answer: with every launch thread hanging on
hosts that accept a connection and never speak SSH, a cancelled job's machine (a real sshd
host) is still torn down at once, and an instance that outstays its state's limit is moved on
with the reason recorded."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.e2e_cloud.test_cloud_ssh_lifecycle import instances, logs, status, submit_gated
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

# The controller here launches 2 at a time (parallel_launches): both hang.
HANGING = 2


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (the kernel completes them) and never answers:
    an SSH client waits there for a banner until its own timeout."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def silent_host(name: str, port: int, root: Path, client_key: Path) -> dict[str, Any]:
    return {
        "name": name,
        "address": "127.0.0.1",
        "port": port,
        "user": "nobody",
        "key_path": str(client_key),
        "hourly_price": 0.1,
        "region": "lab",
        "install_root": str(root),
        "hardware": {"cpu_cores": 8, "memory_gb": 32},
    }


def live_states(job_id: str) -> set[str]:
    return {i["state"] for i in instances("--job", job_id)}


def test_a_launch_that_outstays_its_limit_is_moved_on_with_the_reason(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, silent_port: int
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    only = silent_host("silent", silent_port, root, host.client_key)
    write_providers(cloud_home, [only], state_timeouts={"launching": 3})
    job_id = submit_gated(tmp_path / "gate", "stuck")

    def moved_on() -> dict[str, Any] | None:
        found = instances("--job", job_id)
        return (
            found[0] if found and found[0]["state"] != "launching" and found[0]["history"] else None
        )

    wait_until(lambda: moved_on() is not None, timeout=90, what="the stuck launch to move on")
    record = moved_on()
    assert record is not None
    moves = [(h["from"], h["to"], h["reason"]) for h in record["history"]]
    assert ("launching", "terminating", "the launch call timed out after 3 s") in moves, moves
    assert record["outcome"] == "failed", record
    # The job's log says it, and its only offer is not tried again for it.
    assert "the launch call timed out after 3 s; moved to terminating" in logs(job_id)
    assert len(instances("--job", job_id)) == 1
    assert run_cli(["cancel", job_id]).returncode == 0


def test_a_cancelled_jobs_machine_goes_while_every_launch_hangs(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, silent_port: int
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    real = host_entry(host, "box", 0.5, root)
    write_providers(cloud_home, [real], parallel_launches=HANGING)
    gate = tmp_path / "gate"
    running = submit_gated(gate, "runs")
    wait_until(lambda: status(running)["state"] == "running", timeout=180, what="the job to run")

    # Cheaper hosts that never answer: each next job's launch hangs waiting for SSH.
    silent = [silent_host(f"silent{n}", silent_port, root, host.client_key) for n in range(HANGING)]
    write_providers(cloud_home, [real, *silent], parallel_launches=HANGING)
    hanging = [submit_gated(gate, f"hangs{n}") for n in range(HANGING)]
    wait_until(
        lambda: all("launching" in live_states(j) for j in hanging),
        timeout=120,
        what="every launch thread to hang",
    )

    assert run_cli(["cancel", running]).returncode == 0
    wait_until(
        lambda: live_states(running) == {"terminated"},
        timeout=60,
        what="the cancelled job's machine to be torn down while the launches hang",
    )
    assert all("launching" in live_states(j) for j in hanging)
    for job_id in hanging:
        run_cli(["cancel", job_id])

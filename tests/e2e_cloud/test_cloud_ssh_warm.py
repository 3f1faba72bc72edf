"""Warm machines on ssh-provider hosts (real sshd hosts, machines of their own): with
`idle_seconds` set, a host outlives its job, idle, its worker running, and the next job that
fits it takes it with no launch and no bootstrap; its idle limit, `gpulayer reap` and the
dead-man switch end it, and nothing is left.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, job_processes, write_providers
from tests.e2e_cloud.test_cloud_ssh_lifecycle import (
    assert_nothing_left,
    instances,
    kill_controller,
    status,
)
from tests.support.cli import run_cli
from tests.support.sshd_hosts import SshdHost, SshdLab

pytestmark = pytest.mark.slow


def keep_warm(home: Path, seconds: float) -> None:
    """idle_seconds in the ssh provider's own section (over the gpulayer: default)."""
    path = home / "providers.yaml"
    config = yaml.safe_load(path.read_text())
    config["ssh"]["idle_seconds"] = seconds
    path.write_text(yaml.safe_dump(config))


def run_job(marker: str) -> tuple[str, str, float]:
    """An attached cloud job: (its id, what it printed on stderr, seconds from submit to end)."""
    started = time.monotonic()
    result = run_cli(
        ["submit", "--target", "cloud", "--", "python", "-c", f"print('ran {marker}')"],
        timeout=300,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert f"ran {marker}" in result.stdout
    listed = run_cli(["ls", "--json", "-n", "1"])
    job_id = str(yaml.safe_load(listed.stdout)[0]["id"])
    return job_id, result.stderr, took


def idle_instance() -> dict[str, Any] | None:
    found = [i for i in instances() if i["state"] == "idle"]
    return found[0] if found else None


def worker_of(job_id: str) -> str:
    (attempt,) = status(job_id)["attempts"]
    return str(attempt["worker_id"])


def warm_host(
    ssh_hosts: Any, home: Path, tmp_path: Path, idle_seconds: float, **orchestrator: Any
) -> tuple[SshdHost, Path]:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(home, [host_entry(host, "warm", 0.5, root)], **orchestrator)
    keep_warm(home, idle_seconds)
    return host, root


def test_the_next_job_takes_the_idle_host_and_its_worker_without_a_bootstrap(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    host, root = warm_host(ssh_hosts, cloud_home, tmp_path, 30)
    first, first_log, cold = run_job("first")
    assert "bootstrapping the worker" in first_log
    idle = wait_until(idle_instance, what="the host to go idle")
    assert idle["job_id"] == first
    assert idle["state_label"].startswith("idle (") and idle["state_label"].endswith(" s left)")
    assert 0 < idle["idle_seconds_left"] <= 30
    assert "idle (" in run_cli(["instances"]).stdout
    assert job_processes(root, host)  # its worker runs on

    second, second_log, warm = run_job("second")
    assert "bootstrapping the worker" not in second_log
    assert "no launch and no bootstrap" in second_log
    assert worker_of(second) == worker_of(first)  # the same worker process took it
    (instance,) = status(second)["instances"]
    assert instance["request_id"] == idle["request_id"]  # one instance, rented once
    moves = [(h["from"], h["to"]) for h in instance["history"]]
    assert moves.count(("requested", "launching")) == 1
    assert ("in_use", "idle") in moves and ("idle", "ready") in moves
    after_idle = moves[moves.index(("idle", "ready")) :]
    assert ("ready", "in_use") in after_idle
    assert not any(to in ("booting", "bootstrapping") for _, to in after_idle)
    print(f"submit to end: cold {cold:.2f} s, on the warm host {warm:.2f} s")

    # No job takes it: its idle_seconds pass and it is torn down as without them.
    wait_until(
        lambda: status(second)["instances"][0]["state"] == "terminated",
        timeout=120,
        what="the idle limit",
    )
    (ended,) = status(second)["instances"]
    reasons = [h["reason"] for h in ended["history"] if h["from"] == "idle"]
    assert reasons[-1] == "idle for 30 s: no job took it"
    assert ended["cost"] is not None and ended["cost"] > 0  # idle time is on the ledger
    # Each job's share of the one machine: the first job's entry ends when the second took it.
    (share,) = ledger(first)["instances"]
    assert share["state"] == "handed_over" and share["instance_id"] == ended["instance_id"]
    assert share["ended_at"] and share["cost"] > 0
    assert share["ended_at"] <= ended["launched_at"]
    assert_nothing_left(cloud_home, second, root, sshd_lab, host)
    assert not host.exists(root / first)  # the worker's install dir, named after the first job


def test_a_controller_killed_while_a_host_is_idle_leaves_nothing_after_the_deadman_and_reap(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    host, root = warm_host(ssh_hosts, cloud_home, tmp_path, 3_600, deadman_seconds=15)
    job_id, _, _ = run_job("before the crash")
    wait_until(idle_instance, what="the host to go idle")
    assert job_processes(root, host)
    kill_controller(cloud_home)
    # No control plane: the idle worker's dead-man switch stops it (an ssh host's action).
    wait_until(lambda: not job_processes(root, host), timeout=120, what="the dead-man switch")

    # A control plane again, and a reap: the warm host is ended at once, whatever its idle
    # time left.
    reaped = run_cli(["reap"], timeout=120)
    assert reaped.returncode == 0, reaped.stderr
    assert "ended ssh warm" in reaped.stdout
    wait_until(
        lambda: ledger(job_id)["instances"][0]["state"] == "terminated",
        timeout=120,
        what="the reaped host's teardown",
    )
    (instance,) = status(job_id)["instances"]
    assert ("idle", "draining") in [(h["from"], h["to"]) for h in instance["history"]]
    assert_nothing_left(cloud_home, job_id, root, sshd_lab, host)


def test_a_gang_submitted_as_the_last_one_ends_waits_for_its_hosts_being_torn_down(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path, torch_index: Any
) -> None:
    """The 2-node break: a second 2-node job (on_unschedulable: fail) submitted right after
    the first ended, while the first's hosts are still being torn down, waits for them and
    runs, rather than failing `unschedulable` with `ssh/h0: in use by job ...`."""
    from tests.e2e_cloud.test_cloud_ssh_gang import gang_job, teardown_done, two_hosts

    root, hosts = two_hosts(ssh_hosts, cloud_home, tmp_path, ("h0", "h1"))
    first_file = gang_job(tmp_path / "first", torch=torch_index)
    first = run_cli(["submit", "-f", str(first_file)], cwd=first_file.parent, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    second_file = gang_job(tmp_path / "second", torch=torch_index)
    second = run_cli(["submit", "-f", str(second_file)], cwd=second_file.parent, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    listed = run_cli(["ls", "--json", "-n", "2"])
    jobs = [job["id"] for job in yaml.safe_load(listed.stdout)]
    assert [status(job_id)["state"] for job_id in jobs] == ["succeeded", "succeeded"]
    for job_id in jobs:
        assert {i["state"] for i in teardown_done(job_id)} == {"terminated"}
    assert_nothing_left(cloud_home, jobs, root, sshd_lab, *hosts)

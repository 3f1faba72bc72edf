"""The worker from the cluster's shared filesystem (`shared_install_root`): installed there through
the login node, started by the allocation's batch script on the compute node, reaching the
control plane through the login node. The compute nodes refuse logins from this machine (as
many clusters without pam_slurm_adopt do); no SSH session reaches one during the job."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e_cloud.journey import wait_until
from tests.integration.slurm.test_journeys import status, write_providers
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _queue_left_empty(slurm_cluster: SlurmCluster) -> Iterator[None]:
    yield
    left = [line.split()[0] for line in slurm_cluster.queue()]
    if left:
        slurm_cluster.command("scancel", *left)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")


def sessions(host: SshdHost) -> int:
    """SSH sessions the host's sshd opened (accepted logins) since it started."""
    return len(re.findall(r"Accepted publickey for ", host.log_path.read_text(errors="replace")))


def test_a_job_runs_on_a_node_no_ssh_session_reached(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    shared_root = slurm_cluster.shared / "gpulayer"
    write_providers(
        slurm_home,
        slurm_cluster,
        tmp_path,
        shared_install_root=str(slurm_cluster.on_nodes(shared_root)),
    )
    before = {name: sessions(host) for name, host in slurm_cluster.hosts.items()}
    sent = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--name", "shared",
         "--timeout", "120", "--", "python3", "-c",
         "import socket; print('ran on', socket.gethostname())"],
        timeout=300,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    # The job's output arrived, from a compute node (not the login node the bootstrap ran on).
    (ran_on,) = re.findall(r"ran on (\S+)", sent.stdout)
    assert ran_on in slurm_cluster.hosts, sent.stdout
    job_id = str(yaml.safe_load(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]["id"])
    (instance,) = status(job_id)["instances"]
    slurm_job = str(instance["instance_id"]).split(".")[1]
    assert slurm_cluster.ended_as(slurm_job) in ("", "COMPLETED")
    wait_until(lambda: slurm_cluster.ended_as(slurm_job), timeout=60, what="the allocation's end")
    assert slurm_cluster.ended_as(slurm_job) == "COMPLETED"
    # No SSH session reached any compute node, the one that ran the job included.
    assert {name: sessions(host) for name, host in slurm_cluster.hosts.items()} == before
    # The worker's install lies on the shared filesystem, sealed, for the next job to reuse.
    assert any((shared_root / "worker").iterdir())
    wait_until(
        lambda: instance["request_id"] not in slurm_cluster.shared_authorized_keys.read_text(),
        timeout=30,
        what="the job's key to go",
    )


@contextlib.contextmanager
def login_without_gateway_ports(cluster: SlurmCluster) -> Iterator[None]:
    """The login node's sshd as most are configured: forwarded ports on its loopback only.
    Only the listener restarts: open sessions (the provider's kept connection) go on."""
    login = cluster.login
    assert login is not None
    line = "GatewayPorts clientspecified"

    def listen_with(extra: list[str]) -> None:
        login.extra_config[:] = extra
        login.config_path.write_text(login._config())
        login.stop_listening()
        login._spawn()
        login.wait_ready()

    kept = list(login.extra_config)
    listen_with([x for x in kept if x != line])
    try:
        yield
    finally:
        listen_with(kept)


def test_a_login_node_that_keeps_forwarded_ports_to_itself_is_one_line_naming_the_setting(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    shared_root = slurm_cluster.shared / tmp_path.name
    write_providers(
        slurm_home,
        slurm_cluster,
        tmp_path,
        shared_install_root=str(slurm_cluster.on_nodes(shared_root)),
    )
    started = time.monotonic()
    with login_without_gateway_ports(slurm_cluster):
        sent = run_cli(
            ["submit", "--target", "cloud", "--provider", "slurm", "--timeout", "120",
             "--", "true"],
            timeout=300,
        )  # fmt: skip
    took = time.monotonic() - started
    said = " ".join((sent.stdout + sent.stderr).split())
    assert sent.returncode != 0, said
    assert "this host's sshd must allow GatewayPorts clientspecified" in said, said
    # Not the worker's join timeout (300 s by default): the bootstrap checked first.
    assert took < 120, took

"""The test cluster itself: a login node that reaches slurmctld, and slurmd nodes that run jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.ssh.session import SshSession
from tests.support.procs import wait_until
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def test_nodes_are_idle_with_their_gres(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.node_states() == {
        "gpu1": "idle",
        "gpu2": "idle",
        "cpu1": "idle",
        "cpu2": "idle",
    }
    shown = slurm_cluster.command("scontrol", "show", "node", "gpu1")
    assert "Gres=gpu:a100:2" in shown


def test_login_node_runs_a_step_on_two_nodes_and_leaves_nothing(
    slurm_cluster: SlurmCluster,
) -> None:
    assert slurm_cluster.login is not None
    with SshSession(slurm_cluster.login.target()) as session:
        step = session.run(
            "srun -N2 -p gpu --gres=gpu:1 -t 1 sh -c 'echo node=$SLURM_NODEID'", timeout=60
        )
        assert step.exit_code == 0, step.stderr
        assert sorted(step.stdout.split()) == ["node=0", "node=1"]
        submitted = session.run("sbatch --parsable -p cpu -t 1 --wrap 'sleep 30'", timeout=30)
        assert submitted.exit_code == 0, submitted.stderr
        job_id = submitted.stdout.strip()
        wait_until(
            lambda: any(j.startswith(f"{job_id} ") for j in slurm_cluster.queue()), 10, "queued"
        )
        assert session.run(f"scancel {job_id}", timeout=30).exit_code == 0
    wait_until(lambda: not slurm_cluster.queue(), 20, f"job {job_id} gone from squeue")


def test_nodes_are_machines_of_their_own_sharing_one_folder(slurm_cluster: SlurmCluster) -> None:
    import gpulayer

    checkout = Path(gpulayer.__file__).parent
    assert slurm_cluster.login is not None
    probe = slurm_cluster.shared / "probe"
    probe.write_text("on every node\n")
    for host in [*slurm_cluster.hosts.values(), slurm_cluster.login]:
        # None of this machine's files: not the checkout, not the cluster's own folder.
        assert not host.exists(checkout) and not host.exists(slurm_cluster.base_dir), host.name
        # Its own munged; Slurm's commands and config from its own root.
        assert host.processes_mentioning("munged"), host.name
        assert host.exists("/etc/slurm/slurm.conf") and host.exists("/usr/bin/sbatch")
        # The cluster's shared filesystem, as on a lab's cluster.
        assert host.read_text(slurm_cluster.on_nodes(probe)) == "on every node\n"
    for name, host in slurm_cluster.hosts.items():
        assert host.processes_mentioning(f"slurmd -D -f /etc/slurm/slurm.conf -N {name}")
    assert not slurm_cluster.login.processes_mentioning("slurmd")
    probe.unlink()


def test_accounting_records_how_each_job_ended(slurm_cluster: SlurmCluster) -> None:
    """slurmdbd over the cluster's own MariaDB: sacct, here and on the login node, says how a
    job that returned and one that was cancelled ended, after squeue has let them go."""
    returned = slurm_cluster.sbatch("-p", "cpu", "-t", "1", "--wrap", "true")
    cancelled = slurm_cluster.sbatch("-p", "cpu", "-t", "1", "--wrap", "sleep 300")
    wait_until(lambda: f"{cancelled} wrap RUNNING" in slurm_cluster.queue(), 30, "the sleep to run")
    slurm_cluster.command("scancel", cancelled)
    wait_until(lambda: slurm_cluster.ended_as(returned), 30, "sacct to record the first end")
    wait_until(lambda: slurm_cluster.ended_as(cancelled), 30, "sacct to record the cancel")
    assert slurm_cluster.ended_as(returned) == "COMPLETED"
    assert slurm_cluster.ended_as(cancelled) == "CANCELLED"
    assert slurm_cluster.login is not None
    shown = slurm_cluster.login.run(
        f"sacct -n -X -P -o JobID,State -j {returned},{cancelled}", check=True
    ).stdout
    assert {line.split()[0] for line in shown.splitlines() if line.strip()} == {
        f"{returned}|COMPLETED",
        f"{cancelled}|CANCELLED",
    }, shown

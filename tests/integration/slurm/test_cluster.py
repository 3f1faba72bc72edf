"""The test cluster itself: a login node that reaches slurmctld, and slurmd nodes that run jobs."""

from __future__ import annotations

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

"""`gpulayer offers --provider slurm` lists the real cluster's partitions and node shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e_cloud.journey import wait_until
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def test_offers_list_one_row_per_partition_and_shape(
    slurm_cluster: SlurmCluster, slurm_home: Path
) -> None:
    listed = run_cli(["offers", "--provider", "slurm", "--json", "-n", "50"])
    assert listed.returncode == 0, listed.stderr
    rows = {(row["zone"], row["instance_type"]): row for row in json.loads(listed.stdout)}
    # The gpu partition lets jobs share its nodes: one of a node's two GPUs is an offer too.
    assert set(rows) == {
        ("gpu", "4cpu-3.9gb-2xa100"),
        ("gpu", "2cpu-2gb-1xa100-shared"),
        ("cpu", "2cpu-2gb"),
    }, rows
    assert rows["gpu", "2cpu-2gb-1xa100-shared"]["hourly_price"] == 1.25
    gpu = rows["gpu", "4cpu-3.9gb-2xa100"]
    assert (gpu["region"], gpu["zone"], gpu["gpu_count"]) == (f"{slurm_cluster.name}/gpu", "gpu", 2)
    assert "A100" in gpu["gpu_name"] and gpu["hourly_price"] == 2.5
    assert rows["cpu", "2cpu-2gb"]["hourly_price"] == 0
    # Nothing runs: every node is idle; the partitions' MaxTime (2:00:00 and 30:00).
    assert (gpu["idle_nodes"], gpu["time_limit_seconds"]) == (2, 7200)
    cpu = rows["cpu", "2cpu-2gb"]
    assert (cpu["idle_nodes"], cpu["time_limit_seconds"]) == (2, 1800)


def test_offers_count_the_idle_nodes_of_the_moment(
    slurm_cluster: SlurmCluster, slurm_home: Path
) -> None:
    holder = slurm_cluster.hold_nodes("cpu", 1)
    try:
        listed = run_cli(["offers", "--provider", "slurm", "--json", "-n", "50"])
        assert listed.returncode == 0, listed.stderr
        idle = {row["zone"]: row["idle_nodes"] for row in json.loads(listed.stdout)}
        assert idle == {"gpu": 2, "cpu": 1}
        table = run_cli(["offers", "--provider", "slurm"], env={"COLUMNS": "160"})
        assert table.returncode == 0, table.stderr
        header = next(line for line in table.stdout.splitlines() if line.startswith("PROVIDER"))
        assert header.split()[-2:] == ["IDLE", "LIMIT"]
        cpu_row = next(line for line in table.stdout.splitlines() if " cpu " in line)
        assert cpu_row.split()[-2:] == ["1", "30m"]
    finally:
        slurm_cluster.command("scancel", holder)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="an empty queue")


def test_offers_filter_like_cloud_offers(slurm_home: Path) -> None:
    a100 = run_cli(["offers", "--provider", "slurm", "--gpu", "a100", "--gpus", "2", "--json"])
    assert a100.returncode == 0, a100.stderr
    assert [row["instance_type"] for row in json.loads(a100.stdout)] == ["4cpu-3.9gb-2xa100"]
    table = run_cli(["offers", "--provider", "slurm"], env={"COLUMNS": "120"})
    assert table.returncode == 0, table.stderr
    assert "4cpu-3.9gb-2xa100" in table.stdout and "2cpu-2gb" in table.stdout

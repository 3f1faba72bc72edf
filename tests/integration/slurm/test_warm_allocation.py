"""A warm Slurm allocation: with the slurm provider's `idle_seconds`, the allocation of a job that
ended by itself keeps its worker running and takes the next job it fits, in the same Slurm job
(no new sbatch, no bootstrap), and ends COMPLETED in Slurm's accounting once no job took it for
idle_seconds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import wait_until
from tests.integration.slurm.test_journeys import no_job_keys, status, write_providers
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

IDLE_SECONDS = 20


@pytest.fixture(autouse=True)
def _queue_left_empty(slurm_cluster: SlurmCluster) -> Iterator[None]:
    yield
    left = [line.split()[0] for line in slurm_cluster.queue()]
    if left:
        slurm_cluster.command("scancel", *left)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")


def keep_warm(home: Path, seconds: float) -> None:
    path = home / "providers.yaml"
    config = yaml.safe_load(path.read_text())
    config["slurm"]["idle_seconds"] = seconds
    path.write_text(yaml.safe_dump(config))


def run_job(marker: str, timeout: int = 120) -> tuple[str, str]:
    """An attached Slurm job on the cpu partition: its id and what it said on stderr."""
    result = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--name", "warm",
         "--timeout", str(timeout), "--", "python3", "-c", f"print('ran {marker}')"],
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"ran {marker}" in result.stdout
    listed = run_cli(["ls", "--json", "-n", "1"])
    return str(yaml.safe_load(listed.stdout)[0]["id"]), result.stderr


def gpulayer_allocations(cluster: SlurmCluster) -> set[str]:
    """Slurm job ids of every gpulayer allocation the cluster ever ran, as Slurm's accounting
    lists them (one per sbatch)."""
    shown = cluster.command(
        "sacct", "-a", "-n", "-X", "-P", "-o", "JobID,JobName", "-S", "2020-01-01"
    )  # fmt: skip
    return {
        line.split("|")[0]
        for line in shown.splitlines()
        if line.strip() and line.split("|")[1].startswith("gpulayer-")
    }


def end_warm_allocations(cluster: SlurmCluster) -> None:
    """What a test left warm ends now, its key with it (the cluster is the session's)."""
    assert run_cli(["reap"], timeout=120).returncode == 0
    wait_until(lambda: cluster.queue() == [], timeout=60, what="an empty queue")
    wait_until(lambda: no_job_keys(cluster), timeout=30, what="the job's key to go")


def slurm_job_of(instance: dict[str, Any]) -> str:
    return str(instance["instance_id"]).split(".")[1]


def test_the_next_job_runs_in_the_idle_allocation_without_a_new_sbatch(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    keep_warm(slurm_home, IDLE_SECONDS)
    before = gpulayer_allocations(slurm_cluster)
    first, first_log = run_job("first")
    assert "bootstrapping the worker" in first_log
    idle = wait_until(
        lambda: next((i for i in status(first)["instances"] if i["state"] == "idle"), None),
        timeout=60,
        what="the allocation to go idle",
    )
    slurm_job = slurm_job_of(idle)
    # Its allocation runs on, the worker in it.
    assert [line.split()[0] for line in slurm_cluster.queue()] == [slurm_job]
    assert slurm_cluster.ended_as(slurm_job) == ""

    second, second_log = run_job("second")
    assert "bootstrapping the worker" not in second_log
    assert "no launch and no bootstrap" in second_log
    (instance,) = status(second)["instances"]
    assert instance["request_id"] == idle["request_id"]
    assert slurm_job_of(instance) == slurm_job  # the same Slurm job ran both
    assert gpulayer_allocations(slurm_cluster) - before == {slurm_job}  # one sbatch
    moves = [(h["from"], h["to"]) for h in instance["history"]]
    assert ("idle", "ready") in moves
    assert not any(
        to in ("booting", "bootstrapping") for _, to in moves[moves.index(("idle", "ready")) :]
    )

    # No job takes it: idle_seconds pass, and the allocation ends as a finished one does.
    wait_until(
        lambda: status(second)["instances"][0]["state"] == "terminated",
        timeout=IDLE_SECONDS + 120,
        what="the idle limit",
    )
    (ended,) = status(second)["instances"]
    reasons = [h["reason"] for h in ended["history"] if h["from"] == "idle"]
    assert reasons[-1] == f"idle for {IDLE_SECONDS} s: no job took it"
    assert wait_until(lambda: slurm_cluster.ended_as(slurm_job), timeout=60, what="sacct") == (
        "COMPLETED"
    )
    assert gpulayer_allocations(slurm_cluster) - before == {slurm_job}
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_a_job_longer_than_the_idle_allocations_time_left_gets_an_allocation_of_its_own(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    """Slurm ends an allocation at its time limit (the first job's timeout and a margin): a
    job whose timeout would run past it must not be put in it."""
    write_providers(slurm_home, slurm_cluster, tmp_path, provider={"time_margin_seconds": 30})
    keep_warm(slurm_home, IDLE_SECONDS)
    before = gpulayer_allocations(slurm_cluster)
    first, _ = run_job("short")  # --timeout 120: a limit of 3 minutes
    idle = wait_until(
        lambda: next((i for i in status(first)["instances"] if i["state"] == "idle"), None),
        timeout=60,
        what="the allocation to go idle",
    )
    second, second_log = run_job("long", timeout=600)
    assert "no launch and no bootstrap" not in second_log
    (instance,) = status(second)["instances"]
    assert slurm_job_of(instance) != slurm_job_of(idle)
    assert gpulayer_allocations(slurm_cluster) - before == {
        slurm_job_of(idle),
        slurm_job_of(instance),
    }
    end_warm_allocations(slurm_cluster)

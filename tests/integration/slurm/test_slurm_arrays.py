"""A gpulayer job array on Slurm is one Slurm job array, as the cluster's users know them:
one ``sbatch --array=0-(N-1)%K``, each task its own allocation whose job sees
``SLURM_ARRAY_TASK_ID`` beside ``GPULAYER_ARRAY_INDEX``, at most K tasks running at once, each
ending on its own, as ``sacct`` records it."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import wait_until
from tests.integration.slurm.test_journeys import (
    no_job_keys,
    no_worker_installs,
    write_providers,
)
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow

REPORT = (
    "import os\n"
    "print('index', os.environ.get('GPULAYER_ARRAY_INDEX'),"
    " 'task', os.environ.get('SLURM_ARRAY_TASK_ID'))\n"
)


@pytest.fixture(autouse=True)
def _queue_left_empty(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """A test that failed half-way leaves no allocation to the next (the cluster is shared)."""
    yield
    left = [line.split()[0] for line in slurm_cluster.queue()]
    if left:
        slurm_cluster.command("scancel", *left)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")


def allocations_named(cluster: SlurmCluster, prefix: str) -> list[tuple[str, str, str, str]]:
    """(JobID, State, Start, End) of every allocation whose job name starts with ``prefix``,
    as Slurm's accounting lists them (an array's task as ``JOBID_TASK``)."""
    shown = cluster.command(
        "sacct", "-a", "-n", "-X", "-P", "-o", "JobID,JobName,State,Start,End",
        "-S", "2020-01-01",
    )  # fmt: skip
    rows = []
    for line in shown.splitlines():
        fields = line.split("|")
        if len(fields) == 5 and fields[1].startswith(prefix):
            state = fields[2].split()[0] if fields[2] else ""
            rows.append((fields[0], state, fields[3], fields[4]))
    return rows


def most_at_once(spans: list[tuple[str, str]]) -> int:
    """The most spans (ISO start, end) that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same second
        running += step
        most = max(most, running)
    return most


def test_an_array_is_one_slurm_job_array(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    name = f"arr-{secrets.token_hex(3)}"
    sent = run_cli(
        ["submit", "--array", "0-2%2", "--target", "cloud", "--provider", "slurm",
         "--region", f"{slurm_cluster.name}/cpu", "--name", name, "--timeout", "120",
         "--", "python3", "-c", REPORT],
        timeout=600,
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr[-3000:]
    array_id = sent.stdout.split()[0]
    wait_until(lambda: slurm_cluster.queue() == [], timeout=120, what="an empty queue")
    rows = wait_until(
        lambda: (
            found
            if len(found := allocations_named(slurm_cluster, f"gpulayer-{name}-")) >= 3
            and all(state for _, state, _, _ in found)
            and all(state not in ("RUNNING", "PENDING") for _, state, _, _ in found)
            else None
        ),
        timeout=60,
        what="the array's allocations in sacct",
    )
    # One sbatch: every allocation is a task of one Slurm job array, JOBID_0..JOBID_2.
    slurm_jobs = {job.split("_")[0] for job, _, _, _ in rows}
    assert len(slurm_jobs) == 1, rows
    (slurm_job,) = slurm_jobs
    assert sorted(job for job, _, _, _ in rows) == [f"{slurm_job}_{task}" for task in range(3)]
    # Each task ended by itself (its job succeeded), none cancelled.
    assert {state for _, state, _, _ in rows} == {"COMPLETED"}, rows
    # %2 is Slurm's: at most two tasks ran at once.
    assert most_at_once([(start, end) for _, _, start, end in rows]) <= 2, rows
    # Each job ran in its own task: SLURM_ARRAY_TASK_ID is its GPULAYER_ARRAY_INDEX.
    logs = run_cli(["logs", array_id], timeout=60)
    assert logs.returncode == 0, logs.stderr
    said = sorted(line for line in logs.stdout.splitlines() if line.startswith("index "))
    assert said == [f"index {i} task {i}" for i in range(3)], logs.stdout
    # Nothing left: no allocation, job key, worker or install dir of the jobs.
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")
    for job in array_jobs(array_id).values():
        wait_until(
            lambda job=job: no_worker_installs(slurm_cluster, tmp_path, job["id"]),
            timeout=30,
            what="the workers and their installs to go",
        )


def array_jobs(array_id: str) -> dict[int, dict[str, Any]]:
    """The array's jobs by index."""
    shown = json.loads(run_cli(["status", array_id, "--json"]).stdout)
    return {int(job["labels"]["gpulayer.array.index"]): job for job in shown["jobs"]}


def running_tasks(cluster: SlurmCluster) -> dict[str, str]:
    """Slurm job id -> state of every job in squeue, an array's tasks each on its own."""
    shown = cluster.command("squeue", "-h", "-r", "-o", "%i %T")
    pairs = (line.split() for line in shown.splitlines() if line.strip())
    return {job: state for job, state in pairs}


def test_cancelling_one_job_of_an_array_ends_only_its_task(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    sent = run_cli(
        ["submit", "--array", "0-1", "--target", "cloud", "--provider", "slurm",
         "--region", f"{slurm_cluster.name}/cpu", "--timeout", "300", "--detach",
         "--", "sleep", "300"],
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr[-3000:]
    array_id = sent.stdout.split()[0]
    wait_until(
        lambda: {job["state"] for job in array_jobs(array_id).values()} == {"running"},
        timeout=180,
        what="both jobs to run",
    )
    tasks = running_tasks(slurm_cluster)
    assert sorted(tasks.values()) == ["RUNNING", "RUNNING"], tasks
    (slurm_job,) = {task.split("_")[0] for task in tasks}
    assert sorted(tasks) == [f"{slurm_job}_0", f"{slurm_job}_1"], tasks
    first, second = array_jobs(array_id)[0]["id"], array_jobs(array_id)[1]["id"]
    assert run_cli(["cancel", first]).returncode == 0
    wait_until(
        lambda: f"{slurm_job}_0" not in running_tasks(slurm_cluster),
        timeout=60,
        what="the cancelled job's task to end",
    )
    # The other task and its job run on.
    assert running_tasks(slurm_cluster) == {f"{slurm_job}_1": "RUNNING"}
    assert array_jobs(array_id)[1]["state"] == "running"
    assert run_cli(["cancel", second]).returncode == 0
    wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")
    for task in (0, 1):
        state = wait_until(
            lambda task=task: slurm_cluster.ended_as(f"{slurm_job}_{task}"),
            timeout=60,
            what=f"task {task}'s end in sacct",
        )
        assert str(state) == "CANCELLED", (task, state)
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the jobs' keys to go")

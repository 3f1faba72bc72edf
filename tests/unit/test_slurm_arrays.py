"""A job array as one Slurm job array, in pure parts: the ``--array`` value, squeue's array
ids, the instance ids of tasks, and the batch script that starts each task's own job's
worker (run by a real shell, with a stand-in for Slurm's ``srun``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from gpulayer_slurm import batch, parsing
from gpulayer_slurm.allocations import Allocation, instance_id, split_instance_id
from gpulayer_slurm.queue_states import pending_note


@pytest.mark.parametrize(
    ("tasks", "limit", "expected"),
    [
        ([0, 1, 2], 2, "0-2%2"),
        ([2, 0, 1], None, "0-2"),
        ([1, 3, 4], None, "1,3-4"),
        ([7], 1, "7%1"),
    ],
)
def test_the_array_value_names_each_task_and_the_limit(
    tasks: list[int], limit: int | None, expected: str
) -> None:
    assert parsing.array_spec(tasks, limit) == expected


def test_an_array_has_a_task() -> None:
    with pytest.raises(ValueError, match="at least one task"):
        parsing.array_spec([])


def test_squeue_lines_of_an_array_are_one_entry_per_task() -> None:
    text = (
        "12_[2-3%2]|gpulayer-r-1|PENDING|JobArrayTaskLimit||INVALID|gpulayer:owner=o-1\n"
        "12_0|gpulayer-r-1|RUNNING|None|cpu1|1:00|gpulayer:owner=o-1\n"
        "13_[1,4]|gpulayer-r-2|PENDING|Resources||INVALID|\n"
        "14|gpulayer-r-3|RUNNING|None|cpu2|1:00|\n"
    )
    jobs = parsing.parse_squeue(text)
    assert [(j.job_id, j.state) for j in jobs] == [
        ("12_2", "PENDING"),
        ("12_3", "PENDING"),
        ("12_0", "RUNNING"),
        ("13_1", "PENDING"),
        ("13_4", "PENDING"),
        ("14", "RUNNING"),
    ]
    assert jobs[2].nodes == ("cpu1",)


def test_squeue_lists_each_task_of_an_array() -> None:
    assert " -r " in f" {batch.squeue_command()} "


def test_a_tasks_instance_id_names_its_task() -> None:
    given = instance_id("lab", "12_3", 0)
    assert given == "lab.12_3.0"
    assert split_instance_id(given) == ("lab", "12_3", 0)
    assert split_instance_id("lab.12_x.0") is None
    assert split_instance_id("lab.12_.0") is None


def test_a_task_is_found_by_its_arrays_name() -> None:
    task = Allocation(
        request_id="r-task2",
        job_id="j-2",
        cluster="lab",
        partition="cpu",
        instance_type="2cpu",
        nodes=1,
        array_name="gpulayer-sweep-r-task0",
    )
    assert task.job_name == "gpulayer-sweep-r-task0"


def test_a_task_held_by_its_arrays_limit_does_not_wait_for_capacity() -> None:
    held = parsing.QueuedJob("12_2", "gpulayer-r-1", "PENDING", "JobArrayTaskLimit", (), "")
    assert pending_note("12_2", held) == (
        "slurm job 12_2 waits for its array's earlier tasks (JobArrayTaskLimit)"
    )


def test_sbatch_makes_one_array_whose_tasks_start_their_own_jobs_worker() -> None:
    line = batch.sbatch_command(
        job_name="gpulayer-sweep-r-1",
        tags={"gpulayer:owner": "o-1"},
        partition="cpu",
        nodes=1,
        gpus_per_node=0,
        account=None,
        qos=None,
        time_limit=None,
        install_root="/var/tmp/g",
        job_id="j-0",
        array=("0-2%2", {0: "j-0", 1: "j-1", 2: "j-2"}),
    )
    assert "--array=0-2%2" in line
    assert "j-1" in line and "j-2" in line


@pytest.mark.parametrize(("task", "job"), [("0", "j-a"), ("5", "j-b")])
def test_each_task_launches_the_worker_of_its_own_job(tmp_path: Path, task: str, job: str) -> None:
    stand_in = tmp_path / "bin" / "srun"
    stand_in.parent.mkdir()
    # Slurm's srun is not here: this one says where the step would launch the worker.
    stand_in.write_text('#!/bin/sh\nshift\nexec "$@"\n')
    stand_in.chmod(0o755)
    script = batch.array_launcher("/var/tmp/g", {0: "j-a", 5: "j-b"})
    # The launcher loop never ends: the step's shell prints its dir instead.
    script = script.replace(" & wait $!", "")
    probe = script.replace(batch.launcher_loop(), 'echo "$GPULAYER_LAUNCH_DIR"')
    done = subprocess.run(
        ["sh", "-c", probe],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PATH": f"{stand_in.parent}:{os.environ['PATH']}",
             "SLURM_ARRAY_TASK_ID": task},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"/var/tmp/g/{job}"


def test_a_task_with_no_job_of_its_own_ends_at_once() -> None:
    script = batch.array_launcher("/var/tmp/g", {0: "j-a"})
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        timeout=10,
        env={**os.environ, "SLURM_ARRAY_TASK_ID": "3"},
    )
    assert done.returncode == 1

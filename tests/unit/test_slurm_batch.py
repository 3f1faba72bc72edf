"""The allocation's sbatch line, its tags, instance ids and squeue states. Pure."""

from __future__ import annotations

import shlex

import pytest
from gpulayer_slurm import batch
from gpulayer_slurm.allocations import instance_id, split_instance_id
from gpulayer_slurm.parsing import QueuedJob
from gpulayer_slurm.queue_states import instance_state as _instance_state


def test_sbatch_line_carries_the_shape_limits_and_tags() -> None:
    line = batch.sbatch_command(
        job_name="gpulayer-r1",
        tags={"gpulayer:job": "j1", "gpulayer:owner": "o-1", "odd": "has space"},
        partition="gpu",
        nodes=2,
        gpus_per_node=4,
        account="ml",
        qos="high",
        time_limit="0-01:10:00",
        install_root="/var/tmp/gpulayer",
        job_id="j1",
        exclude=["big1"],
    )
    args = shlex.split(line)
    assert args[:2] == ["sbatch", "--parsable"]
    for wanted in (
        "--job-name=gpulayer-r1", "--partition=gpu", "--nodes=2", "--gres=gpu:4",
        "--account=ml", "--qos=high", "--time=0-01:10:00", "--exclude=big1", "--exclusive", "--no-requeue",
    ):  # fmt: skip
        assert wanted in args
    # Only plain-word tags travel (a comment is no place for arbitrary text).
    assert "--comment=gpulayer:job=j1,gpulayer:owner=o-1" in args
    assert args[-1] == "--wrap=" + batch.node_launcher("/var/tmp/gpulayer", "j1")
    # The step's task names no install dir in its arguments: a stop ends whatever does.
    script = args[-1].removeprefix("--wrap=")
    step = shlex.split(script.split("; srun ", 1)[1])
    assert step[:3] == ["--ntasks-per-node=1", "sh", "-c"]
    assert "/var/tmp/gpulayer" not in step[3]
    # The step runs beside the shell, which returns 0 when told to end (COMPLETED).
    assert f"trap 'exit 0' {batch.END_SIGNAL};" in script and script.endswith(" & wait $!")
    assert shlex.split(batch.end_command(["7", "9"])) == [
        "scancel", "--batch", "--signal=USR1", "7", "9",
    ]  # fmt: skip


def test_a_cpu_allocation_asks_for_no_gres_and_no_time() -> None:
    args = shlex.split(
        batch.sbatch_command(
            job_name="gpulayer-r2",
            tags={},
            partition="cpu",
            nodes=1,
            gpus_per_node=0,
            account=None,
            qos=None,
            time_limit=None,
            install_root="/var/tmp/gpulayer",
            job_id="j2",
        )
    )
    assert not any(a.startswith(("--gres", "--time", "--account", "--qos")) for a in args)


def test_comment_round_trips() -> None:
    tags = {"gpulayer:job": "j1", "gpulayer:request": "r.1"}
    assert batch.parse_comment(batch.comment(tags)) == tags
    assert batch.parse_comment("(null)") == {}


def test_instance_ids_name_cluster_job_and_rank() -> None:
    assert split_instance_id(instance_id("lab.eu-1", "42", 3)) == ("lab.eu-1", "42", 3)
    assert split_instance_id("gpu1") is None
    assert split_instance_id("lab.x.1") is None


def job(state: str) -> QueuedJob:
    return QueuedJob("1", "gpulayer-r", state, "None", (), "")


@pytest.mark.parametrize(
    ("state", "ran", "expected"),
    [
        ("PENDING", False, ("pending", False)),
        ("PENDING", True, ("pending", True)),  # requeued after it ran
        ("RUNNING", True, ("running", False)),
        ("COMPLETING", True, ("stopping", False)),
        ("PREEMPTED", True, ("terminated", True)),
        ("TIMEOUT", True, ("terminated", False)),
        ("NODE_FAIL", True, ("terminated", False)),
    ],
)
def test_squeue_states(state: str, ran: bool, expected: tuple[str, bool]) -> None:
    assert _instance_state(job(state), ran=ran) == expected


def test_gone_from_the_queue_is_terminated() -> None:
    assert _instance_state(None, ran=True) == ("terminated", False)


def test_squeue_asks_for_ended_jobs_only_when_told() -> None:
    # squeue leaves ended jobs out by default; how one ended (PREEMPTED) needs --states=all.
    assert "--states=all" in shlex.split(batch.squeue_command(ended_too=True))
    assert "--states=all" not in shlex.split(batch.squeue_command())
    assert "--me" in shlex.split(batch.squeue_command(ended_too=True))


def test_a_preempted_node_outlives_its_allocation() -> None:
    from gpulayer_slurm.provider import SlurmProvider

    from gpulayer.cloud.protocol import OutlivesReclaim

    assert issubclass(SlurmProvider, OutlivesReclaim)
    assert not isinstance(object(), OutlivesReclaim)


def test_an_allocation_is_named_after_its_job_in_one_sbatch_word() -> None:
    from gpulayer_slurm.allocations import job_name

    assert job_name("r1a2", "resnet.v2_sweep-3") == "gpulayer-resnet.v2_sweep-3-r1a2"
    assert job_name("r1a2", None) == "gpulayer-r1a2"
    assert job_name("r1a2", "a b|c,d") == "gpulayer-a-b-c-d-r1a2"
    assert job_name("r1a2", "...") == "gpulayer-r1a2"
    assert job_name("r1a2", "x" * 63) == f"gpulayer-{'x' * 40}-r1a2"


def test_a_pending_allocation_waits_for_capacity_only_with_slurms_reason() -> None:
    from gpulayer_slurm.queue_states import pending_note as _pending_note

    pending = QueuedJob("7", "gpulayer-r", "PENDING", "Resources", (), "")
    assert _pending_note("7", pending) == (
        "waiting for capacity: slurm job 7 is pending (Resources)"
    )
    fresh = QueuedJob("7", "gpulayer-r", "PENDING", "None", (), "")
    assert _pending_note("7", fresh) == "slurm job 7 is pending, not yet scheduled"


def test_a_share_of_a_node_asks_for_its_gpus_cores_and_memory_not_the_node() -> None:
    args = shlex.split(
        batch.sbatch_command(
            job_name="gpulayer-r3",
            tags={},
            partition="gpu",
            nodes=1,
            gpus_per_node=1,
            account=None,
            qos=None,
            time_limit=None,
            install_root="/var/tmp/gpulayer",
            job_id="j3",
            share=batch.Share(cpus=2, memory_mb=2000, gpu_type="a100"),
        )
    )
    for wanted in ("--gres=gpu:a100:1", "--cpus-per-task=2", "--mem=2000M", "--ntasks-per-node=1"):
        assert wanted in args
    assert "--exclusive" not in args and "--mem=0" not in args
    untyped = batch.sbatch_command(
        job_name="gpulayer-r4", tags={}, partition="gpu", nodes=1, gpus_per_node=2,
        account=None, qos=None, time_limit=None, install_root="/var/tmp/gpulayer", job_id="j4",
        share=batch.Share(cpus=4, memory_mb=8000, gpu_type=None),
    )  # fmt: skip
    assert "--gres=gpu:2" in shlex.split(untyped)

"""Gangs in the pure scheduler: all N nodes on N distinct workers now, or none of them."""

from __future__ import annotations

from typing import Any

from gpulayer.scheduler import (
    Assignment,
    QueuedJob,
    WorkerIndex,
    fitting_now,
    never_reasons,
    plan_pass,
)
from gpulayer.spec import JobSpec
from tests.unit.test_scheduler_builders import A100_80, cuda_caps, job, worker


def gang(nodes: int, **resources: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "workload": {
                "kind": "distributed",
                "entrypoint": "train.py",
                "num_workers": nodes,
                "procs_per_worker": 2,
            },
            "resources": resources,
            "placement": {"target": "remote"},
        }
    )


def test_a_gang_takes_n_distinct_workers_in_one_pass_with_node_ranks() -> None:
    fleet = [worker(f"w{i}", cuda_caps(A100_80, 2)) for i in range(3)]
    result = plan_pass([QueuedJob("g", gang(3, accelerator="cuda"), 0.0)], fleet, now=1.0)
    assert sorted(a.node_rank for a in result.assignments) == [0, 1, 2]
    assert len({a.worker_id for a in result.assignments}) == 3


def test_a_gang_that_does_not_fit_whole_takes_nothing_and_smaller_jobs_backfill() -> None:
    fleet = [
        worker("w0", cuda_caps(A100_80, 1)),
        worker("w1", cuda_caps(A100_80, 1), busy_gpus=(0,)),
    ]
    queue = [
        QueuedJob("g", gang(2, accelerator="cuda"), 0.0),
        QueuedJob("small", job(accelerator="cuda"), 1.0),
    ]
    result = plan_pass(queue, fleet, now=2.0, starvation_seconds=300)
    # No partial gang holds w0's free GPU: the single job gets it.
    assert result.assignments == [Assignment("small", "w0", (0,))]


def test_a_starving_gang_reserves_n_workers_and_later_jobs_keep_off_them() -> None:
    fleet = [
        worker("w0", cuda_caps(A100_80, 1)),
        worker("w1", cuda_caps(A100_80, 1), busy_gpus=(0,)),
        worker("w2", cuda_caps(A100_80, 1), busy_gpus=(0,)),
    ]
    queue = [
        QueuedJob("g", gang(2, accelerator="cuda", gpu_count=1), 0.0),
        QueuedJob("small", job(accelerator="cuda"), 500.0),
    ]
    result = plan_pass(queue, fleet, now=1000.0, starvation_seconds=300)
    assert result.reservation is not None and result.reservation.job_id == "g"
    held = set(result.reservation.worker_ids)
    assert len(held) == 2 and "w0" in held  # the free one is closest
    assert result.assignments == []  # small may not take w0 from the starving gang


def test_fitting_now_counts_distinct_workers_up_to_n() -> None:
    fleet = [
        worker("w0", cuda_caps(A100_80, 2)),
        worker("w1", cuda_caps(A100_80, 2), busy_gpus=(0, 1)),
        worker("w2", cuda_caps(A100_80, 2)),
    ]
    index = WorkerIndex(fleet)
    assert fitting_now(gang(4, accelerator="cuda"), index) == 2
    assert fitting_now(gang(2, accelerator="cuda"), index) == 2


def test_never_reasons_needs_n_able_workers_and_says_how_many_could() -> None:
    fleet = [worker("w0", cuda_caps(A100_80, 2)), worker("w1", cuda_caps(A100_80, 2))]
    assert never_reasons(gang(2, accelerator="cuda"), fleet) is None
    reasons = never_reasons(gang(3, accelerator="cuda"), fleet)
    assert reasons is not None
    assert reasons[0] == "num_workers: 3 nodes need 3 distinct workers; 2 could run one"
    too_big = never_reasons(gang(2, accelerator="cuda", gpu_count=4), fleet)
    assert too_big is not None and any("worker w0" in r for r in too_big[1:])

"""WorkerSnapshot: self-consistency, idle view, and taking and giving back capacity."""

from __future__ import annotations

import pytest

from gpulayer.scheduler import InvalidSnapshot, WorkerSnapshot, idle_snapshot, reasons_now
from tests.unit.test_scheduler_builders import A100_80, caps, cuda_caps, job, worker


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"free_gpus": (0, 0)}, "worker w1: free_gpus lists a GPU twice"),
        ({"free_gpus": (0, 5)}, "worker w1: free_gpus: GPU 5 is not one of its GPUs (0, 1)"),
        ({"running": -1}, "worker w1: running may not be negative"),
    ],
)
def test_contradictions_are_typed_errors_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(InvalidSnapshot, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkerSnapshot(id="w1", name="w1", labels={}, capabilities=cuda_caps(A100_80, 2), **fields)


def test_free_gpus_are_kept_sorted_and_labels_read_only() -> None:
    w = WorkerSnapshot(
        id="w1", name="w1", labels={"a": "1"}, capabilities=cuda_caps(count=4), free_gpus=(3, 1)
    )
    assert w.free_gpus == (1, 3)
    with pytest.raises(TypeError):
        w.labels["a"] = "2"  # type: ignore[index]


def test_idle_frees_everything_and_reports_ready() -> None:
    w = worker("w1", cuda_caps(count=2), busy_gpus=(0, 1), busy_cores=16, state="lost")
    idle = w.idle()
    assert (idle.free_gpus, idle.free_cpu_cores, idle.free_memory_gb, idle.state, idle.running) == (
        (0, 1),
        16.0,
        128.0,
        "ready",
        0,
    )
    assert idle.id == w.id and idle.labels == w.labels


def test_idle_snapshot_builds_a_free_worker() -> None:
    w = idle_snapshot("w9", cuda_caps(count=3), labels={"pool": "a"})
    assert w.name == "w9" and w.free_gpus == (0, 1, 2) and w.free_cpu_cores == 16
    assert reasons_now(job(accelerator="cuda", gpu_count=3), w) == []


def test_take_then_release_restores_capacity() -> None:
    w = idle_snapshot("w1", cuda_caps(count=4))
    taken = w.take((1, 2), 6, 40)
    assert (taken.free_gpus, taken.free_cpu_cores, taken.free_memory_gb, taken.running) == (
        (0, 3),
        10,
        88,
        1,
    )
    back = taken.release((2, 1), 6, 40)
    assert back == w


@pytest.mark.parametrize(
    ("action", "gpus", "message"),
    [
        ("take", (0,), "GPU 0 is not free"),
        ("release", (1,), "GPU 1 is already free"),
        ("release", (7,), "GPU 7 is not one of its GPUs"),
    ],
)
def test_taking_or_returning_the_wrong_gpu_is_an_error(
    action: str, gpus: tuple[int, ...], message: str
) -> None:
    w = worker("w1", cuda_caps(count=2), busy_gpus=(0,))
    with pytest.raises(InvalidSnapshot, match=message):
        getattr(w, action)(gpus, 1, None)


def test_untracked_memory_compares_against_the_total_and_stays_untracked() -> None:
    w = WorkerSnapshot(
        id="w1", name="w1", labels={}, capabilities=caps(memory_gb=64.0), free_cpu_cores=16
    )
    assert w.host_memory_free == 64.0
    assert reasons_now(job(memory_gb=64), w) == []
    assert w.take((), 1, 32).free_memory_gb is None


def test_unknown_states_are_simply_not_ready() -> None:
    w = worker("w1", state="registering")
    assert reasons_now(job(), w) == ["worker is registering"]

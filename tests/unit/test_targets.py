"""Choosing a job's target at submit, against worker snapshots: pure."""

from __future__ import annotations

from typing import Any

from gpulayer.control.targets import WorkerView, choose_target
from gpulayer.scheduler import idle_snapshot, node_count
from gpulayer.spec import JobSpec
from gpulayer.spec.capabilities import GpuDevice, WorkerCapabilities

CPU_BOX = WorkerCapabilities(cpu_cores=8, memory_gb=32)
GPU_BOX = WorkerCapabilities(
    accelerator="cuda",
    cpu_cores=32,
    memory_gb=256,
    gpus=[
        GpuDevice(index=i, name="NVIDIA A100", memory_gb=80, compute_capability="8.0")
        for i in range(2)
    ],
)


def spec(**placement: Any) -> JobSpec:
    resources = placement.pop("resources", {})
    return JobSpec.model_validate(
        {
            "workload": {"kind": "command", "command": ["true"]},
            "placement": placement,
            "resources": resources,
        }
    )


def view(kind: str, caps: WorkerCapabilities, name: str = "w") -> WorkerView:
    return WorkerView(kind, idle_snapshot(name, caps, name=name))


def test_local_job_that_fits_stays_local() -> None:
    assert choose_target(spec(), [view("local", CPU_BOX)]).target == "local"


def test_local_job_that_can_never_fit_fails_with_reasons() -> None:
    decision = choose_target(
        spec(resources={"accelerator": "cuda", "gpu_count": 1}), [view("local", CPU_BOX)]
    )
    assert decision.target is None
    assert decision.message and "this machine" in decision.message and "cuda" in decision.message


def test_unfit_local_moves_to_the_fallback() -> None:
    job = spec(fallback_targets=["remote"], resources={"accelerator": "cuda"})
    decision = choose_target(job, [view("local", CPU_BOX), view("remote", GPU_BOX, "gpu1")])
    assert decision.target == "remote"
    assert any("trying remote" in note for note in decision.notes)


def test_remote_queues_or_fails_as_on_unschedulable_says() -> None:
    job = spec(target="remote", resources={"accelerator": "cuda", "gpu_count": 4})
    assert choose_target(job, [view("remote", GPU_BOX)]).target == "remote"  # queue: waits
    failing = spec(
        target="remote", on_unschedulable="fail", resources={"accelerator": "cuda", "gpu_count": 4}
    )
    decision = choose_target(failing, [view("remote", GPU_BOX, "gpu1")])
    assert decision.target is None and "worker gpu1" in (decision.message or "")


def test_cloud_needs_a_provider() -> None:
    assert choose_target(spec(target="cloud"), [], cloud_available=True).target == "cloud"
    decision = choose_target(
        spec(target="cloud", fallback_targets=["local"]), [view("local", CPU_BOX)]
    )
    assert decision.target == "local"
    assert choose_target(spec(target="cloud"), []).target is None


def gang_spec(nodes: int, **placement: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "workload": {"kind": "distributed", "entrypoint": "t.py", "num_workers": nodes},
            "placement": placement,
        }
    )


def test_a_gang_needs_n_distinct_workers_that_could_run_it() -> None:
    two = [view("remote", CPU_BOX, "a"), view("remote", CPU_BOX, "b")]
    assert choose_target(gang_spec(2, target="remote"), two).target == "remote"
    refused = choose_target(gang_spec(3, target="remote", on_unschedulable="fail"), two)
    assert refused.target is None
    assert refused.message is not None
    assert "num_workers: 3 nodes need 3 distinct workers; 2 could run one" in refused.message
    # One machine is one node: a local gang moves on to the next target.
    local = choose_target(
        gang_spec(2, target="local", fallback_targets=["remote"]), [view("local", CPU_BOX), *two]
    )
    assert local.target == "remote"


def test_a_cloud_gang_goes_to_the_cloud_unless_no_offer_could_ever_take_it() -> None:
    asked: list[int] = []

    def refusal(spec: JobSpec) -> str | None:
        asked.append(node_count(spec))
        return None

    taken = choose_target(
        gang_spec(2, target="cloud"),
        [view("remote", CPU_BOX)],
        cloud_available=True,
        cloud_refusal=refusal,
    )
    assert taken.target == "cloud"
    assert asked == [2]
    refused = choose_target(
        gang_spec(2, target="cloud"),
        [],
        cloud_available=True,
        cloud_refusal=lambda spec: "max_hourly_cost 0.5 USD is below every offer (per node)",
    )
    assert refused.target is None
    assert refused.message == "max_hourly_cost 0.5 USD is below every offer (per node)"


def test_the_default_target_applies_only_where_the_spec_names_none() -> None:
    from gpulayer.control.targets import with_default_target

    bare = {"workload": {"kind": "command", "command": ["true"]}}
    assert with_default_target(bare, "remote")["placement"] == {"target": "remote"}
    assert "placement" not in bare  # the caller's data is left as it was
    named = {**bare, "placement": {"target": "cloud"}}
    assert with_default_target(named, "remote")["placement"] == {"target": "cloud"}
    # remote among the fallbacks: the chain would name it twice, so the schema's default stays.
    chained = {**bare, "placement": {"fallback_targets": ["remote"]}}
    assert with_default_target(chained, "remote") == chained

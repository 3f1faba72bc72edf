"""Reading Slurm 22.05's text output (captured from the test cluster) into nodes, partitions,
queue entries and offers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gpulayer_slurm import parsing
from gpulayer_slurm.offers import PartitionShape, partition_shapes
from gpulayer_slurm.settings import SlurmCluster

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def test_a_record_keeps_values_with_spaces_and_equals_signs() -> None:
    nodes = parsing.parse_records(sample("scontrol_show_node.txt"))
    drained = next(n for n in nodes if n["NodeName"] == "cpu1")
    assert drained["OS"] == "Linux 6.18.44-fc-v1045 #1 SMP PREEMPT_DYNAMIC @0"
    assert drained["Reason"].startswith("disk check = pending [root@")
    assert drained["AllocTRES"] == ""


def test_nodes_read_with_their_gres_state_and_partitions() -> None:
    nodes = {n.name: n for n in parsing.parse_nodes(sample("scontrol_show_node.txt"))}
    assert set(nodes) == {"cpu1", "gpu1", "gpu2", "gpu3"}
    assert nodes["gpu1"].gpus() == ("a100", 2) and nodes["gpu1"].cpus == 4
    assert nodes["gpu3"].gpus() == (None, 4) and nodes["gpu3"].memory_mb == 16000
    assert nodes["cpu1"].gpus() == (None, 0) and nodes["cpu1"].partitions == ("cpu",)
    # IDLE+DRAIN runs nothing; MIXED runs jobs but is not idle; IDLE+PLANNED is held for a
    # job that waits.
    assert not nodes["cpu1"].usable
    assert nodes["gpu1"].usable and not nodes["gpu1"].idle
    assert nodes["gpu2"].usable and not nodes["gpu2"].idle
    assert nodes["gpu3"].idle


@pytest.mark.parametrize(
    ("state", "usable", "idle"),
    [
        ("IDLE", True, True),
        ("ALLOCATED", True, False),
        ("DOWN*", False, False),
        ("IDLE*", False, False),
        ("IDLE+NOT_RESPONDING", False, False),
        ("MIXED+DRAIN", False, False),
        ("INVAL", False, False),
        ("IDLE+COMPLETING", True, True),
    ],
)
def test_node_states(state: str, usable: bool, idle: bool) -> None:
    node = parsing.NodeInfo("n", ("p",), 1, 1000, (), state, None)
    assert (node.usable, node.idle) == (usable, idle)


def test_partitions_read_with_time_limits() -> None:
    parts = {p.name: p for p in parsing.parse_partitions(sample("scontrol_show_partition.txt"))}
    assert parts["gpu"].max_time_seconds == 2 * 3600
    assert parts["cpu"].max_time_seconds == 30 * 60
    assert parts["untyped"].max_time_seconds == 36 * 3600
    assert all(p.up for p in parts.values())


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("5", 300),
        ("05:30", 330),
        ("1:00:00", 3600),
        ("2-0", 2 * 86400),
        ("1-02:03", 86400 + 2 * 3600 + 180),
        ("1-02:03:04", 86400 + 2 * 3600 + 184),
    ],
)
def test_durations(text: str, seconds: int | None) -> None:
    assert parsing.parse_duration(text) == seconds


def test_a_bad_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        parsing.parse_duration("soon")


def test_format_duration_rounds_up_to_a_minute() -> None:
    assert parsing.format_duration(1) == "0-00:01:00"
    assert parsing.format_duration(3601) == "0-01:01:00"
    assert parsing.format_duration(86400 + 60) == "1-00:01:00"


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("(null)", []),
        ("gpu:a100:4", [("gpu", "a100", 4)]),
        ("gpu:4", [("gpu", None, 4)]),
        ("gpu:a100:4(S:0-1)", [("gpu", "a100", 4)]),
        (
            "gpu:a100:2(S:0,1),gpu:v100:1,shard:8",
            [("gpu", "a100", 2), ("gpu", "v100", 1), ("shard", None, 8)],
        ),
        ("gpu", [("gpu", None, 1)]),
    ],
)
def test_gres(text: str, items: list[tuple[str, str | None, int]]) -> None:
    assert [(g.name, g.type, g.count) for g in parsing.parse_gres(text)] == items


def test_squeue_lines_with_hostlists() -> None:
    jobs = parsing.parse_squeue(sample("squeue.txt"))
    assert [(j.job_id, j.state, j.reason) for j in jobs] == [
        ("2", "PENDING", "Priority"),
        ("1", "RUNNING", "None"),
    ]
    assert jobs[0].nodes == () and jobs[1].nodes == ("gpu1",)
    assert jobs[1].comment == "gpulayer:job=abc"
    # Time left until the limit: none for a pending job.
    assert jobs[0].time_left is None and jobs[1].time_left == 26 * 3600 + 3 * 60 + 4


def test_hostlists_expand() -> None:
    assert parsing.expand_hostlist("gpu[1-2,4],cpu1") == ["gpu1", "gpu2", "gpu4", "cpu1"]
    assert parsing.expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert parsing.expand_hostlist("(null)") == []


def whole_nodes(shapes: list[PartitionShape]) -> list[PartitionShape]:
    return [s for s in shapes if not s.shape.shared]


def test_offers_one_per_partition_and_shape() -> None:
    cluster = SlurmCluster(login="local", hourly_price={"gpu": 2.5}, gpu_types={"untyped": "h100"})
    shapes = partition_shapes(
        "lab",
        cluster,
        parsing.parse_partitions(sample("scontrol_show_partition.txt")),
        parsing.parse_nodes(sample("scontrol_show_node.txt")),
    )
    by_type = {(s.partition, s.instance_type): s for s in whole_nodes(shapes)}
    # cpu1 is drained: its partition offers nothing.
    assert set(by_type) == {("gpu", "4cpu-3.9gb-2xa100"), ("untyped", "8cpu-16gb-4xh100")}
    gpu = by_type["gpu", "4cpu-3.9gb-2xa100"]
    assert gpu.nodes == ("gpu1", "gpu2") and gpu.idle_nodes == 0
    assert gpu.max_time_seconds == 7200
    offer = gpu.offer
    assert (offer.provider, offer.region, offer.zone) == ("slurm", "lab/gpu", "gpu")
    assert (offer.accelerator, offer.gpu_name, offer.gpu_count) == ("cuda", "A100", 2)
    assert offer.hourly_price == 2.5 and offer.cpu_cores == 4
    untyped = by_type["untyped", "8cpu-16gb-4xh100"].offer
    assert untyped.gpu_name == "H100" and untyped.hourly_price == 0
    assert untyped.label == "slurm/untyped/8cpu-16gb-4xh100"


def test_offers_only_of_the_configured_partitions() -> None:
    cluster = SlurmCluster(login="local", partitions=["untyped"])
    shapes = partition_shapes(
        "lab",
        cluster,
        parsing.parse_partitions(sample("scontrol_show_partition.txt")),
        parsing.parse_nodes(sample("scontrol_show_node.txt")),
    )
    assert {s.partition for s in shapes} == {"untyped"}
    # An untyped GRES without a configured model: a GPU offer of no named model.
    assert shapes[0].offer.gpu_name is None and shapes[0].offer.gpu_count == 4


def _with_states(gpu1: str, gpu2: str) -> str:
    # The recorded lines, with the two a100 nodes put in other states.
    lines = []
    for line in sample("scontrol_show_node.txt").splitlines():
        for name, state in (("gpu1", gpu1), ("gpu2", gpu2)):
            if line.startswith(f"NodeName={name} "):
                line = re.sub(r" State=\S+ ", f" State={state} ", line)
        lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("gpu1", "gpu2", "nodes", "idle"),
    [
        ("MIXED", "IDLE+PLANNED", ("gpu1", "gpu2"), 0),  # as recorded
        ("IDLE", "IDLE", ("gpu1", "gpu2"), 2),
        ("IDLE", "ALLOCATED", ("gpu1", "gpu2"), 1),
        ("IDLE+COMPLETING", "MIXED", ("gpu1", "gpu2"), 1),
        ("IDLE+DRAIN", "IDLE", ("gpu2",), 1),
        ("DOWN*", "ALLOCATED", ("gpu2",), 0),
    ],
)
def test_an_offer_says_how_many_of_its_nodes_are_idle_now(
    gpu1: str, gpu2: str, nodes: tuple[str, ...], idle: int
) -> None:
    shapes = partition_shapes(
        "lab",
        SlurmCluster(login="local", partitions=["gpu"]),
        parsing.parse_partitions(sample("scontrol_show_partition.txt")),
        parsing.parse_nodes(_with_states(gpu1, gpu2)),
    )
    (shape,) = whole_nodes(shapes)
    assert shape.nodes == nodes
    assert shape.offer.idle_nodes == idle
    assert shape.offer.time_limit_seconds == 2 * 3600


def test_an_offer_carries_its_partitions_time_limit() -> None:
    partitions = sample("scontrol_show_partition.txt").replace(
        "MaxTime=1-12:00:00", "MaxTime=UNLIMITED"
    )
    shapes = partition_shapes(
        "lab",
        SlurmCluster(login="local"),
        parsing.parse_partitions(partitions),
        parsing.parse_nodes(sample("scontrol_show_node.txt")),
    )
    limits = {s.partition: s.offer.time_limit_seconds for s in shapes}
    assert limits == {"gpu": 7200, "untyped": None}
    idle = {s.partition: s.offer.idle_nodes for s in whole_nodes(shapes)}
    assert idle == {"gpu": 0, "untyped": 1}
    # In the offer's JSON, as `gpulayer offers --json` prints it.
    row = next(s for s in shapes if s.partition == "gpu").offer.model_dump(mode="json")
    assert (row["idle_nodes"], row["time_limit_seconds"]) == (0, 7200)


def test_a_partition_that_shares_nodes_offers_their_gpus_one_by_one() -> None:
    cluster = SlurmCluster(login="local", hourly_price={"gpu": 2.5}, gpu_types={"untyped": "h100"})
    partitions = sample("scontrol_show_partition.txt")
    nodes = parsing.parse_nodes(_with_states("MIXED", "IDLE"))
    shapes = partition_shapes("lab", cluster, parsing.parse_partitions(partitions), nodes)
    shared = {s.instance_type: s for s in shapes if s.partition == "gpu" and s.shape.shared}
    # A node of 2 a100, 4 cores and 4000 MB: one GPU with half of each, at half the price.
    (one,) = shared.values()
    assert one.instance_type == "2cpu-2gb-1xa100-shared"
    assert (one.offer.gpu_count, one.offer.cpu_cores, one.offer.hourly_price) == (1, 2, 1.25)
    assert (one.shape.memory_mb, one.nodes) == (2000, ("gpu1", "gpu2"))
    # A node partly taken (MIXED) may still take a share, not the whole node.
    assert one.offer.idle_nodes == 2
    whole = next(s for s in shapes if s.instance_type == "4cpu-3.9gb-2xa100")
    assert whole.offer.idle_nodes == 1
    four = sorted(s.instance_type for s in shapes if s.partition == "untyped" and s.shape.shared)
    assert four == [
        "2cpu-3.9gb-1xh100-shared",
        "4cpu-7.8gb-2xh100-shared",
        "6cpu-12gb-3xh100-shared",
    ]
    # A partition that gives jobs whole nodes offers whole nodes only.
    exclusive = partitions.replace("OverSubscribe=NO", "OverSubscribe=EXCLUSIVE")
    only = partition_shapes("lab", cluster, parsing.parse_partitions(exclusive), nodes)
    assert not any(s.shape.shared for s in only)

"""`gpulayer submit` flags onto spec data: pure, and flags win over the file."""

from __future__ import annotations

import pytest

from gpulayer.cli.spec_flags import (
    SubmitFlags,
    apply_flags,
    name_flags,
    parse_input,
    parse_secret,
)
from gpulayer.errors import UsageError
from gpulayer.sdk.paths import absolutize_paths
from gpulayer.spec.validate import validate_spec

FILE = {
    "name": "from-file",
    "workload": {"kind": "command", "command": ["python", "a.py"]},
    "resources": {"accelerator": "cuda", "gpu_count": 1},
    "env": {"A": "1", "B": "2"},
    "secrets": [{"name": "TOKEN", "key": "OLD"}],
    "labels": {"team": "x"},
}


def test_flags_override_file_fields() -> None:
    flags = SubmitFlags(
        argv=["python", "b.py"],
        name="flagged",
        gpus=4,
        env=["B=3", "C=4"],
        secrets=["TOKEN=NEW"],
        labels=["team=y"],
        target="remote",
        fallback=["cloud"],
        worker_labels=["pool=a"],
        timeout=5,
        max_hourly_cost=2.5,
        providers=["aws"],
        regions=["us-east-1"],
    )
    data = apply_flags(FILE, flags)
    spec = validate_spec(data)
    assert spec.name == "flagged"
    assert spec.workload.command == ["python", "b.py"]  # type: ignore[union-attr]
    assert spec.resources.gpu_count == 4 and spec.resources.accelerator == "cuda"
    assert spec.env == {"A": "1", "B": "3", "C": "4"}
    assert [(s.name, s.key) for s in spec.secrets] == [("TOKEN", "NEW")]
    assert spec.labels == {"team": "y"}
    assert spec.placement.targets == ["remote", "cloud"]
    assert spec.placement.worker_labels == {"pool": "a"}
    assert spec.placement.providers == ["aws"] and spec.placement.regions == ["us-east-1"]
    assert spec.timeout_seconds == 5 and spec.placement.max_hourly_cost == 2.5
    assert FILE["name"] == "from-file"  # the file's data is not changed in place


def test_profile_flag_replaces_the_files_accelerator() -> None:
    data = apply_flags(FILE, SubmitFlags(profile="mlx"))
    assert validate_spec(data).resources.accelerator == "mps"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("data.csv:in/data.csv", {"artifact": "data.csv", "path": "in/data.csv"}),
        ("s3://bucket/key:x", {"artifact": "s3://bucket/key", "path": "x"}),
        (
            "job:j-abc/out/model.pt:model.pt",
            {"artifact": "job:j-abc/out/model.pt", "path": "model.pt"},
        ),
    ],
)
def test_input_flag_splits_on_the_last_colon(value: str, expected: dict[str, str]) -> None:
    assert parse_input(value) == expected


@pytest.mark.parametrize("value", ["nocolon", ":x", "a:", "s3://bucket"])
def test_bad_input_flag(value: str) -> None:
    with pytest.raises(UsageError, match="--input"):
        parse_input(value)


def test_secret_flag_forms() -> None:
    assert parse_secret("HF_TOKEN") == {"name": "HF_TOKEN", "source": "env", "key": "HF_TOKEN"}
    assert parse_secret("A=B") == {"name": "A", "source": "env", "key": "B"}
    with pytest.raises(UsageError, match="--secret"):
        parse_secret("A=")


def test_no_command_and_no_file_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="ARGV"):
        apply_flags(None, SubmitFlags())


def test_local_paths_become_absolute_but_not_job_refs_or_urls() -> None:
    data = {
        "workload": {"kind": "function", "entrypoint": "m:f", "source": "src"},
        "inputs": [
            {"artifact": "data/x.csv", "path": "x"},
            {"artifact": "job:j-1/out", "path": "y"},
            {"artifact": "s3://b/k", "path": "z"},
        ],
    }
    absolutize_paths(data, "/home/me/project")
    assert data["workload"]["source"] == "/home/me/project/src"
    assert [i["artifact"] for i in data["inputs"]] == [
        "/home/me/project/data/x.csv",
        "job:j-1/out",
        "s3://b/k",
    ]


def test_nodes_runs_the_command_once_on_each_node() -> None:
    data = apply_flags(None, SubmitFlags(argv=["sh", "run.sh"], nodes=2))
    spec = validate_spec(data)
    assert spec.workload.kind == "distributed"
    assert spec.workload.command == ["sh", "run.sh"]
    assert spec.workload.num_workers == 2


def test_nodes_resizes_a_distributed_job_file() -> None:
    dist = {"workload": {"kind": "distributed", "entrypoint": "train.py", "num_workers": 4}}
    assert apply_flags(dist, SubmitFlags(nodes=2))["workload"]["num_workers"] == 2
    with pytest.raises(UsageError, match=r"^--nodes: the job file's workload is not distributed"):
        apply_flags(FILE, SubmitFlags(nodes=2))
    with pytest.raises(UsageError, match=r"^--nodes: expected a count of 1 or more, got 0"):
        apply_flags(None, SubmitFlags(argv=["true"], nodes=0))


def test_gpus_alone_ask_for_cuda_as_a_gpu_model_does() -> None:
    assert apply_flags(None, SubmitFlags(argv=["true"], gpus=2))["resources"] == {
        "accelerator": "cuda",
        "gpu_count": 2,
    }
    mps = apply_flags(None, SubmitFlags(argv=["true"], gpus=1, accelerator="mps"))
    assert mps["resources"]["accelerator"] == "mps"
    profiled = apply_flags(None, SubmitFlags(argv=["true"], gpus=1, profile="mlx"))
    assert "accelerator" not in profiled["resources"]
    assert apply_flags(None, SubmitFlags(argv=["true"], gpus=0))["resources"] == {"gpu_count": 0}


def test_refusals_name_the_flag_that_set_the_field() -> None:
    flags = SubmitFlags(argv=["true"], gpus=2, regions=["x"])
    lines = [
        "resources.gpu_count: a cpu job cannot ask for GPUs; set an accelerator",
        "placement.regions.0: unknown region",
        "resources.gpu_models: from the file, not a flag",
        "labels.team: not text",
    ]
    flags.labels = ["team=x"]
    assert name_flags(lines, flags) == [
        "--gpus: a cpu job cannot ask for GPUs; set an accelerator",
        "--region: unknown region",
        "resources.gpu_models: from the file, not a flag",
        "--label team: not text",
    ]

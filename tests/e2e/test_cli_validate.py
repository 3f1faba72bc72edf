"""`gpulayer validate` and `gpulayer schema` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import run_cli

REFERENCE = {
    "name": "finetune",
    "workload": {"kind": "command", "command": ["python", "train.py"], "source": None},
    "resources": {
        "accelerator": "cuda",
        "gpu_count": 2,
        "gpu_memory_gb": 40,
        "frameworks": {"torch": ">=2.2"},
    },
    "placement": {
        "target": "remote",
        "worker_labels": {"pool": "a100"},
        "on_unschedulable": "fail",
    },
    "env": {"EPOCHS": "10"},
    "secrets": [{"name": "HF_TOKEN", "source": "env", "key": "HF_TOKEN"}],
    "timeout_seconds": 7200,
    "retry": {"max_attempts": 2, "retry_on": ["worker_lost"]},
}


def test_reference_example_validates_as_json(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(json.dumps(REFERENCE))
    result = run_cli(["validate", "-f", str(job), "--json"])
    assert result.returncode == 0, result.stderr
    normalized = json.loads(result.stdout)
    assert normalized["resources"]["gpu_count"] == 2
    assert normalized["placement"]["strategy"] == "spread"
    assert normalized["placement"]["currency"] == "USD"
    assert normalized["secrets"][0]["key"] == "HF_TOKEN"


def test_yaml_file_is_accepted(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "workload:\n  kind: function\n  entrypoint: app:main\nresources:\n  profile: mlx\n"
    )
    result = run_cli(["validate", "-f", str(job), "--json"])
    assert result.returncode == 0, result.stderr
    normalized = json.loads(result.stdout)
    assert normalized["resources"]["accelerator"] == "mps"
    assert normalized["resources"]["frameworks"] == {"mlx": ">=0.10"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (
            '{"workload": {"kind": "command", "command": ["a"]}, "resources": {"gpus": 2}}',
            "error: resources.gpus: unknown field",
        ),
        ('{"workload": {"kind": "command", "command": []}, "name": "a b"}', "error: name:"),
        (
            '{"workload": {"kind": "command", "command": ["a"]}, "retry": {"max_attempts": '
            + str(10**30)
            + "}}",
            "error: retry.max_attempts: Input should be less than or equal to 100",
        ),
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must hold an object"),
    ],
)
def test_invalid_files_exit_2_with_field_lines(tmp_path: Path, content: str, expected: str) -> None:
    job = tmp_path / "job.json"
    job.write_text(content)
    result = run_cli(["validate", "-f", str(job)])
    assert result.returncode == 2
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert all(line.startswith("error: ") for line in result.stderr.strip().splitlines())


def test_several_errors_one_line_each(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "workload": {"kind": "command", "command": []},
                "env": {"RANK": "1"},
                "timeout_seconds": -1,
            }
        )
    )
    result = run_cli(["validate", "-f", str(job)])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert [line.split(":")[1].strip() for line in lines] == [
        "workload.command",
        "env",
        "timeout_seconds",
    ]


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = run_cli(["validate", "-f", str(tmp_path / "nope.json")])
    assert result.returncode == 2
    assert "--file: cannot read" in result.stderr and "Traceback" not in result.stderr


def test_schema_is_a_json_schema_that_rejects_unknown_fields() -> None:
    result = run_cli(["schema"])
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "JobSpec"
    assert "workload" in schema["required"]
    assert schema["additionalProperties"] is False
    assert schema["$defs"]["ResourceRequest"]["additionalProperties"] is False

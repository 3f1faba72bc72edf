"""`gpulayer plan` and `submit --dry-run` against the local control plane (this machine's own
worker) and the offline AWS catalog (aws enabled, no credentials): they say where a job would
run and why, and create nothing: no job, no upload, no instance."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.aws_env import without_aws_credentials
from tests.support.cli import run_cli

A100_GANG_OF_ONE = ["--target", "cloud", "--gpu", "A100", "--gpus", "8"]


@pytest.fixture(autouse=True)
def _no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_aws_credentials(monkeypatch, tmp_path)


@pytest.fixture
def aws_enabled(shared_home: Path) -> Iterator[Path]:
    providers = shared_home / "providers.yaml"
    providers.write_text("aws: {}\n")
    yield providers
    providers.unlink()


def _nothing_created() -> None:
    jobs = run_cli(["ls", "--json"])
    assert jobs.returncode == 0, jobs.stderr
    assert json.loads(jobs.stdout) == []
    instances = run_cli(["instances", "--all", "--json"])
    assert instances.returncode == 0, instances.stderr
    assert json.loads(instances.stdout) == []


@pytest.mark.slow
def test_plan_on_the_local_control_plane_names_this_machines_worker(shared_home: Path) -> None:
    shown = run_cli(["plan", "--", "python", "-c", "pass"], env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("plan: the job would run on local worker local")
    assert "1. target local: chosen" in lines
    assert all(len(line.rstrip()) <= 80 for line in lines)
    planned = json.loads(run_cli(["submit", "--dry-run", "--json", "--", "true"]).stdout)
    assert planned["target"] == "local"
    [step] = planned["tried"]
    assert [(w["rank"], w["worker_id"], w["fits_now"]) for w in step["workers"]] == [
        (1, "local", True)
    ]
    _nothing_created()


@pytest.mark.slow
def test_a_job_this_machine_cannot_run_is_planned_through_its_fallback(shared_home: Path) -> None:
    args = ["plan", "--accelerator", "cuda", "--gpus", "1", "--fallback", "cloud", "--", "true"]
    shown = run_cli(args)
    # No cloud provider is enabled: submit would refuse it, and plan says so, exiting 1.
    assert shown.returncode == 1, shown.stderr
    assert "plan: the job would be refused" in shown.stdout
    assert "1. target local: skipped: this machine: needs a cuda accelerator" in shown.stdout
    assert "1 worker turned down: needs a cuda accelerator, has cpu" in shown.stdout
    assert "2. fallback cloud: unschedulable: no cloud provider is installed" in shown.stdout
    _nothing_created()


@pytest.mark.slow
def test_plan_from_the_offline_catalog_prices_the_job_and_says_why_not_cheaper(
    aws_enabled: Path,
) -> None:
    planned = run_cli(["plan", "--json", *A100_GANG_OF_ONE, "--timeout", "7200", "--", "true"])
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["target"] == "cloud"
    cloud = plan["tried"][0]["cloud"]
    first = cloud["offers"][0]
    assert (first["instance_type"], first["hourly_price"]) == ("p4d.24xlarge", 21.957642)
    assert first["worst_case_cost"] == pytest.approx(2 * 21.957642)
    assert cloud["sources"] == {"aws": "catalog"}
    reasons = {row["instance_type"]: row["reason"] for row in cloud["cheaper_rejected"]}
    assert reasons["g4dn.xlarge"] == "gpu_count: not exactly 8 GPUs"
    assert all(row["hourly_price"] < 21.957642 for row in cloud["cheaper_rejected"])

    shown = run_cli(["submit", "--dry-run", *A100_GANG_OF_ONE, "--", "true"], env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert "first trying aws/us-east-1/p4d.24xlarge" in shown.stdout
    assert "first offer: 21.957642 USD/h, worst case unbounded" in shown.stdout
    assert "cheaper offers turned down" in shown.stdout
    _nothing_created()


@pytest.mark.slow
def test_a_cap_below_every_offer_is_refused_at_submit_from_the_catalog(aws_enabled: Path) -> None:
    capped = [*A100_GANG_OF_ONE, "--max-hourly-cost", "1", "--", "true"]
    refused = run_cli(["submit", "-d", *capped])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.count("\n") == 1
    assert (
        "max_hourly_cost 1 USD is below every offer that fits; the cheapest is "
        "aws/us-east-1/p4d.24xlarge at 21.957642 USD/h" in refused.stderr
    )
    cpu_only = run_cli(["submit", "--target", "cloud", "--max-hourly-cost", "0.001", "--", "true"])
    assert cpu_only.returncode == 2 and "the cheapest is aws/us-east-1/" in cpu_only.stderr
    planned = run_cli(["plan", *capped])
    assert planned.returncode == 1
    assert planned.stdout.startswith("plan: the job would be refused: max_hourly_cost 1 USD")
    _nothing_created()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpus", "two", "--", "true"], "'--gpus'"),
        (["--target", "mars", "--", "true"], "--target: "),
        (["--json", "-f", "/nonexistent/job.yaml"], "/nonexistent/job.yaml"),
    ],
)
def test_bad_input_to_plan_is_one_line_and_exit_2(
    shared_home: Path, args: list[str], expected: str
) -> None:
    result = run_cli(["plan", *args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


@pytest.mark.slow
def test_a_missing_local_input_is_refused_by_plan_as_by_submit(
    shared_home: Path, tmp_path: Path
) -> None:
    args = ["--input", "absent.csv:data/train.csv", "--", "true"]
    planned = run_cli(["plan", *args], cwd=tmp_path)
    submitted = run_cli(["submit", "-d", *args], cwd=tmp_path)
    assert planned.returncode == submitted.returncode == 2, (planned.stderr, submitted.stderr)
    assert planned.stderr == submitted.stderr
    assert "inputs[0].artifact" in planned.stderr and planned.stderr.count("\n") == 1
    (tmp_path / "absent.csv").write_text("a,b\n")
    assert run_cli(["plan", *args], cwd=tmp_path).returncode == 0
    _nothing_created()


@pytest.mark.slow
def test_json_without_dry_run_is_a_usage_error(shared_home: Path) -> None:
    result = run_cli(["submit", "--json", "--", "true"])
    assert result.returncode == 2 and "--json: only with --dry-run" in result.stderr
    _nothing_created()


@pytest.mark.slow
def test_gpus_without_an_accelerator_mean_cuda_as_the_readme_writes(
    shared_home: Path, aws_enabled: Path
) -> None:
    # README: `plan --gpus 1 --fallback cloud`; it said `a cpu job cannot ask for GPUs`, exit 2.
    shown = run_cli(["plan", "--gpus", "1", "--fallback", "cloud", "--json", "--", "true"])
    assert shown.returncode in (0, 1), shown.stderr
    planned = json.loads(shown.stdout)
    assert [step["target"] for step in planned["tried"]] == ["local", "cloud"]
    _nothing_created()


@pytest.mark.slow
def test_a_refusal_names_the_flag_typed_not_the_field(shared_home: Path) -> None:
    refused = run_cli(["plan", "--accelerator", "cpu", "--gpus", "2", "--", "true"])
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: --gpus: a cpu job cannot ask for GPUs; set an accelerator"
    ]
    timeout = run_cli(["submit", "--timeout", "-5", "--", "true"])
    assert timeout.returncode == 2
    assert timeout.stderr.startswith("error: --timeout: "), timeout.stderr
    _nothing_created()


@pytest.mark.slow
def test_a_job_no_catalog_offer_can_take_is_refused_at_submit_and_by_plan(
    aws_enabled: Path,
) -> None:
    # No AWS offer has 3 H100s: plan said `chosen` and submit made a job that then failed.
    three = ["--target", "cloud", "--gpu", "H100", "--gpus", "3", "--", "true"]
    refused = run_cli(["submit", "-d", *three])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.count("\n") == 1
    reason = "no aws offer has exactly 3 H100"
    assert reason in refused.stderr, refused.stderr
    planned = run_cli(["plan", *three])
    assert planned.returncode == 1, planned.stdout
    assert planned.stdout.startswith(f"plan: the job would be refused: {reason}")
    _nothing_created()


@pytest.mark.slow
def test_an_unknown_gpu_model_is_refused_by_submit_and_plan_as_by_offers(
    aws_enabled: Path,
) -> None:
    unknown = ["--target", "cloud", "--gpu", "A101", "--gpus", "1", "--", "true"]
    offers = run_cli(["offers", "--gpu", "A101"])
    assert offers.returncode == 2
    expected = "'A101' is not a GPU model gpulayer knows"
    assert expected in offers.stderr
    for command in (["submit", "-d"], ["plan"]):
        refused = run_cli([*command, *unknown])
        assert refused.returncode == 2, (command, refused.stdout, refused.stderr)
        assert refused.stderr == f"error: --gpu: {expected}; closest: A10, A100\n" or (
            refused.stderr.startswith(f"error: --gpu: {expected}")
        ), refused.stderr
    _nothing_created()


@pytest.mark.slow
def test_a_rented_machine_has_the_submitting_machines_architecture(
    aws_enabled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without cpu_arch the cheapest CUDA offer was an ARM g5g, where x86_64 wheels do not exist.
    planned = json.loads(
        run_cli(["plan", "--json", "--target", "cloud", "--gpus", "1", "--", "true"]).stdout
    )
    cloud = planned["tried"][0]["cloud"]
    assert (cloud["cpu_arch"], cloud["cpu_arch_from"]) == (["x86_64"], "submitting machine")
    assert cloud["offers"][0]["instance_type"] == "g4dn.xlarge"
    shown = run_cli(["plan", "--target", "cloud", "--gpus", "1", "--", "true"])
    assert "machines: x86_64, as the submitting machine" in shown.stdout

    either = tmp_path / "either.json"
    either.write_text(
        json.dumps(
            {
                "workload": {"kind": "command", "command": ["true"]},
                "resources": {
                    "accelerator": "cuda",
                    "gpu_count": 1,
                    "cpu_arch": ["x86_64", "arm64"],
                },
                "placement": {"target": "cloud"},
            }
        )
    )
    planned = json.loads(run_cli(["plan", "--json", "-f", str(either)]).stdout)
    assert planned["tried"][0]["cloud"]["offers"][0]["instance_type"] == "g5g.xlarge"

    # An API client on an ARM machine says so; its jobs' machines are ARM ones.
    monkeypatch.setenv("GPULAYER_HOME", str(aws_enabled.parent))
    from gpulayer.sdk.connection import connect

    client = connect().client
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "resources": {"accelerator": "cuda", "gpu_count": 1},
        "placement": {"target": "cloud"},
    }
    arm = client.request("POST", "/v1/plan", {"spec": spec, "client_arch": "arm64"})
    assert arm["tried"][0]["cloud"]["offers"][0]["instance_type"] == "g5g.xlarge"
    _nothing_created()

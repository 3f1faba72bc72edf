"""`gpulayer offers` as a new user runs it: offline, without credentials or providers.yaml, the
control plane ranks every installed provider's catalog as submit would, and says why when it
lists nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.aws_env import without_aws_credentials
from tests.support.cli import run_cli


@pytest.fixture(autouse=True)
def _no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_aws_credentials(monkeypatch, tmp_path)


@pytest.mark.slow
def test_offline_offers_list_a100_and_say_how_to_enable(shared_home: Path) -> None:
    result = run_cli(["offers", "--provider", "aws", "--gpu", "A100"], env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if "p4d.24xlarge" in line]
    assert lines and all("8x A100 40GB" in line and line.startswith("aws*") for line in lines)
    assert all(len(line.rstrip()) <= 80 for line in result.stdout.splitlines())
    assert "aws catalog as of " in result.stdout
    assert f"add `aws: {{}}` to {shared_home / 'providers.yaml'}" in result.stderr

    as_json = run_cli(["offers", "--gpu", "a100", "--json", "-n", "100"])
    rows = json.loads(as_json.stdout)
    aws_rows = [row for row in rows if row["provider"] == "aws"]
    assert {row["instance_type"] for row in aws_rows} == {"p4d.24xlarge", "p4de.24xlarge"}
    # Every installed plugin's catalog is listed (gpulayer-gcp's A2 machines among them).
    assert {row["provider"] for row in rows} <= {"aws", "gcp"}
    assert all(row["zones"] and row["enabled"] is False for row in rows)
    assert "no provider is enabled" in as_json.stderr
    prices = [row["hourly_price"] for row in rows]
    assert prices == sorted(prices)


@pytest.mark.slow
def test_offers_that_list_nothing_say_why(shared_home: Path) -> None:
    exact = run_cli(["offers", "--provider", "aws", "--gpu", "A100", "--gpus", "1"])
    assert exact.returncode == 0, exact.stderr
    assert "no offers" in exact.stdout
    assert "no aws offer has exactly 1 A100; p4d.24xlarge has 8 at 21.95764 USD/h" in exact.stderr
    typo = run_cli(["offers", "--provider", "awss"])
    assert typo.returncode == 2
    assert "'awss' is not an installed provider; did you mean 'aws'?" in typo.stderr
    size_only = run_cli(["offers", "--gpu", "80GB"])
    assert size_only.returncode == 2 and "gpu_models" in size_only.stderr


@pytest.mark.slow
def test_offers_route_refuses_bad_input_with_the_field_named(shared_home: Path) -> None:
    from gpulayer.errors import SpecError, UsageError
    from gpulayer.sdk.connection import connect

    client = connect().client
    with pytest.raises(SpecError, match=r"resources\.gpu_models"):
        client.offers({"workload": {"kind": "command", "command": ["x"]},
                       "resources": {"gpu_models": ["H100"]}})  # fmt: skip
    with pytest.raises(UsageError, match="limit"):
        client.offers({"workload": {"kind": "command", "command": ["x"]}}, limit=-1)
    listing = client.offers(
        {"workload": {"kind": "command", "command": ["x"]},
         "resources": {"accelerator": "cuda", "gpu_count": 8, "gpu_models": ["H100"]}},
        limit=1,
    )  # fmt: skip
    assert [row["instance_type"] for row in listing["offers"]] == ["p5.48xlarge"]
    assert listing["total"] > 1 and listing["providers_file"].startswith(str(shared_home))


@pytest.mark.slow
def test_submit_gpu_flag_asks_for_a_cuda_gpu(shared_home: Path) -> None:
    sent = run_cli(["submit", "--gpu", "H100", "--gpu", "A100-80GB", "--detach", "--", "true"])
    # This machine has no CUDA GPU: the job is refused at submit, naming what it lacks.
    assert sent.returncode == 2, sent.stderr
    assert "needs a cuda accelerator, has cpu" in sent.stderr
    bad = run_cli(["submit", "--gpu", "80GB", "--", "true"])
    assert bad.returncode == 2 and "error: --gpu: " in bad.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--gpu", "FOO"], "error: --gpu: 'FOO' is not a GPU model gpulayer knows"),
        (["--gpu", "A101"], "error: --gpu: 'A101' is not a GPU model gpulayer knows; closest: A10"),
        (["--region", "mars-1"], "error: --region: 'mars-1' is not a region of"),
        (["--region", "eu-wst-1"], "closest: eu-west-1"),
        (["--provider", "nope"], "error: --provider: 'nope' is not an installed provider"),
    ],
)
def test_names_no_offer_could_have_are_usage_errors(
    shared_home: Path, args: list[str], expected: str
) -> None:
    result = run_cli(["offers", *args])
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert expected in result.stderr and result.stderr.count("\n") == 1
    assert "no offers" not in result.stdout


@pytest.mark.slow
def test_limit_zero_lists_every_offer(shared_home: Path) -> None:
    default = json.loads(run_cli(["offers", "--provider", "aws", "--json"]).stdout)
    everything = run_cli(["offers", "--provider", "aws", "--json", "-n", "0"])
    assert everything.returncode == 0, everything.stderr
    rows = json.loads(everything.stdout)
    assert len(default) == 30 and len(rows) > 30
    assert rows[:30] == default
    # The table too: every row, and no "N more" line.
    table = run_cli(["offers", "--provider", "aws", "-n", "0"], env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    listed = [line for line in table.stdout.splitlines() if line.startswith("aws* ")]
    assert len(listed) == len(rows) and "--limit to see them" not in table.stdout

"""A cloud that accepts connections and never answers: the CLI shows what it waits for after two
seconds, gives the provider up after `gpulayer.cloud_wait_seconds` with a one-line reason, and
a quick answer prints no such line.

The "cloud" is a TCP listener on 127.0.0.1 that accepts and then says nothing, where AWS's EC2
endpoint and price sources or GCP's Billing API would be; botocore alone would wait 60 s per
read and retry."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.gce_server import PROJECT, compute_server, service_account_file

WAIT_SECONDS = 4
# Far below what botocore's own timeouts would take (4 attempts of a 60 s read), far above
# the bound plus a control plane's start on a loaded machine.
CLI_LIMIT_SECONDS = 90
PROGRESS = "gpulayer: waiting for the providers' offers"


class SilentListener:
    """Accepts every connection, reads nothing and answers nothing."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed
            self.accepted.append(connection)

    def close(self) -> None:
        self._server.close()
        for connection in self.accepted:
            connection.close()
        self._thread.join(timeout=5)


@pytest.fixture
def silent_aws(
    shared_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SilentListener]:
    listener = SilentListener()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    config = {
        "gpulayer": {"cloud_wait_seconds": WAIT_SECONDS},
        "aws": {
            "regions": ["us-east-1"],
            "endpoint_url": f"http://127.0.0.1:{listener.port}",
            "cache_dir": str(tmp_path / "aws-cache"),
        },
    }
    providers = shared_home / "providers.yaml"
    providers.write_text(yaml.safe_dump(config))
    yield listener
    providers.unlink()
    listener.close()


@pytest.mark.slow
def test_offers_give_a_silent_cloud_up_and_list_its_catalog(silent_aws: SilentListener) -> None:
    result = run_cli(
        ["offers", "--provider", "aws", "--gpu", "A100", "--json"], timeout=CLI_LIMIT_SECONDS
    )
    assert result.returncode == 0, result.stderr
    assert silent_aws.accepted, "the offer search never reached the endpoint"
    assert PROGRESS in result.stderr
    assert "gpulayer.cloud_wait_seconds" in result.stderr
    reason = f"aws: no answer within {WAIT_SECONDS} s while listing offers"
    lines = [line for line in result.stderr.splitlines() if reason in line]
    assert len(lines) == 1 and "listing its catalog" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    # stdout stays the JSON alone: the catalog's offers, marked as such.
    offers = json.loads(result.stdout)
    assert offers and all(o["source"] == "catalog" and o["enabled"] for o in offers)


@pytest.mark.slow
def test_a_plan_gives_a_silent_cloud_up_and_plans_from_its_catalog(
    silent_aws: SilentListener,
) -> None:
    args = ["plan", "--target", "cloud", "--accelerator", "cuda", "--gpus", "1", "--json"]
    result = run_cli([*args, "--", "true"], timeout=CLI_LIMIT_SECONDS)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert silent_aws.accepted
    assert "gpulayer: waiting for the providers' offers for the plan" in result.stderr
    planned = json.dumps(json.loads(result.stdout))  # stdout is the plan alone
    assert f"aws: no answer within {WAIT_SECONDS} s while listing offers" in planned
    assert "listing its catalog" in planned


@pytest.mark.slow
def test_a_cloud_job_with_only_a_silent_cloud_fails_with_the_reason(
    silent_aws: SilentListener,
) -> None:
    result = run_cli(
        [
            "submit",
            "--target",
            "cloud",
            "--provider",
            "aws",
            "--accelerator",
            "cuda",
            "--gpus",
            "1",
            "--",
            "true",
        ],
        timeout=CLI_LIMIT_SECONDS,
    )
    assert result.returncode == 1, (result.stdout, result.stderr)
    # While the placement waits, the job's log (streamed to stderr) says on what.
    assert f"waiting for aws to list offers (given up after {WAIT_SECONDS} s)" in result.stderr
    ending = [line for line in result.stderr.splitlines() if " failed: " in line]
    assert len(ending) == 1, result.stderr
    assert f"aws: no answer within {WAIT_SECONDS} s while listing offers" in ending[0]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_quick_answer_shows_no_progress_line(shared_home: Path) -> None:
    assert not (shared_home / "providers.yaml").exists()
    # Warm the control plane first: its start is not a cloud call.
    assert run_cli(["offers", "--provider", "gcp", "-n", "1", "--json"]).returncode == 0
    result = run_cli(["offers", "--provider", "gcp", "--gpu", "L4", "--json"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)
    assert "waiting for" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("source", ["bulk", "api"])
def test_an_aws_catalog_refresh_gives_a_silent_price_source_up(
    silent_aws: SilentListener, shared_home: Path, source: str
) -> None:
    providers = shared_home / "providers.yaml"
    config = yaml.safe_load(providers.read_text())
    config["aws"]["price_list_url"] = config["aws"]["endpoint_url"]
    providers.write_text(yaml.safe_dump(config))
    result = run_cli(["catalog", "refresh", "aws", "--source", source], timeout=CLI_LIMIT_SECONDS)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert silent_aws.accepted
    assert "gpulayer: reading aws prices for us-east-1" in result.stderr
    what = "the price list http://127.0.0.1:" if source == "bulk" else "the Pricing API"
    assert result.stderr.splitlines()[-1].startswith(
        f"error: aws: no answer within {WAIT_SECONDS} s from {what}"
    ), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_gcp_catalog_refresh_gives_a_silent_billing_api_up(
    shared_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = SilentListener()
    try:
        # Tokens come from the test's Compute server; the Billing API is the silent listener.
        with compute_server({}) as server:
            key = service_account_file(tmp_path / "google", f"{server.url}/token")
            monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
            gcp = {
                "project": PROJECT,
                "regions": ["us-central1"],
                "endpoint_url": f"http://127.0.0.1:{listener.port}",
                "cache_dir": str(tmp_path / "gcp-cache"),
            }
            providers = shared_home / "providers.yaml"
            config = {"gpulayer": {"cloud_wait_seconds": WAIT_SECONDS}, "gcp": gcp}
            providers.write_text(yaml.safe_dump(config))
            try:
                result = run_cli(["catalog", "refresh", "gcp"], timeout=CLI_LIMIT_SECONDS)
            finally:
                providers.unlink()
    finally:
        listener.close()
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert listener.accepted
    assert "gpulayer: reading gcp prices for us-central1" in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"error: gcp: no answer within {WAIT_SECONDS} s from the Cloud Billing Catalog API"
    ), result.stderr

"""The AWS provider against moto's EC2 server, run in its own process on a free local port.

Validation of AMIs, instance types and key pairs is on, so moto refuses what AWS would. moto
is reset before each test. Instance types and zones never change in moto, so their cache is
shared by the tests that do not test caching itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gpulayer_aws import AwsProvider

from gpulayer.cloud.protocol import LaunchRequest

HERE = Path(__file__).parent
UBUNTU = {"owners": ["099720109477"], "name": "ubuntu/images/hvm-ssd/ubuntu-*-amd64-server-*"}


class Moto:
    """Handle on the running server: its URL, boto3 clients, and the test layer's controls."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _post(self, path: str, data: Any = None) -> Any:
        body = json.dumps(data).encode() if data is not None else b""
        request = urllib.request.Request(f"{self.url}{path}", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=30).read()
        self._post("/_gpulayer/reset")

    def fault(
        self,
        action: str,
        code: str,
        *,
        message: str | None = None,
        status: int = 400,
        times: int | None = None,
        match: dict[str, str] | None = None,
    ) -> None:
        """Answer ``action`` ("*" for any) with error ``code``, ``times`` times (None: always),
        only for requests whose parameters include ``match``."""
        self._post(
            "/_gpulayer/faults",
            {
                "action": action,
                "code": code,
                "message": message or f"{code} (injected by the test)",
                "status": status,
                "times": times,
                "match": match or {},
            },
        )

    def set_products(self, products: list[dict[str, Any]]) -> None:
        self._post("/_gpulayer/products", {"products": products})

    def calls(self, action: str | None = None) -> list[dict[str, str]]:
        calls: list[dict[str, str]] = self._post("/_gpulayer/calls")
        return [c for c in calls if action is None or c.get("Action") == action]

    def ec2(self, region: str = "us-east-1") -> Any:
        import boto3

        return boto3.client("ec2", region_name=region, endpoint_url=self.url)


def _start_server() -> tuple[subprocess.Popen[str], str]:
    env = {
        **os.environ,
        "MOTO_ENABLE_AMI_VALIDATION": "true",
        "MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION": "true",
        "MOTO_ENABLE_KEYPAIR_VALIDATION": "true",
    }
    process = subprocess.Popen(
        [sys.executable, str(HERE / "moto_app.py")],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert process.stdout is not None
    port = process.stdout.readline().strip()
    if not port.isdigit():
        process.kill()
        raise RuntimeError(f"moto server did not start (said {port!r})")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=5).read()
            return process, url
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.1)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    process, url = _start_server()
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Dummy credentials, and no user AWS configuration read."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def moto(moto_server: str, aws_env: None) -> Moto:
    handle = Moto(moto_server)
    handle.reset()
    return handle


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("aws-cache")


@pytest.fixture
def settings(moto: Moto, shared_cache: Path) -> dict[str, Any]:
    return {
        "regions": ["us-east-1"],
        "endpoint_url": moto.url,
        "price_source": "catalog",
        "cache_dir": str(shared_cache),
        "image": UBUNTU,
        "poll_seconds": 0.05,
        "terminate_timeout_seconds": 30,
    }


@pytest.fixture
def provider(settings: dict[str, Any]) -> AwsProvider:
    return AwsProvider(settings)


@pytest.fixture(scope="session")
def ssh_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode()


@pytest.fixture
def make_request(ssh_key: str) -> Callable[..., LaunchRequest]:
    def make(request_id: str = "req-1", **changes: Any) -> LaunchRequest:
        fields: dict[str, Any] = {
            "request_id": request_id,
            "job_id": "job-1",
            "owner": "owner-test",
            "ssh_public_key": ssh_key,
            "allowed_ssh_cidr": "203.0.113.7/32",
        }
        fields.update(changes)
        return LaunchRequest(**fields)

    return make

"""The cloud core's small pieces: typed errors, GPU facts, launch requests and instances,
the disk cache and settings validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from gpulayer.cloud.cache import DiskCache, default_cache_dir
from gpulayer.cloud.errors import (
    AuthError,
    CapacityError,
    ProviderError,
    ProviderNotInstalled,
    ProviderSettingsError,
    QuotaError,
)
from gpulayer.cloud.protocol import Instance, LaunchRequest
from gpulayer.cloud.settings import load_settings
from gpulayer.errors import GpulayerError, UsageError
from gpulayer.hardware.gpus import cuda_capability, gpu_facts, nominal_memory_gb, normalize_gpu_name


def test_errors_are_typed_and_scoped() -> None:
    capacity = CapacityError("zone", "aws", "us-east-1", "us-east-1a", "no g5 left")
    assert isinstance(capacity, ProviderError) and isinstance(capacity, GpulayerError)
    assert str(capacity) == "aws: no g5 left (zone us-east-1a)"
    assert (capacity.kind, capacity.scope, capacity.message) == ("capacity", "zone", "no g5 left")
    quota = QuotaError("aws", "us-west-2", "vCPU limit")
    assert (quota.scope, quota.region, str(quota)) == (
        "region",
        "us-west-2",
        "aws: vCPU limit (region us-west-2)",
    )
    auth = AuthError("gcp", "bad key")
    assert (auth.scope, str(auth)) == ("provider", "gcp: bad key (provider gcp)")
    # Without a region a region-scoped error can only block the provider.
    assert QuotaError("aws", None, "limit").scope == "provider"
    with pytest.raises(ValueError, match="scope"):
        CapacityError("planet", "aws", None, None, "x")  # type: ignore[arg-type]
    assert ProviderSettingsError("x").exit_code == 2
    assert isinstance(ProviderSettingsError("x"), UsageError)
    assert ProviderNotInstalled("x").exit_code == 2


@pytest.mark.parametrize(
    ("name", "capability", "memory"),
    [
        ("A100", "8.0", 40),
        ("NVIDIA A100-80GB", "8.0", 80),
        ("a10g", "8.6", 24),
        ("NVIDIA Tesla T4", "7.5", 16),
        ("T4g", "7.5", 16),
        ("L40s", "8.9", 48),
        ("H100", "9.0", 80),
        ("H200", "9.0", 141),
        ("V100", "7.0", 16),
        ("RTX PRO Server 6000", "12.0", 96),
    ],
)
def test_gpu_facts(name: str, capability: str, memory: float) -> None:
    facts = gpu_facts(name)
    assert facts is not None
    assert (facts.compute_capability, nominal_memory_gb(name, None), facts.memory_kind) == (
        capability,
        memory,
        "dedicated",
    )
    assert cuda_capability(name) == capability


def test_unknown_and_non_cuda_gpus_have_no_facts() -> None:
    for name in ("Radeon Pro V520", "Gaudi HL-205", "Inferentia", "", None):
        assert gpu_facts(name) is None
    assert normalize_gpu_name("NVIDIA GeForce RTX-4090") == "RTX4090"


def _request(**changes: object) -> LaunchRequest:
    fields: dict[str, object] = {
        "request_id": "job-7.attempt-1",
        "job_id": "job-7",
        "owner": "ctl-1",
        "ssh_public_key": "ssh-ed25519 AAAAC3 test",
        "allowed_ssh_cidr": "198.51.100.4",
    }
    fields.update(changes)
    return LaunchRequest.model_validate(fields)


def test_launch_request_validation() -> None:
    request = _request(private_ip="10.231.0.5", disk_gb=100)
    assert request.allowed_ssh_cidr == "198.51.100.4/32"
    assert request.private_ip == "10.231.0.5"
    assert _request(allowed_ssh_cidr="2001:db8::1").allowed_ssh_cidr == "2001:db8::1/128"
    for field, value in [
        ("request_id", "has space"),
        ("request_id", "x" * 65),
        ("allowed_ssh_cidr", "everywhere"),
        ("private_ip", "10.0.0.300"),
        ("disk_gb", 0),
        ("owner", ""),
        ("extra", 1),
    ]:
        with pytest.raises(ValidationError, match=field):
            _request(**{field: value})


def test_instance_liveness() -> None:
    instance = Instance(id="i-1", provider="aws", region="r", state="running", ssh_user="u")
    assert instance.live
    assert not instance.model_copy(update={"state": "terminated"}).live


def test_disk_cache_ttl(tmp_path: Path) -> None:
    now = [1000.0]
    cache = DiskCache(tmp_path / "c", clock=lambda: now[0])
    assert cache.get("k|https://x/y", 60) is None
    cache.put("k|https://x/y", {"a": [1, 2]})
    assert cache.get("k|https://x/y", 60) == {"a": [1, 2]}
    now[0] += 61
    assert cache.get("k|https://x/y", 60) is None
    fetched: list[int] = []

    def fetch() -> list[int]:
        fetched.append(1)
        return [len(fetched)]

    assert cache.get_or_fetch("n", 60, fetch) == [1]
    assert cache.get_or_fetch("n", 60, fetch) == [1]
    now[0] += 120
    assert cache.get_or_fetch("n", 60, fetch) == [2]
    cache.path("n").write_text("garbage")
    assert cache.get("n", 60) is None
    assert all(p.name.endswith(".json") for p in (tmp_path / "c").iterdir())


def test_default_cache_dir_under_gpulayer_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    assert default_cache_dir("aws") == tmp_path / "cache" / "aws"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    regions: list[str] = ["r1"]
    retries: int = 3


def test_load_settings_names_fields() -> None:
    assert load_settings(_Settings, None, provider="p").regions == ["r1"]
    made = _Settings(retries=5)
    assert load_settings(_Settings, made, provider="p") is made
    with pytest.raises(ProviderSettingsError) as info:
        load_settings(_Settings, {"retries": "many", "colour": 1}, provider="p")
    message = str(info.value)
    assert message.startswith("p: settings: ")
    assert "retries: Input should be a valid integer" in message
    assert "colour: unknown setting" in message

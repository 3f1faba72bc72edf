"""The GCP provider through google-cloud-compute against the Compute REST test server.

Credentials come through google-auth's default chain (a service-account key whose token
endpoint is the server's); no call leaves this machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpulayer_gcp import GcpProvider

from gpulayer.cloud.errors import AuthError, CapacityError, QuotaError
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.protocol import LaunchRequest
from tests.support.gce_server import (
    PROJECT,
    ComputeServer,
    ZoneShape,
    compute_server,
    isolated_google_env,
    service_account_file,
)

IMAGE = ("images-project", "worker")
ZONES = {
    "us-central1-a": ZoneShape(
        {
            "n1-standard-4": (4, 15360, None, 0),
            "g2-standard-4": (4, 16384, "nvidia-l4", 1),
            "e2-standard-2": (2, 8192, None, 0),
            "c3-standard-4": (4, 16384, None, 0),  # a family the catalog does not price
        },
        {"nvidia-tesla-t4": 2},
    ),
    "us-central1-b": ZoneShape({"n1-standard-4": (4, 15360, None, 0)}, {}),
}


@pytest.fixture(scope="module")
def gce() -> Iterator[ComputeServer]:
    with compute_server(ZONES, images={IMAGE: "worker-20300101"}) as server:
        yield server


@pytest.fixture
def server(
    gce: ComputeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ComputeServer]:
    for name, value in isolated_google_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    key = service_account_file(tmp_path / "google", f"{gce.url}/token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    gce.reset()
    yield gce
    assert gce.errors == []


def provider(server: ComputeServer, tmp_path: Path, **settings: Any) -> GcpProvider:
    return GcpProvider(
        {
            "endpoint_url": server.url,
            "cache_dir": str(tmp_path / "cache"),
            "allow_spot": True,
            **settings,
        }
    )


def request(request_id: str = "r-test1", *, spot: bool = False, **extra: Any) -> LaunchRequest:
    return LaunchRequest(
        request_id=request_id,
        job_id="j-test",
        owner="o-test",
        ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGxhYg lab",
        allowed_ssh_cidr="203.0.113.7/32",
        image={"project": IMAGE[0], "family": IMAGE[1], "ssh_user": "worker"},
        spot=spot,
        **extra,
    )


def offer(offers: list[Offer], instance_type: str, *, spot: bool = False) -> Offer:
    return next(o for o in offers if o.instance_type == instance_type and o.spot == spot)


def test_offers_come_from_the_zone_lists_priced_by_the_catalog(
    server: ComputeServer, tmp_path: Path
) -> None:
    gcp = provider(server, tmp_path)
    offers = gcp.offers(OfferQuery(accelerator="cuda"))
    # The project's project id comes from the credentials.
    assert {c["project"] for c in server.calls()} == {PROJECT}
    found = {(o.zone, o.instance_type, o.spot) for o in offers}
    assert ("us-central1-a", "g2-standard-4", False) in found
    assert ("us-central1-a", "n1-standard-4+1xt4", True) in found
    assert ("us-central1-a", "n1-standard-4+2xt4", False) in found
    # The zone allows 2 T4 per instance; 4 is a size GCE has, but not there.
    assert not any("+4xt4" in o.instance_type for o in offers)
    # us-central1-b lists no GPU at all.
    assert {o.zone for o in offers} == {"us-central1-a"}
    l4 = offer(offers, "g2-standard-4")
    assert (l4.gpu_name, l4.gpu_count, l4.gpu_memory_gb, l4.cuda_compute_capability) == (
        "L4",
        1,
        24,
        "8.9",
    )
    prices = gcp._source.catalog().regions["us-central1"]
    t4 = offer(offers, "n1-standard-4+2xt4")
    expected = prices.machines["n1-standard-4"][0] + 2 * prices.gpus["nvidia-tesla-t4"][0]
    assert t4.hourly_price == pytest.approx(expected)

    # Only the families the catalog knows are asked for.
    (listing,) = server.calls("machineTypes.aggregatedList")
    assert "c3" not in listing["filter"] and "n1" in listing["filter"]

    # The zone lists are cached: a second query costs no call.
    before = len(server.calls())
    cpu = gcp.offers(OfferQuery(cpu_cores=2))
    assert len(server.calls()) == before
    assert {o.instance_type for o in cpu} == {"n1-standard-4", "e2-standard-2"}
    assert {o.zone for o in cpu if o.instance_type == "n1-standard-4"} == {
        "us-central1-a",
        "us-central1-b",
    }


def test_catalog_offers_need_no_credentials_and_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in isolated_google_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    gcp = GcpProvider({"endpoint_url": "http://127.0.0.1:9", "cache_dir": str(tmp_path)})
    offers = gcp.catalog_offers(OfferQuery(accelerator="cuda", gpu_count=8), everywhere=True)
    assert offers and {o.gpu_count for o in offers} >= {8}
    catalog_regions = set(gcp._source.catalog().regions)
    assert {o.region for o in offers} <= catalog_regions
    with pytest.raises(AuthError, match="no Google Cloud credentials"):
        gcp.offers(OfferQuery(accelerator="cuda"))


def test_launch_builds_the_instance_and_its_firewall_rule(
    server: ComputeServer, tmp_path: Path
) -> None:
    gcp = provider(server, tmp_path, python="/opt/py/bin/python3")
    offers = gcp.offers(OfferQuery(accelerator="cuda"))
    chosen = offer(offers, "n1-standard-4+2xt4", spot=True)
    instance = gcp.launch(chosen, request(spot=True, disk_gb=120))

    assert instance.id == "us-central1-a/gpulayer-r-test1"
    assert (instance.state, instance.ssh_user, instance.spot) == ("running", "worker", True)
    assert instance.instance_type == "n1-standard-4+2xt4"
    assert instance.hourly_price == pytest.approx(chosen.hourly_price)
    assert instance.tags["gpulayer:python"] == "/opt/py/bin/python3"
    assert instance.tags["gpulayer:request"] == "r-test1"
    assert instance.public_ip is None and instance.ssh_host == instance.private_ip

    (insert,) = server.calls("instances.insert")
    body = insert["body"]
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-4"
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2,
        }
    ]
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }
    disk = body["disks"][0]
    assert disk["autoDelete"] and disk["initializeParams"]["diskSizeGb"] == "120"
    assert disk["initializeParams"]["sourceImage"].endswith(
        "/projects/images-project/global/images/worker-20300101"
    )
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert metadata["ssh-keys"] == "worker:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGxhYg lab"
    assert metadata["block-project-ssh-keys"] == "true"
    assert body["labels"] == {
        "gpulayer-owner": "o-test",
        "gpulayer-job": "j-test",
        "gpulayer-request": "r-test1",
    }
    rule = server.firewalls["gpulayer-r-test1"]
    assert rule["sourceRanges"] == ["203.0.113.7/32"]
    assert rule["targetTags"] == body["tags"]["items"] == ["gpulayer-r-test1"]
    assert rule["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]

    # Launch again with the same request: the same instance, no second insert.
    assert gcp.launch(chosen, request(spot=True, disk_gb=120)).id == instance.id
    assert len(server.calls("instances.insert")) == 1


def test_an_on_demand_cpu_machine_migrates_and_has_an_external_address(
    server: ComputeServer, tmp_path: Path
) -> None:
    gcp = provider(server, tmp_path, use_private_ip=False)
    chosen = offer(gcp.offers(OfferQuery(cpu_cores=2)), "e2-standard-2")
    gcp.launch(chosen, request("r-cpu"))
    (insert,) = server.calls("instances.insert")
    body = insert["body"]
    assert "guestAccelerators" not in body
    assert body["scheduling"] == {"onHostMaintenance": "MIGRATE", "automaticRestart": True}
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"


def test_terminate_deletes_instance_and_rule_and_is_idempotent(
    server: ComputeServer, tmp_path: Path
) -> None:
    gcp = provider(server, tmp_path)
    chosen = offer(gcp.offers(OfferQuery(cpu_cores=2)), "e2-standard-2")
    first = gcp.launch(chosen, request("r-one"))
    second = gcp.launch(chosen, request("r-two"))
    assert {i.id for i in gcp.list_owned({"gpulayer:owner": "o-test"})} == {first.id, second.id}
    assert [i.id for i in gcp.list_owned({"gpulayer:request": "r-two"})] == [second.id]
    # The label filter reached the server.
    assert (
        'labels.gpulayer-request = "r-two"'
        in server.calls("instances.aggregatedList")[-1]["filter"]
    )

    gcp.terminate([first.id])
    gcp.terminate([first.id])  # gone already: fine
    assert gcp.describe([first.id, second.id]) == [gcp.describe([second.id])[0]]
    assert sorted(server.firewalls) == ["gpulayer-r-two"]
    gcp.terminate([second.id])
    assert server.instances == {} and server.firewalls == {}


def test_a_preempted_spot_instance_is_reported_as_preempted(
    server: ComputeServer, tmp_path: Path
) -> None:
    gcp = provider(server, tmp_path)
    chosen = offer(gcp.offers(OfferQuery(cpu_cores=2)), "e2-standard-2", spot=True)
    spot = gcp.launch(chosen, request("r-spot", spot=True))
    ours = gcp.launch(chosen, request("r-ours", spot=True))
    server.preempt("us-central1-a", "gpulayer-r-spot")
    gcp.terminate([ours.id])

    described = {i.id: i for i in gcp.describe([spot.id, ours.id])}
    assert described[spot.id].state == "terminated" and described[spot.id].reclaimed
    # One it ended itself is simply gone, not preempted.
    assert ours.id not in described
    assert gcp.describe([ours.id]) == []


@pytest.mark.parametrize(
    ("fault", "expected", "scope"),
    [
        (
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
                "message": "The zone does "
                "not have enough resources available to fulfill the request.",
            },
            CapacityError,
            "zone",
        ),
        (
            {"code": "QUOTA_EXCEEDED", "message": "Quota 'NVIDIA_T4_GPUS' exceeded."},
            QuotaError,
            "region",
        ),
        (
            {"code": "quotaExceeded", "message": "Quota exceeded", "kind": "http", "status": 403},
            QuotaError,
            "region",
        ),
        (
            {
                "code": "forbidden",
                "message": "Required 'compute.instances.create' permission",
                "kind": "http",
                "status": 403,
            },
            AuthError,
            "provider",
        ),
    ],
)
def test_launch_failures_are_typed_and_leave_nothing(
    server: ComputeServer,
    tmp_path: Path,
    fault: dict[str, Any],
    expected: type[Exception],
    scope: str,
) -> None:
    gcp = provider(server, tmp_path)
    chosen = offer(gcp.offers(OfferQuery(cpu_cores=2)), "e2-standard-2")
    server.fault("instances.insert", **fault)
    with pytest.raises(expected) as info:
        gcp.launch(chosen, request("r-fails"))
    assert info.value.scope == scope
    if scope == "zone":
        assert info.value.zone == "us-central1-a"
    if scope == "region":
        assert info.value.region == "us-central1"
    assert server.instances == {} and server.firewalls == {}


def test_rejected_credentials_are_an_auth_error(server: ComputeServer, tmp_path: Path) -> None:
    server.reject_credentials()
    gcp = provider(server, tmp_path)
    with pytest.raises(AuthError, match="credentials rejected") as info:
        gcp.offers(OfferQuery(cpu_cores=2))
    assert info.value.scope == "provider"


def test_the_key_file_is_the_one_the_submitting_shell_names(
    server: ComputeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from gpulayer.cloud.credentials import using_environment

    key = os.environ["GOOGLE_APPLICATION_CREDENTIALS"]
    # The control plane's own environment names no key file; the submit's does.
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(AuthError):
        provider(server, tmp_path).list_owned({"gpulayer:job": "j-none"})
    with using_environment({"GOOGLE_APPLICATION_CREDENTIALS": key}):
        assert provider(server, tmp_path).list_owned({"gpulayer:job": "j-none"}) == []
    gone = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gone.json")}
    with (
        using_environment(gone),
        pytest.raises(AuthError, match=r"GOOGLE_APPLICATION_CREDENTIALS .*gone\.json"),
    ):
        provider(server, tmp_path).list_owned({"gpulayer:job": "j-none"})

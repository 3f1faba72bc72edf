"""The slurm provider's verbs on the real cluster: an allocation per launch, found again by its
name and comment, ended by scancel with nothing left in squeue."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from gpulayer_slurm import SlurmProvider

from gpulayer.cloud import LaunchRequest, OfferQuery, generate_keypair
from gpulayer.cloud.lifecycle.links import ssh_target
from gpulayer.ssh.errors import SshError
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.target import SshTarget
from tests.integration.slurm.conftest import slurm_section
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def provider_for(cluster: SlurmCluster, tmp_path: Path, **settings: object) -> SlurmProvider:
    section = slurm_section(
        cluster, authorized_keys=str(cluster.on_nodes(cluster.shared_authorized_keys))
    )
    return SlurmProvider({**section, "state_dir": str(tmp_path / "state"), **settings})


def request_for(tmp_path: Path, count: int = 1, **extra: object) -> LaunchRequest:
    request_id = f"r{secrets.token_hex(6)}"
    keys = generate_keypair(tmp_path / "keys", request_id)
    return LaunchRequest(
        request_id=request_id,
        job_id=f"j{secrets.token_hex(4)}",
        owner="test-owner",
        tags={"gpulayer:owner": "test-owner", "gpulayer:request": request_id},
        ssh_public_key=keys.public_key,
        allowed_ssh_cidr="10.0.0.0/8",
        count=count,
        **extra,
    )


def test_one_node_allocation_runs_answers_ssh_and_scancel_leaves_nothing(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    request = request_for(tmp_path, time_limit_seconds=120)
    notes: list[str] = []
    instance = provider.launch(offer, request.model_copy(update={"progress": notes.append}))
    node = instance.tags["gpulayer:slurm-node"]
    assert instance.state == "running" and instance.ssh_host == slurm_cluster.hosts[node].address
    # A retried launch of the same request is the same allocation.
    assert provider.launch(offer, request).id == instance.id
    queue = slurm_cluster.queue()
    assert len(queue) == 1 and f"gpulayer-{request.request_id} RUNNING" in queue[0]
    # Slurm's time limit is the job's timeout plus the margin (600 s), within the partition's.
    shown = slurm_cluster.command("scontrol", "-o", "show", "job", queue[0].split()[0])
    assert "TimeLimit=00:12:00" in shown and "Comment=gpulayer:owner=test-owner" in shown
    # The node refuses this machine's logins: it is reached through the login node, with the
    # login node's own credential for that hop and the job's key on the node.
    key = tmp_path / "keys" / request.request_id
    direct = SshTarget(instance.ssh_host, 22, instance.ssh_user, key_path=key)
    with pytest.raises(SshError):
        SshSession(direct).connect(timeout=10)
    assert slurm_cluster.login is not None and instance.ssh_via is not None
    assert (instance.ssh_via.host, instance.ssh_via.port) == (
        slurm_cluster.login.address,
        slurm_cluster.login.port,
    )
    assert instance.ssh_via.host_key  # pinned when the provider first logged in
    with SshSession(ssh_target(instance.model_dump(mode="json"), key)) as session:
        assert session.run("echo here").stdout == "here\n"
        assert session.run("echo $SSH_CONNECTION").stdout.split()[0] == (
            slurm_cluster.login.address
        )
    assert [i.state for i in provider.describe([instance.id])] == ["running"]
    assert [i.id for i in provider.list_owned({"gpulayer:request": request.request_id})] == [
        instance.id
    ]
    provider.terminate([instance.id])
    assert slurm_cluster.queue() == []
    assert [i.state for i in provider.describe([instance.id])] == ["terminated"]
    assert request.request_id not in slurm_cluster.shared_authorized_keys.read_text()
    provider.terminate([instance.id])  # gone already is fine


def test_a_gang_is_one_allocation_in_node_order(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery(accelerator="cuda", gpu_count=2)))
    request = request_for(tmp_path, count=2)
    nodes = provider.launch_gang(offer, request)
    assert [n.tags["gpulayer:slurm-node"] for n in nodes] == ["gpu1", "gpu2"]
    assert [n.tags["gpulayer:node-rank"] for n in nodes] == ["0", "1"]
    assert len(slurm_cluster.queue()) == 1
    provider.terminate([n.id for n in nodes])
    assert slurm_cluster.queue() == []


def test_pending_past_its_timeout_is_a_capacity_error_and_is_cancelled(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from gpulayer.cloud import CapacityError

    provider = provider_for(slurm_cluster, tmp_path, pending_timeout_seconds=3)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    holder = provider.launch_gang(offer, request_for(tmp_path, count=2))
    notes: list[str] = []
    with pytest.raises(CapacityError, match=r"still pending after 3 s \(Resources\)"):
        provider.launch(offer, request_for(tmp_path, progress=notes.append))
    assert any("waiting for capacity" in n and "(Resources)" in n for n in notes), notes
    assert [line.split()[2] for line in slurm_cluster.queue()] == ["RUNNING"]
    provider.terminate([node.id for node in holder])  # ends once every node is let go of
    assert slurm_cluster.queue() == []


def test_a_login_node_of_its_own_lists_offers_with_slurms_commands_here(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine reaches slurmctld too: `login: local` runs scontrol here.
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf_path))
    provider = SlurmProvider(
        {"clusters": {"here": {"login": "local"}}, "state_dir": str(tmp_path / "state")}
    )
    offers = provider.offers(OfferQuery())
    assert {(o.region, o.zone, o.instance_type) for o in offers} == {
        ("here/gpu", "gpu", "4cpu-3.9gb-2xa100"),
        ("here/gpu", "gpu", "2cpu-2gb-1xa100-shared"),
        ("here/cpu", "cpu", "2cpu-2gb"),
    }
    shapes = {s.partition: s for s in provider.partition_shapes("here")}
    assert shapes["cpu"].idle_nodes == 2 and shapes["cpu"].max_time_seconds == 1800


def test_an_unreachable_login_node_is_one_line_naming_the_cluster(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from gpulayer.cloud import ProviderError

    section = slurm_section(slurm_cluster)
    section["clusters"][slurm_cluster.name]["port"] = 1  # type: ignore[index]
    provider = SlurmProvider({**section, "state_dir": str(tmp_path / "state")})
    with pytest.raises(ProviderError) as caught:
        provider.offers(OfferQuery())
    text = str(caught.value)
    assert f"{slurm_cluster.name}: login node" in text and "\n" not in text

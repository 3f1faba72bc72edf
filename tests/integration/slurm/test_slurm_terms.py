"""Slurm as its users know it, on the real cluster: a partition is named like a region, the
allocation carries the job's name, a job that ended by itself ends its allocation COMPLETED
(``scancel`` is for a cancel) as ``sacct`` records it, and the provider keeps one SSH connection
to the login node."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulayer.cloud import Instance, OfferQuery, ProviderError, node_install_dir
from tests.e2e_cloud.journey import last_job, wait_until
from tests.integration.slurm.test_journeys import (
    no_job_keys,
    status,
    submit_detached,
    write_providers,
)
from tests.integration.slurm.test_provider import provider_for, request_for
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _queue_left_empty(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """A test that failed half-way leaves no allocation to the next (the cluster is shared)."""
    yield
    left = [line.split()[0] for line in slurm_cluster.queue()]
    if left:
        slurm_cluster.command("scancel", *left)
        wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")


def ended_as(cluster: SlurmCluster, slurm_job: str, timeout: float = 60) -> str:
    """The state an allocation ended in, as Slurm's accounting records it (``sacct``, the
    witness its users read), once the end has reached the database."""
    return str(
        wait_until(
            lambda: cluster.ended_as(slurm_job),
            timeout=timeout,
            what=f"slurm job {slurm_job}'s end in sacct",
        )
    )


def slurm_job_of(instance: Instance) -> str:
    return instance.tags["gpulayer:slurm-job"]


# --- partitions are regions -------------------------------------------------------------------


def test_a_partition_is_a_region_of_its_cluster(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    name = slurm_cluster.name
    every = provider.offers(OfferQuery())
    assert {(o.region, o.zone) for o in every} == {(f"{name}/gpu", "gpu"), (f"{name}/cpu", "cpu")}
    # The cluster's name takes all its partitions, CLUSTER/PARTITION one of them.
    assert {o.region for o in provider.offers(OfferQuery(regions=(name,)))} == {
        f"{name}/gpu",
        f"{name}/cpu",
    }
    assert [o.region for o in provider.offers(OfferQuery(regions=(f"{name}/cpu",)))] == [
        f"{name}/cpu"
    ]
    # Another provider's region is none of this one's business.
    assert provider.offers(OfferQuery(regions=("us-east-1",))) == []
    # A partition named without its cluster, or a cluster's partition that does not exist,
    # is one line saying what to write.
    with pytest.raises(ProviderError) as bare:
        provider.offers(OfferQuery(regions=("gpu",)))
    assert f"'gpu' is a partition of cluster {name}: name it {name}/gpu" in str(bare.value)
    with pytest.raises(ProviderError) as missing:
        provider.offers(OfferQuery(regions=(f"{name}/big",)))
    assert f"cluster {name} has no partition 'big' (partitions: cpu, gpu)" in str(missing.value)


def test_plan_names_the_partition_a_job_asks_for(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    name = slurm_cluster.name
    planned = run_cli(
        ["plan", "--target", "cloud", "--provider", "slurm", "--region", f"{name}/gpu",
         "--json", "--", "true"]
    )  # fmt: skip
    assert planned.returncode == 0, planned.stderr
    offers = json.loads(planned.stdout)["tried"][0]["cloud"]["offers"]
    assert {(o["region"], o["zone"]) for o in offers} == {(f"{name}/gpu", "gpu")}
    # The partition's name alone: the plan says what to write.
    bare = run_cli(
        ["plan", "--target", "cloud", "--provider", "slurm", "--region", "gpu", "--", "true"]
    )
    said = " ".join((bare.stdout + bare.stderr).split())
    assert f"'gpu' is a partition of cluster {name}: name it {name}/gpu" in said, said


# --- the allocation's name ----------------------------------------------------------------------


def test_the_allocation_is_named_after_the_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    request = request_for(tmp_path, job_name="resnet.v2_sweep-3")
    instance = provider.launch(offer, request)
    try:
        (line,) = slurm_cluster.queue()
        assert line.split()[1] == f"gpulayer-resnet.v2_sweep-3-{request.request_id}", line
        # Found again by its name after a restart: a new provider on the same state dir.
        again = provider_for(slurm_cluster, tmp_path)
        assert again.launch(offer, request).id == instance.id
        assert [i.id for i in again.list_owned({"gpulayer:request": request.request_id})] == [
            instance.id
        ]
    finally:
        provider.terminate([instance.id])
    assert slurm_cluster.queue() == []


# --- how an allocation ends ---------------------------------------------------------------------


def run_a_worker(cluster: SlurmCluster, instance: Instance, job_id: str) -> tuple[SshdHost, str]:
    """What a bootstrap hands to the allocation's step (DIR/launch): a stand-in worker that
    sleeps, started by the step on the node; the node and its install dir."""
    node = cluster.hosts[instance.tags["gpulayer:slurm-node"]]
    assert instance.install_root is not None
    install_dir = node_install_dir(instance.install_root, job_id)
    node.run(
        f"mkdir -p {install_dir} && echo 'echo $$ > {install_dir}/worker.pid; exec sleep 300' "
        f"> {install_dir}/launch.tmp && mv {install_dir}/launch.tmp {install_dir}/launch",
        check=True,
    )
    wait_until(lambda: node.exists(f"{install_dir}/worker.pid"), timeout=30, what="the worker")
    return node, install_dir


def stop_the_worker(node: SshdHost, install_dir: str) -> None:
    """What the drain does before a terminate: the worker stopped, its install dir removed."""
    pid = node.read_text(f"{install_dir}/worker.pid").strip()
    node.run(f"kill {pid}; rm -rf {install_dir}", check=True)


def test_an_allocation_whose_job_ended_by_itself_ends_completed(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    request = request_for(tmp_path)
    instance = provider.launch(offer, request)
    node, install_dir = run_a_worker(slurm_cluster, instance, request.job_id)
    stop_the_worker(node, install_dir)
    provider.finish([instance.id])
    # The batch script returned: no scancel.
    assert ended_as(slurm_cluster, slurm_job_of(instance)) == "COMPLETED"
    assert [i.state for i in provider.describe([instance.id])] == ["terminated"]
    assert request.request_id not in slurm_cluster.shared_authorized_keys.read_text()
    provider.finish([instance.id])  # gone already is fine


def test_a_cancelled_allocation_ends_cancelled(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    request = request_for(tmp_path)
    instance = provider.launch(offer, request)
    node, install_dir = run_a_worker(slurm_cluster, instance, request.job_id)
    stop_the_worker(node, install_dir)
    provider.terminate([instance.id])
    assert ended_as(slurm_cluster, slurm_job_of(instance)) == "CANCELLED"


def test_an_allocation_that_does_not_end_when_told_is_cancelled(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A batch script that does not return when told (one this controller lost the record
    of, whose script ignores the signal) is cancelled after ``finish_wait_seconds``."""
    provider = provider_for(slurm_cluster, tmp_path, finish_wait_seconds=2)
    stuck = slurm_cluster.sbatch(
        "-p", "cpu", "-N", "1", "-J", "gpulayer-lost-r0", "--wrap", "trap '' USR1; sleep 300"
    )  # fmt: skip
    wait_until(
        lambda: f"{stuck} gpulayer-lost-r0 RUNNING" in slurm_cluster.queue(),
        timeout=30,
        what="the allocation to run",
    )
    provider.finish([f"{slurm_cluster.name}.{stuck}.0"])
    assert ended_as(slurm_cluster, stuck) == "CANCELLED"


def test_a_multi_node_allocation_ends_once_every_node_is_let_go_of(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A warm gang's nodes may each serve a job of its own later: ending one node's machine
    must not end the allocation under the other's job; the last one ends it (COMPLETED)."""
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    first, second = provider.launch_gang(offer, request_for(tmp_path, count=2))
    slurm_job = slurm_job_of(first)
    with pytest.raises(ProviderError) as held:
        provider.finish([first.id])
    assert f"slurm job {slurm_job} ends with its other nodes (ranks 1 still held)" in str(
        held.value
    )
    assert [line.split()[0] for line in slurm_cluster.queue()] == [slurm_job]
    assert [i.state for i in provider.describe([first.id, second.id])] == ["running"] * 2
    provider.finish([second.id])
    assert ended_as(slurm_cluster, slurm_job) == "COMPLETED"
    provider.finish([first.id])  # the first node's retry: gone already is fine
    assert {i.state for i in provider.describe([first.id, second.id])} == {"terminated"}


# --- a shared partition, per GPU ---------------------------------------------------------------


def test_one_gpu_of_a_shared_partitions_node_is_an_allocation_of_its_own(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    provider = provider_for(slurm_cluster, tmp_path)
    one = next(o for o in provider.offers(OfferQuery()) if o.gpu_count == 1)
    assert (one.zone, one.instance_type, one.gpu_count) == ("gpu", "2cpu-2gb-1xa100-shared", 1)
    # Someone else holds one gpu node: two jobs of one GPU each share the other.
    holder = slurm_cluster.hold_nodes("gpu", 1)
    first = provider.launch(one, request_for(tmp_path))
    second = provider.launch(one, request_for(tmp_path))
    nodes = {i.tags["gpulayer:slurm-node"] for i in (first, second)}
    assert len(nodes) == 1, nodes
    for instance in (first, second):
        shown = slurm_cluster.command("scontrol", "-o", "show", "job", slurm_job_of(instance))
        assert "OverSubscribe=OK" in shown or "OverSubscribe=YES" in shown, shown
        assert " TRES=cpu=2,mem=2000M,node=1," in shown, shown
        assert "TresPerNode=gres:gpu:a100:1" in shown, shown
    provider.terminate([first.id, second.id])
    slurm_cluster.command("scancel", holder)


# --- one SSH connection to the login node -------------------------------------------------------


def logins(host: SshdHost) -> int:
    """Connections the host's sshd accepted since it started."""
    return len(re.findall(r"Accepted publickey for ", host.log_path.read_text(errors="replace")))


def drop_connections(host: SshdHost) -> None:
    """End the sshd processes serving connections (not the listener), as a login node that
    restarts its sessions or a network that drops them would."""
    serving = host.processes_mentioning("sshd: ")
    assert serving, "no connection to drop"
    host.run(["kill", *map(str, serving)], check=True)
    wait_until(lambda: not host.processes_mentioning("sshd: "), timeout=10, what="the drop")


def test_a_launch_and_a_terminate_share_one_login_connection(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    from gpulayer_slurm import close_login_connections

    login = slurm_cluster.login
    assert login is not None
    provider = provider_for(slurm_cluster, tmp_path)
    offer = next(o for o in provider.offers(OfferQuery()) if o.zone == "cpu")
    close_login_connections()
    before = logins(login)
    notes: list[str] = []
    request = request_for(tmp_path, progress=notes.append)
    instance = provider.launch(offer, request)
    # sbatch, squeue until it runs, scontrol for the node's address, the job's key: one login.
    assert logins(login) - before == 1, notes
    provider.terminate([instance.id])
    assert provider.describe([instance.id])[0].state == "terminated"
    assert logins(login) - before == 1
    # A connection that dropped is opened again on the next command.
    drop_connections(login)
    assert {o.zone for o in provider.offers(OfferQuery())} == {"gpu", "cpu"}
    assert logins(login) - before == 2
    close_login_connections()


# --- through the command line -------------------------------------------------------------------


def test_a_job_that_waited_for_capacity_no_longer_says_so_once_it_ran(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    # Someone else's job holds the cpu nodes for a while: the job waits for capacity first.
    holder = slurm_cluster.hold_nodes("cpu", 2)
    sent = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--region",
         f"{slurm_cluster.name}/cpu", "--timeout", "120", "--detach",
         "--", "python3", "-c", "print('evaluated')"],
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    job_id = str(last_job()["id"])
    wait_until(
        lambda: "waiting for capacity" in (status(job_id)["message"] or ""),
        timeout=60,
        what="a wait",
    )
    slurm_cluster.command("scancel", holder)
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    ended = status(job_id)
    assert "waiting for capacity" not in (ended["message"] or ""), ended["message"]
    # Its log still tells the wait, in Slurm's words.
    assert "is pending (Resources)" in run_cli(["logs", job_id]).stderr
    wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_a_finished_jobs_allocation_is_named_after_it_and_ends_completed(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    sent = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--name", "nightly-eval",
         "--timeout", "120", "--detach", "--", "python3", "-c", "print('evaluated')"],
    )  # fmt: skip
    assert sent.returncode == 0, sent.stderr
    job_id = str(last_job()["id"])
    (mine,) = wait_until(slurm_cluster.queue, timeout=60, what="the allocation")
    slurm_job, slurm_name = mine.split()[:2]
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    assert re.fullmatch(r"gpulayer-nightly-eval-r[-0-9a-z]+", slurm_name), mine
    assert ended_as(slurm_cluster, slurm_job) == "COMPLETED"
    wait_until(lambda: no_job_keys(slurm_cluster), timeout=30, what="the job's key to go")


def test_a_cancelled_jobs_allocation_ends_cancelled(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    job_id = submit_detached("sleep", "300")
    wait_until(lambda: status(job_id)["state"] == "running", timeout=120, what="the job to run")
    (mine,) = slurm_cluster.queue()
    assert run_cli(["cancel", job_id]).returncode == 0
    wait_until(lambda: slurm_cluster.queue() == [], timeout=60, what="an empty queue")
    assert ended_as(slurm_cluster, mine.split()[0]) == "CANCELLED"

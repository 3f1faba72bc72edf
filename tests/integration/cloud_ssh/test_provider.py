"""The ssh provider against real sshd hosts: offers from probed hardware, claims, the
per-request key, and terminate's cleanup."""

from __future__ import annotations

import logging
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from gpulayer_ssh import HostUnreachable, SshHostsProvider

from gpulayer.cloud.bootstrap import bootstrap_worker
from gpulayer.cloud.errors import CapacityError, ProviderError, ProviderSettingsError
from gpulayer.cloud.offer import Offer, OfferQuery
from gpulayer.cloud.protocol import LaunchRequest
from gpulayer.cloud.registry import get_provider
from gpulayer.cloud.wheelhouse import Wheelhouse
from gpulayer.hardware.probe_parsing import parse_meminfo
from gpulayer.ssh.errors import SshAuthError
from gpulayer.ssh.keys import KeyPair, generate_keypair
from gpulayer.ssh.session import SshSession
from gpulayer.worker.probe import cpu_arch
from tests.integration.cloud_ssh.helpers import (
    PYTHON,
    ControlPlane,
    eventually,
    make_plan,
    processes_mentioning,
)
from tests.support.sshd_hosts import MARKER, SshdHost

FIXTURES = Path(__file__).parents[2] / "fixtures" / "nvidia_smi"


def host_entry(host: SshdHost, root: Path, **overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": host.name,
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "key_path": str(host.client_key),
        "host_key": host.host_key,
        "python": PYTHON,
        "install_root": str(root / host.name),
        # The hosts' sshd reads keys from here: never this machine's ~/.ssh.
        "authorized_keys": str(host.authorized_keys),
    }
    entry.update(overrides)
    return entry


def make_provider(
    tmp_path: Path, entries: list[dict[str, Any]], **settings: Any
) -> SshHostsProvider:
    return SshHostsProvider(
        {"hosts": entries, "state_dir": str(tmp_path / "state"), "connect_timeout_seconds": 3}
        | settings
    )


def request_for(
    tmp_path: Path, request_id: str, job_id: str = "job-1"
) -> tuple[LaunchRequest, KeyPair]:
    keys = generate_keypair(tmp_path / "keys", request_id)
    request = LaunchRequest(
        request_id=request_id,
        job_id=job_id,
        owner="ctl-test",
        tags={"gpulayer:owner": "ctl-test", "gpulayer:job": job_id},
        ssh_public_key=keys.public_key,
        allowed_ssh_cidr="127.0.0.1/32",
    )
    return request, keys


def offer_of(provider: SshHostsProvider, name: str) -> Offer:
    return next(o for o in provider.offers(OfferQuery()) if o.instance_type == name)


def our_key_lines(host: SshdHost) -> list[str]:
    return [
        line
        for line in host.read_text(host.authorized_keys).splitlines()
        if "gpulayer-request:" in line
    ]


def test_registered_under_the_entry_point(tmp_path: Path, ssh_host: SshdHost) -> None:
    provider = get_provider(
        "ssh", {"hosts": [host_entry(ssh_host, tmp_path)], "state_dir": str(tmp_path / "s")}
    )
    assert isinstance(provider, SshHostsProvider)
    assert provider.name == "ssh"


def test_offers_carry_the_hardware_each_host_reports(ssh_hosts: Any, tmp_path: Path) -> None:
    priced, unpriced = ssh_hosts(2)
    provider = make_provider(
        tmp_path,
        [
            host_entry(priced, tmp_path, hourly_price=1.5, currency="EUR", labels={"rack": "a"}),
            host_entry(unpriced, tmp_path, region="lab"),
        ],
    )
    offers = {o.instance_type: o for o in provider.offers(OfferQuery())}
    assert set(offers) == {priced.name, unpriced.name}
    for host in (priced, unpriced):
        offer = offers[host.name]
        assert offer.provider == "ssh"
        assert offer.zone == host.name
        assert offer.cpu_cores == int(host.run("nproc", check=True).stdout)
        assert offer.memory_gb == parse_meminfo(host.run("cat /proc/meminfo", check=True).stdout)
        assert offer.cpu_arch == cpu_arch(host.run("uname -m", check=True).stdout.strip())
        assert offer.os == "linux"
        assert offer.disk_gb is not None and offer.disk_gb > 0
        assert offer.accelerator == "cpu" and offer.gpu_count == 0
    assert (offers[priced.name].hourly_price, offers[priced.name].currency) == (1.5, "EUR")
    # No configured price: a job with a cost cap never picks this host.
    assert offers[unpriced.name].hourly_price is None
    assert offers[unpriced.name].region == "lab"


def test_gpus_reported_by_nvidia_smi_are_offered(ssh_host: SshdHost, tmp_path: Path) -> None:
    tools = tmp_path / "bin"  # a path on the host, made below
    local = tmp_path / "local"
    local.mkdir()
    fake = local / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *--query-gpu=*compute_cap*) cat {tools}/query.out ;;\n"
        f"  *) cat {tools}/banner.out ;;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    # The host's sessions find the recorded nvidia-smi first on their PATH.
    ssh_host.configure(f"SetEnv PATH={tools}:/usr/bin:/bin {MARKER}={ssh_host.marker}")
    ssh_host.restart()
    with SshSession(ssh_host.target()) as session:
        session.makedirs(str(tools))
        session.put(fake, str(tools / "nvidia-smi"))
        for recorded in ("query.out", "banner.out"):
            session.put(FIXTURES / "a100_2x" / recorded, str(tools / recorded))
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)])
    offer = offer_of(provider, ssh_host.name)
    assert (offer.accelerator, offer.gpu_count) == ("cuda", 2)
    assert offer.gpu_name == "NVIDIA A100-SXM4-80GB"
    assert offer.gpu_memory_gb == 80.0
    assert offer.cuda_compute_capability == "8.0"


def test_unreachable_host_gives_no_offer_and_the_log_says_why(
    ssh_hosts: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    up, down = ssh_hosts(2)
    down.stop()
    provider = make_provider(tmp_path, [host_entry(up, tmp_path), host_entry(down, tmp_path)])
    with caplog.at_level(logging.WARNING, logger="gpulayer.providers.ssh"):
        offers = provider.offers(OfferQuery())
    assert [o.instance_type for o in offers] == [up.name]
    assert any(down.name in record.getMessage() for record in caplog.records)


def test_probed_hardware_is_reused_for_its_ttl(ssh_host: SshdHost, tmp_path: Path) -> None:
    entries = [host_entry(ssh_host, tmp_path)]
    cached = make_provider(tmp_path, entries, probe_ttl_seconds=600)
    first = offer_of(cached, ssh_host.name)
    ssh_host.stop()
    # Within the TTL the stored probe answers, even while the host is away.
    assert offer_of(cached, ssh_host.name) == first
    uncached = make_provider(tmp_path, entries, probe_ttl_seconds=0)
    # No host answers: the error names each and why, rather than an empty list.
    with pytest.raises(ProviderError, match=f"no host answers: {ssh_host.name}: "):
        uncached.offers(OfferQuery())


def test_hardware_described_by_hand_is_offered_without_probing(tmp_path: Path) -> None:
    entry = {
        "name": "gpu-box",
        "address": "127.0.0.1",
        "port": 9,  # nothing listens: probing would fail
        "key_path": str(tmp_path / "no-key"),
        "hardware": {
            "cpu_cores": 32,
            "memory_gb": 256,
            "accelerator": "cuda",
            "gpu_name": "NVIDIA L4",
            "gpu_count": 4,
            "gpu_memory_gb": 24,
            "cuda_compute_capability": "8.9",
        },
    }
    offer = offer_of(make_provider(tmp_path, [entry]), "gpu-box")
    assert (offer.cpu_cores, offer.gpu_count, offer.gpu_name) == (32, 4, "NVIDIA L4")
    assert offer.cuda_compute_capability == "8.9"


def test_an_unreachable_host_described_by_hand_reports_its_wait(tmp_path: Path) -> None:
    entry = {
        "name": "far-box",
        "address": "127.0.0.1",
        "port": 9,  # nothing listens
        "key_path": str(generate_keypair(tmp_path / "login", "far").private_path),
        "hardware": {"cpu_cores": 8},
    }
    provider = make_provider(tmp_path, [entry], launch_wait_seconds=6)
    offer = offer_of(provider, "far-box")
    request, _ = request_for(tmp_path, "r-far")
    heard: list[str] = []
    request = request.model_copy(update={"progress": heard.append})
    with pytest.raises(HostUnreachable):
        provider.launch(offer, request)
    assert heard, "a wait of 6 s said nothing"
    assert re.match(r"^waiting for SSH on \S+127\.0\.0\.1:9: attempt \d+, [45] s of 6 s", heard[0])
    assert provider.describe(["far-box"]) == []


def test_launch_claims_the_host_and_lets_the_request_key_in(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path, hourly_price=0.5)])
    offer = offer_of(provider, ssh_host.name)
    request, keys = request_for(tmp_path, "r-first")
    instance = provider.launch(offer, request)
    assert instance.id == ssh_host.name
    assert (instance.ssh_host, instance.ssh_port, instance.ssh_user) == (
        ssh_host.address,
        ssh_host.port,
        ssh_host.user,
    )
    assert instance.host_key == ssh_host.host_key
    assert instance.state == "running" and instance.hourly_price == 0.5
    assert instance.tags["gpulayer:job"] == "job-1"
    assert instance.tags["gpulayer:install-root"] == str(tmp_path / ssh_host.name)
    # The per-request key now logs in.
    with SshSession(ssh_host.target(key_path=keys.private_path, pin=True)) as session:
        assert session.run("echo in").stdout.strip() == "in"
    assert our_key_lines(ssh_host) == [
        f"{' '.join(keys.public_key.split()[:2])} gpulayer-request:r-first"
    ]
    # The same request again is the same instance, and the key is not added twice.
    assert provider.launch(offer, request) == instance
    assert len(our_key_lines(ssh_host)) == 1
    # A claimed host is busy: not offered, and another request is refused for that host only.
    assert provider.offers(OfferQuery()) == []
    other, _ = request_for(tmp_path, "r-second", job_id="job-2")
    with pytest.raises(CapacityError, match="in use by request r-first") as refused:
        provider.launch(offer, other)
    assert (refused.value.scope, refused.value.zone) == ("zone", ssh_host.name)
    assert provider.describe([ssh_host.name, "unknown"]) == [instance]


def test_two_requests_racing_for_one_host_get_it_once(ssh_host: SshdHost, tmp_path: Path) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)])
    offer = offer_of(provider, ssh_host.name)
    requests = [request_for(tmp_path, f"r-race-{i}", job_id=f"job-{i}")[0] for i in range(6)]
    won: list[str] = []
    refused: list[str] = []
    start = threading.Barrier(len(requests))

    def attempt(request: LaunchRequest) -> None:
        start.wait()
        try:
            provider.launch(offer, request)
            won.append(request.request_id)
        except CapacityError:
            refused.append(request.request_id)

    threads = [threading.Thread(target=attempt, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == len(requests) - 1
    assert our_key_lines(ssh_host) == [line for line in our_key_lines(ssh_host) if won[0] in line]
    assert len(our_key_lines(ssh_host)) == 1


def test_terminate_ends_the_job_and_gives_the_host_back(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)])
    users_keys = ssh_host.read_text(ssh_host.authorized_keys)
    offer = offer_of(provider, ssh_host.name)
    request, keys = request_for(tmp_path, "r-term", job_id="j-term")
    instance = provider.launch(offer, request)
    install_dir = provider.install_dir(instance.id, request.job_id)
    assert install_dir == f"{tmp_path / ssh_host.name}/j-term"
    # Bootstrap a real worker with the per-request key, as the orchestrator does.
    session = SshSession(ssh_host.target(key_path=keys.private_path, pin=True)).connect()
    try:
        plan = make_plan(
            Path(install_dir),
            control_plane.port,
            control_plane.worker_token(),
            deadman_action="stop",
        )
        worker = bootstrap_worker(session, plan, wheelhouse, lambda line: None, timeout=120)
        assert worker.pid in processes_mentioning(ssh_host, install_dir)
        assert ssh_host.exists(Path(install_dir) / "venv")
        provider.terminate([instance.id])
        eventually(
            lambda: not processes_mentioning(ssh_host, install_dir), what="the worker to end"
        )
        worker.tunnel.close()
    finally:
        session.close()
    assert not ssh_host.exists(install_dir)
    # Only the job's dir went: the host keeps its shared wheelhouse for the next job.
    assert (
        ssh_host.run(["test", "-d", str(tmp_path / ssh_host.name / "wheelhouse")]).returncode == 0
    )
    assert ssh_host.read_text(ssh_host.authorized_keys) == users_keys
    assert provider.describe([instance.id]) == []
    assert provider.list_owned({"gpulayer:owner": "ctl-test"}) == []
    # The request key no longer logs in; the host is offered again.
    with pytest.raises(SshAuthError):
        SshSession(ssh_host.target(key_path=keys.private_path, pin=True)).connect()
    assert [o.instance_type for o in provider.offers(OfferQuery())] == [ssh_host.name]
    provider.terminate([instance.id])  # already done: nothing to do, no error


def test_terminate_of_an_unreachable_host_keeps_the_claim_until_it_succeeds(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)])
    request, _ = request_for(tmp_path, "r-away")
    instance = provider.launch(offer_of(provider, ssh_host.name), request)
    work = Path(provider.install_dir(instance.id, request.job_id))
    ssh_host.run(["mkdir", "-p", str(work / "venv")], check=True)
    # Unreachable but not rebooted: a reboot would empty the host's /tmp, and with it ``work``.
    ssh_host.stop_listening()
    with pytest.raises(ProviderError, match=ssh_host.name):
        provider.terminate([instance.id])
    assert provider.describe([instance.id]) == [instance]
    assert ssh_host.exists(work / "venv")
    ssh_host.start()
    provider.terminate([instance.id])
    assert provider.describe([instance.id]) == []
    assert not ssh_host.exists(work)
    assert our_key_lines(ssh_host) == []


def test_list_owned_matches_every_tag(ssh_hosts: Any, tmp_path: Path) -> None:
    first, second = ssh_hosts(2)
    provider = make_provider(tmp_path, [host_entry(first, tmp_path), host_entry(second, tmp_path)])
    mine, _ = request_for(tmp_path, "r-mine", job_id="job-a")
    theirs, _ = request_for(tmp_path, "r-theirs", job_id="job-b")
    provider.launch(offer_of(provider, first.name), mine)
    provider.launch(offer_of(provider, second.name), theirs)
    owned = provider.list_owned({"gpulayer:owner": "ctl-test", "gpulayer:job": "job-a"})
    assert [i.id for i in owned] == [first.name]
    assert len(provider.list_owned({"gpulayer:owner": "ctl-test"})) == 2
    with pytest.raises(ProviderError, match="at least one tag"):
        provider.list_owned({})
    provider.terminate([first.name, second.name])
    assert provider.list_owned({"gpulayer:owner": "ctl-test"}) == []


def test_launch_of_an_unreachable_host_frees_its_claim(ssh_host: SshdHost, tmp_path: Path) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)], launch_wait_seconds=2)
    offer = offer_of(provider, ssh_host.name)
    ssh_host.stop()
    request, _ = request_for(tmp_path, "r-lost")
    with pytest.raises(HostUnreachable) as lost:
        provider.launch(offer, request)
    assert lost.value.zone == ssh_host.name
    assert provider.describe([ssh_host.name]) == []


def test_a_key_with_options_is_refused(ssh_host: SshdHost, tmp_path: Path) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)])
    offer = offer_of(provider, ssh_host.name)
    request, keys = request_for(tmp_path, "r-opts")
    sneaky = request.model_copy(update={"ssh_public_key": f'command="sh" {keys.public_key}'})
    with pytest.raises(ProviderError, match="ssh_public_key"):
        provider.launch(offer, sneaky)
    assert our_key_lines(ssh_host) == []
    assert provider.describe([ssh_host.name]) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": 0}, "hosts.0.port"),
        ({"name": "bad name"}, "hosts.0.name"),
        ({"install_root": "/etc"}, "hosts.0.install_root"),
        ({"install_root": "relative"}, "hosts.0.install_root"),
        ({"authorized_keys": "keys"}, "hosts.0.authorized_keys"),
        ({"currency": "dollars"}, "hosts.0.currency"),
        ({"host_key": "not a key"}, "hosts.0.host_key"),
        ({"hourly_price": -1}, "hosts.0.hourly_price"),
        ({"surprise": 1}, "hosts.0.surprise"),
        ({"hardware": {"cpu_cores": 4, "gpu_count": 2}}, "hosts.0.hardware"),
    ],
)
def test_settings_errors_name_the_field(change: dict[str, Any], field: str, tmp_path: Path) -> None:
    entry = {"name": "box", "address": "10.0.0.5", "key_path": "/keys/box"} | change
    with pytest.raises(ProviderSettingsError, match=f"settings: {re.escape(field)}"):
        SshHostsProvider({"hosts": [entry]})


def test_two_hosts_with_one_name_are_refused() -> None:
    entry = {"name": "box", "address": "10.0.0.5", "key_path": "/keys/box"}
    with pytest.raises(ProviderSettingsError, match=r"hosts\.1\.name"):
        SshHostsProvider({"hosts": [entry, entry | {"address": "10.0.0.6"}]})


def test_launch_waits_for_a_host_whose_ssh_comes_up_late(
    ssh_host: SshdHost, tmp_path: Path
) -> None:
    provider = make_provider(tmp_path, [host_entry(ssh_host, tmp_path)], launch_wait_seconds=30)
    offer = offer_of(provider, ssh_host.name)
    ssh_host.stop()
    ssh_host.start(delay=2)  # rebooting: SSH answers a little later
    request, _ = request_for(tmp_path, "r-late")
    instance = provider.launch(offer, request)
    assert instance.id == ssh_host.name
    assert [i.id for i in provider.describe([ssh_host.name])] == [ssh_host.name]
    provider.terminate([ssh_host.name])

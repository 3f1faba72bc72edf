"""Several hosts and several channels at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gpulayer.ssh.hostkeys import JsonHostKeyStore
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.wait import wait_for_ssh
from tests.support.sshd_hosts import SshdHost


def test_sessions_to_three_hosts_in_parallel(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    hosts = ssh_hosts(3, names=["alpha", "beta", "gamma"])

    def visit(host: SshdHost) -> tuple[str, int]:
        with wait_for_ssh(host.target(), 30, host_keys=host_keys) as session:
            result = session.run("hostname; exit 5")
            return result.stdout.strip(), result.exit_code

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(visit, hosts))
    if hosts[0].lab.namespaced:
        assert results == [("alpha", 5), ("beta", 5), ("gamma", 5)]
    else:
        assert [code for _, code in results] == [5, 5, 5]
    # Each host's key was recorded under its own address, all in one file.
    for host in hosts:
        assert host_keys.get(host.address, host.port) is not None
    assert len({host_keys.get(h.address, h.port) for h in hosts}) == 3


def test_hosts_resolve_each_other_by_name(ssh_hosts) -> None:
    hosts = ssh_hosts(3, names=["n-a", "n-b", "n-c"])
    if not hosts[0].lab.namespaced:
        pytest.skip("loopback hosts share this machine's hosts file")
    with SshSession(hosts[0].target()) as session:
        result = session.run("getent hosts n-b n-c controller")
    table = dict(line.split()[::-1] for line in result.stdout.splitlines())
    assert table == {
        "n-b": hosts[1].address,
        "n-c": hosts[2].address,
        "controller": hosts[0].lab.gateway,
    }


def test_many_commands_share_one_session(ssh_host: SshdHost) -> None:
    # Commands that end at once, many at a time, are where a channel's close crosses what the
    # client still sends on it; sshd drops the whole connection for a message on a channel it
    # closed (this failed about once in 2,400 commands when the client sent stdin's EOF).
    count = 2400
    with SshSession(ssh_host.target()) as session, ThreadPoolExecutor(8) as pool:
        transport = session.transport
        results = list(pool.map(lambda i: session.run(f"echo {i}; exit {i % 4}"), range(count)))
        assert session.transport is transport
    assert [(r.stdout, r.exit_code) for r in results] == [(f"{i}\n", i % 4) for i in range(count)]

"""A session through another host (ProxyJump): a node that refuses this machine's logins is
reached through a login host, with each hop's own key and pinned host key; a tunnel and files
go over it as over a direct session, and closing it closes the hop too."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.ssh.errors import SshConnectionError, SshError
from gpulayer.ssh.hostkeys import JsonHostKeyStore
from gpulayer.ssh.session import SshSession
from gpulayer.ssh.target import SshTarget
from tests.support.sshd_hosts import HostFactory, SshdHost, SshdLab


def _behind_login(sshd_lab: SshdLab, ssh_hosts: HostFactory) -> tuple[SshdHost, SshdHost]:
    login, node = ssh_hosts(2, names=["login", "node"], start=False)
    if sshd_lab.namespaced:
        # As a cluster's compute node: no logins from the controller's own address.
        node.configure(f"DenyUsers *@{sshd_lab.gateway}")
    login.start()
    node.start()
    return login, node


def test_a_node_refusing_this_machine_is_reached_through_the_login_host(
    sshd_lab: SshdLab, ssh_hosts: HostFactory, host_keys: JsonHostKeyStore, tmp_path: Path
) -> None:
    login, node = _behind_login(sshd_lab, ssh_hosts)
    if sshd_lab.namespaced:
        with pytest.raises(SshError):
            SshSession(node.target()).connect(timeout=10)
    target = SshTarget(
        node.address,
        node.port,
        node.user,
        key_path=node.client_key,
        via=login.target(pin=True),
    )
    assert str(target) == f"{node.user}@{node.address}:{node.port} via {login.target()}"
    session = SshSession(target, host_keys=host_keys).connect(timeout=10)
    try:
        seen_from = session.run("echo $SSH_CONNECTION").stdout.split()[0]
        if sshd_lab.namespaced:
            assert seen_from == login.address
        assert session.run("cat /etc/hostname || hostname").exit_code == 0
        local = tmp_path / "sent.txt"
        local.write_text("through the login host\n")
        session.put(local, "/tmp/sent.txt")
        assert node.read_text("/tmp/sent.txt") == "through the login host\n"
        # The node's key was pinned on first use, under the node's own address.
        assert host_keys.get(node.address, node.port) is not None
        jump = session._jump
        assert jump is not None and jump.connected
    finally:
        session.close()
    assert not jump.connected  # the hop went with the session


def test_a_node_the_login_host_cannot_reach_is_a_connection_error_naming_both(
    sshd_lab: SshdLab, ssh_hosts: HostFactory, host_keys: JsonHostKeyStore
) -> None:
    (login,) = ssh_hosts(1)
    closed = SshTarget(
        login.address, 1, login.user, key_path=login.client_key, via=login.target(pin=True)
    )
    with pytest.raises(SshConnectionError) as caught:
        SshSession(closed, host_keys=host_keys).connect(timeout=10)
    text = str(caught.value)
    assert f"{login.address}:1" in text and f"from {login.target()}" in text


def test_a_via_that_is_not_a_target_is_refused() -> None:
    from gpulayer.ssh.errors import InvalidSshTarget

    with pytest.raises(InvalidSshTarget, match="'via'"):
        SshTarget("node", key_path=Path("/k"), via="login")  # type: ignore[arg-type]

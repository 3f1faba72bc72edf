"""Waiting for sshd on a machine that is still booting, or never comes up."""

from __future__ import annotations

import pytest

from gpulayer.ssh.errors import (
    HostKeyMismatch,
    InvalidSshArgument,
    SshAuthError,
    SshConnectionError,
    SshUnreachable,
)
from gpulayer.ssh.hostkeys import JsonHostKeyStore
from gpulayer.ssh.wait import wait_for_ssh


def test_waits_out_a_host_whose_sshd_starts_late(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    (host,) = ssh_hosts(1, start=False)
    host.start(delay=2.0)
    assert not host.running  # refused at first, like a machine still booting
    session = wait_for_ssh(host.target(), 30, host_keys=host_keys)
    try:
        assert host.running
        assert session.run("echo up").stdout == "up\n"
    finally:
        session.close()
    assert host_keys.get(host.address, host.port) is not None


def test_gives_up_on_a_host_that_never_starts(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    (host,) = ssh_hosts(1, start=False)
    with pytest.raises(SshUnreachable) as caught:
        wait_for_ssh(host.target(), 1.5, host_keys=host_keys, attempt_timeout=0.5)
    error = caught.value
    assert error.attempts >= 2
    assert isinstance(error.last_error, SshConnectionError)
    assert host.address in str(error)
    assert "1.5s" in str(error)


def test_a_long_wait_reports_progress(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    import re

    (host,) = ssh_hosts(1, start=False)
    heard: list[str] = []
    with pytest.raises(SshUnreachable):
        wait_for_ssh(
            host.target(),
            3.0,
            host_keys=host_keys,
            attempt_timeout=0.5,
            on_progress=heard.append,
            progress_seconds=0.3,
        )
    assert len(heard) >= 3, heard
    pattern = re.compile(r"^waiting for SSH on \S+: attempt (\d+), (\d+) s of 3 s; last: .+$")
    matches = [pattern.match(line) for line in heard]
    assert all(matches), heard
    attempts = [int(m.group(1)) for m in matches if m]
    assert attempts == sorted(attempts) and attempts[-1] >= 2
    assert host.address in heard[-1]
    count = len(heard)
    host.start()
    with wait_for_ssh(
        host.target(), 30, host_keys=host_keys, on_progress=heard.append, progress_seconds=20
    ):
        pass
    assert len(heard) == count  # a success well inside the report period: no report at all


def test_a_report_under_way_is_heard_before_the_wait_returns(
    ssh_hosts, host_keys: JsonHostKeyStore
) -> None:
    import threading

    (host,) = ssh_hosts(1, start=False)
    heard: list[str] = []
    released = threading.Event()

    def slow_sink(line: str) -> None:
        heard.append(line)
        released.wait(2.0)  # a console that is slow to take the line, past the wait's end
        heard.append("taken")

    with pytest.raises(SshUnreachable):
        wait_for_ssh(
            host.target(),
            1.0,
            host_keys=host_keys,
            attempt_timeout=0.3,
            on_progress=slow_sink,
            progress_seconds=0.2,
        )
    alive = [t for t in threading.enumerate() if t.name == "gpulayer-ssh-wait"]
    released.set()
    assert not alive, "a progress report outlived its wait"
    assert heard[-1] == "taken"


def test_a_changed_host_key_is_not_retried(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    host, other = ssh_hosts(2)
    with pytest.raises(HostKeyMismatch):
        wait_for_ssh(host.target().with_host_key(other.host_key), 30, host_keys=host_keys)


def test_a_refused_key_is_retried_until_it_is_installed(
    ssh_hosts, host_keys: JsonHostKeyStore
) -> None:
    # cloud-init writes authorized_keys after sshd is already answering.
    host, other = ssh_hosts(2)
    target = host.target(key_path=other.client_key)
    with pytest.raises(SshUnreachable) as caught:
        wait_for_ssh(target, 1.0, host_keys=host_keys)
    assert isinstance(caught.value.last_error, SshAuthError)
    with pytest.raises(SshAuthError):
        wait_for_ssh(target, 30, host_keys=host_keys, retry_auth=False)
    host.authorize(other.client_public_key)
    with wait_for_ssh(target, 30, host_keys=host_keys) as session:
        assert session.exec("true") == 0


@pytest.mark.parametrize("deadline", [0, -1, float("nan"), float("inf")])
def test_bad_deadline_names_the_argument(ssh_hosts, deadline: float) -> None:
    (host,) = ssh_hosts(1, start=False)
    with pytest.raises(InvalidSshArgument, match="deadline_seconds"):
        wait_for_ssh(host.target(), deadline)


@pytest.mark.slow
def test_a_wait_is_never_quiet_for_5_s_by_default(ssh_hosts, host_keys: JsonHostKeyStore) -> None:
    import itertools
    import time

    (host,) = ssh_hosts(1, start=False)
    heard: list[float] = []
    begun = time.monotonic()
    with pytest.raises(SshUnreachable):
        wait_for_ssh(
            host.target(),
            11.0,
            host_keys=host_keys,
            attempt_timeout=0.5,
            on_progress=lambda line: heard.append(time.monotonic()),
        )
    stamps = [begun, *heard, time.monotonic()]
    assert len(heard) >= 2, heard
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= 5.0, stamps


@pytest.mark.slow
def test_a_key_refused_by_a_host_that_answers_ends_the_wait_in_three_tries(
    ssh_hosts, host_keys: JsonHostKeyStore
) -> None:
    """The job key written where sshd does not read it: the host answers every time and
    refuses the key every time, so the wait gives up after 3 tries in under 15 s rather than
    at its deadline."""
    import time

    from gpulayer.ssh.errors import SshKeyRefused

    host, other = ssh_hosts(2)
    target = host.target(key_path=other.client_key)
    heard: list[str] = []
    begun = time.monotonic()
    with pytest.raises(SshKeyRefused) as caught:
        wait_for_ssh(target, 600, host_keys=host_keys, on_progress=heard.append)
    took = time.monotonic() - begun
    assert caught.value.tries == 3
    assert isinstance(caught.value.last_error, SshAuthError)
    assert 8.0 <= took < 15.0, took  # spaced for a key installed late, ended long before 600 s
    assert host.address in str(caught.value)
    assert any("refused key" in line for line in heard), heard  # the wait said what it saw


def test_a_host_that_does_not_answer_is_still_retried_to_its_deadline(
    ssh_hosts, host_keys: JsonHostKeyStore
) -> None:
    """Only a refusal after the handshake ends a wait early: a host not up yet is waited for."""
    (host,) = ssh_hosts(1, start=False)
    with pytest.raises(SshUnreachable) as caught:
        wait_for_ssh(host.target(), 2.0, host_keys=host_keys, attempt_timeout=0.3)
    assert caught.value.attempts > 3
    assert isinstance(caught.value.last_error, SshConnectionError)

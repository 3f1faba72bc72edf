"""Host-key pinning and trust on first use, against real hosts and as a pure decision."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
from pathlib import Path

import pytest

from gpulayer.ssh.errors import HostKeyMismatch, HostKeyStoreError, InvalidHostKey, SshAuthError
from gpulayer.ssh.hostkeys import (
    HostKey,
    JsonHostKeyStore,
    MemoryHostKeyStore,
    Verdict,
    check_host_key,
    parse_host_key,
    parse_host_keys,
    preferred_host_key_algorithms,
)
from gpulayer.ssh.session import SshSession
from tests.support.sshd_hosts import SshdHost


def _keygen(tmp_path: Path, kind: str, name: str) -> str:
    path = tmp_path / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "c", "-f", str(path)], check=True
    )
    return (tmp_path / f"{name}.pub").read_text().strip()


# -- against real hosts -----------------------------------------------------------------------------


def test_first_use_records_the_key_and_a_changed_key_is_refused(
    ssh_host: SshdHost, host_keys: JsonHostKeyStore
) -> None:
    assert host_keys.get(ssh_host.address, ssh_host.port) is None
    with SshSession(ssh_host.target(), host_keys=host_keys) as session:
        assert session.run("echo hi").stdout == "hi\n"
    recorded = host_keys.get(ssh_host.address, ssh_host.port)
    assert recorded == str(parse_host_key(ssh_host.host_key))

    # A second store object reads the same file: trust survives the process.
    again = JsonHostKeyStore(host_keys.directory)
    with SshSession(ssh_host.target(), host_keys=again) as session:
        assert session.exec("true") == 0

    old_key = ssh_host.host_key
    ssh_host.restart(new_host_key=True)
    assert ssh_host.host_key != old_key
    with pytest.raises(HostKeyMismatch) as caught:
        SshSession(ssh_host.target(), host_keys=again).connect(timeout=10)
    assert caught.value.host == ssh_host.address
    assert parse_host_key(old_key).fingerprint in str(caught.value)
    assert parse_host_key(ssh_host.host_key).fingerprint in str(caught.value)
    # The recorded key is kept: a refused impostor must not become the new truth.
    assert again.get(ssh_host.address, ssh_host.port) == recorded


def test_a_host_that_refuses_our_key_leaves_no_key_recorded(
    ssh_host: SshdHost, host_keys: JsonHostKeyStore
) -> None:
    """An address that answers before the launched machine takes our key (cloud-init still
    running, or the machine that held the address still leaving) must not have its key
    recorded: the machine that then takes our key is the one held to its key."""
    ssh_host.set_authorized_keys("")
    with pytest.raises(SshAuthError):
        SshSession(ssh_host.target(), host_keys=host_keys).connect(timeout=10)
    assert host_keys.get(ssh_host.address, ssh_host.port) is None

    first_key = ssh_host.host_key
    ssh_host.restart(new_host_key=True)
    ssh_host.set_authorized_keys(ssh_host.client_public_key + "\n")
    with SshSession(ssh_host.target(), host_keys=host_keys) as session:
        assert session.exec("true") == 0
    recorded = host_keys.get(ssh_host.address, ssh_host.port)
    assert recorded == str(parse_host_key(ssh_host.host_key))
    assert recorded != str(parse_host_key(first_key))


def test_pinned_key_from_the_provider_is_accepted(
    ssh_host: SshdHost, host_keys: JsonHostKeyStore
) -> None:
    with SshSession(ssh_host.target(pin=True), host_keys=host_keys) as session:
        assert session.exec("true") == 0
    assert host_keys.get(ssh_host.address, ssh_host.port) == str(parse_host_key(ssh_host.host_key))


def test_wrong_pinned_key_is_refused_and_not_recorded(
    ssh_hosts, host_keys: JsonHostKeyStore
) -> None:
    host, other = ssh_hosts(2)
    target = host.target().with_host_key(other.host_key)
    with pytest.raises(HostKeyMismatch):
        SshSession(target, host_keys=host_keys).connect(timeout=10)
    assert host_keys.get(host.address, host.port) is None


def test_pin_overrules_a_recorded_key(ssh_host: SshdHost, host_keys: JsonHostKeyStore) -> None:
    # The provider reports the key of a fresh machine that took over the address.
    stale = _keygen(ssh_host.workdir, "ed25519", "stale")
    host_keys.put(ssh_host.address, ssh_host.port, stale)
    with SshSession(ssh_host.target(pin=True), host_keys=host_keys) as session:
        assert session.exec("true") == 0
    assert host_keys.get(ssh_host.address, ssh_host.port) == str(parse_host_key(ssh_host.host_key))


def test_pin_of_several_keys_accepts_the_one_offered(
    ssh_host: SshdHost, host_keys: JsonHostKeyStore, tmp_path: Path
) -> None:
    rsa = _keygen(tmp_path, "rsa", "rsa")
    pins = f"# from the console\n{rsa}\n{ssh_host.host_key}\n"
    with SshSession(ssh_host.target().with_host_key(pins), host_keys=host_keys) as session:
        assert session.exec("true") == 0


def test_host_offering_several_types_is_steered_to_the_recorded_type(
    ssh_host: SshdHost, host_keys: JsonHostKeyStore
) -> None:
    # The host gains an ECDSA key next to its ed25519 one. A client that prefers ed25519
    # would be fine anyway, so record the ECDSA key and check that it is the one negotiated.
    ecdsa = _keygen(ssh_host.workdir, "ecdsa", "ssh_host_ecdsa_key")
    ssh_host.add_host_key(ssh_host.workdir / "ssh_host_ecdsa_key")
    ssh_host.restart()
    host_keys.put(ssh_host.address, ssh_host.port, ecdsa)
    with SshSession(ssh_host.target(), host_keys=host_keys) as session:
        offered = session.transport.get_remote_server_key()
        assert offered.get_name() == "ecdsa-sha2-nistp256"
    assert host_keys.get(ssh_host.address, ssh_host.port) == str(parse_host_key(ecdsa))


# -- the pure decision ------------------------------------------------------------------------------


def _key(tmp_path: Path, name: str, kind: str = "ed25519") -> HostKey:
    return parse_host_key(_keygen(tmp_path, kind, name))


def test_check_host_key_table(tmp_path: Path) -> None:
    a, b = _key(tmp_path, "a"), _key(tmp_path, "b")
    assert check_host_key("h", 22, a, pinned=[], recorded=None) is Verdict.RECORD
    assert check_host_key("h", 22, a, pinned=[], recorded=a) is Verdict.ACCEPT
    assert check_host_key("h", 22, a, pinned=[a], recorded=None) is Verdict.RECORD
    assert check_host_key("h", 22, a, pinned=[a], recorded=a) is Verdict.ACCEPT
    assert check_host_key("h", 22, a, pinned=[b, a], recorded=b) is Verdict.RECORD
    with pytest.raises(HostKeyMismatch):
        check_host_key("h", 22, a, pinned=[], recorded=b)
    with pytest.raises(HostKeyMismatch):
        check_host_key("h", 22, a, pinned=[b], recorded=a)


def test_parse_ignores_comments_and_host_fields(tmp_path: Path) -> None:
    line = _keygen(tmp_path, "ed25519", "k")
    key_type, blob, _ = line.split(" ", 2)
    assert parse_host_key(line) == HostKey(key_type, blob)
    assert parse_host_key(f"10.0.0.5 {key_type} {blob}") == HostKey(key_type, blob)
    assert str(parse_host_key(line)) == f"{key_type} {blob}"
    fingerprint = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(tmp_path / "k.pub")], capture_output=True, text=True
    ).stdout.split()[1]
    assert parse_host_key(line).fingerprint == fingerprint


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not a key",
        "ssh-ed25519",
        "ssh-ed25519 !!!notbase64!!!",
        "ssh-ed25519 AAAA",
        "# only a comment",
    ],
)
def test_parse_rejects_what_is_not_a_key(text: str) -> None:
    with pytest.raises(InvalidHostKey):
        parse_host_keys(text)


def test_parse_rejects_a_blob_of_another_type(tmp_path: Path) -> None:
    blob = _keygen(tmp_path, "ed25519", "k").split()[1]
    with pytest.raises(InvalidHostKey, match="holds 'ssh-ed25519'"):
        parse_host_key(f"ssh-rsa {blob}")


def test_preferred_algorithms_put_held_types_first(tmp_path: Path) -> None:
    available = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    rsa = _key(tmp_path, "r", "rsa")
    ecdsa = _key(tmp_path, "e", "ecdsa")
    assert preferred_host_key_algorithms([], available) == available
    assert preferred_host_key_algorithms([rsa], available) == [
        "rsa-sha2-512",
        "rsa-sha2-256",
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
    ]
    assert preferred_host_key_algorithms([ecdsa], available)[0] == "ecdsa-sha2-nistp256"
    assert sorted(preferred_host_key_algorithms([ecdsa, rsa], available)) == sorted(available)


# -- stores -------------------------------------------------------------------------------------------


def test_stores_keep_one_key_per_host_and_port(tmp_path: Path) -> None:
    a, b = str(_key(tmp_path, "a")), str(_key(tmp_path, "b"))
    for store in (MemoryHostKeyStore(), JsonHostKeyStore(tmp_path / "s")):
        store.put("10.0.0.1", 22, a + " comment")
        store.put("10.0.0.1", 2222, b)
        store.put("fe80::1", 22, b)
        assert store.get("10.0.0.1", 22) == a
        assert store.get("10.0.0.1", 2222) == b
        assert store.get("fe80::1", 22) == b
        assert store.get("10.0.0.2", 22) is None
        store.forget("10.0.0.1", 22)
        store.forget("10.0.0.9", 22)
        assert store.get("10.0.0.1", 22) is None
        assert store.get("10.0.0.1", 2222) == b


def test_json_store_file_is_private_and_corruption_is_loud(tmp_path: Path) -> None:
    store = JsonHostKeyStore(tmp_path / "s")
    store.put("h", 22, str(_key(tmp_path, "a")))
    assert (store.directory.stat().st_mode & 0o777) == 0o700
    assert set(json.loads(store.path.read_text())["hosts"]) == {"h:22"}
    store.path.write_text("{not json")
    with pytest.raises(HostKeyStoreError):
        store.get("h", 22)


def _record_many(directory: str, worker: int, key: str) -> None:
    store = JsonHostKeyStore(Path(directory))
    for i in range(25):
        store.put(f"10.{worker}.0.{i}", 22, key)


def test_json_store_keeps_entries_written_by_concurrent_processes(tmp_path: Path) -> None:
    key = str(_key(tmp_path, "a"))
    directory = tmp_path / "shared"
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_record_many, args=(str(directory), w, key)) for w in range(4)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    hosts = json.loads((directory / JsonHostKeyStore.FILE_NAME).read_text())["hosts"]
    assert len(hosts) == 100

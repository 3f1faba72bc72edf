"""An ssh host's settings read paths as a shell would: `~/` is the user's home."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpulayer_ssh.settings import SshHost


def test_key_path_starting_with_a_tilde_is_in_the_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    host = SshHost(name="box", address="127.0.0.1", key_path=Path("~/.ssh/gpulayer_try"))
    assert host.key_path == Path("/home/alice/.ssh/gpulayer_try")


def test_a_host_key_that_is_no_openssh_line_is_refused_naming_the_field() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        SshHost(name="box", address="127.0.0.1", key_path=Path("k"), host_key="ssh-ed25519")
    (error,) = caught.value.errors()
    assert error["loc"] == ("host_key",)
    assert "is not an OpenSSH public key line" in error["msg"]
    line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
    host = SshHost(name="box", address="127.0.0.1", key_path=Path("k"), host_key=line)
    assert host.host_key == line


def test_offers_say_why_no_host_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every host unreachable (here: nothing listens on the port) is a reason on the
    listing, not an ssh provider that silently offers nothing."""
    import socket

    from gpulayer.cloud.search import list_offers
    from gpulayer.spec.validate import validate_spec

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: connecting to it is refused
    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path))
    key = tmp_path / "key"
    key.write_text("not a key")
    (tmp_path / "providers.yaml").write_text(
        "ssh:\n  connect_timeout_seconds: 2\n  hosts:\n"
        f"    - {{name: this-machine, address: 127.0.0.1, port: {port}, key_path: {key}}}\n"
    )
    spec = validate_spec({"workload": {"kind": "command", "command": ["true"]}})
    spec = spec.model_copy(
        update={"placement": spec.placement.model_copy(update={"providers": ["ssh"]})}
    )
    listing = list_offers(tmp_path, spec)
    assert listing["offers"] == []
    assert any(
        n.startswith("ssh: no offers (") and "this-machine" in n for n in listing["notes"]
    ), listing["notes"]

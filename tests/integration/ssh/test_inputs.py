"""Bad input to the SSH layer fails at once with an error naming the field. Pure, no I/O."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from gpulayer.errors import UsageError
from gpulayer.ssh.command import render_command
from gpulayer.ssh.errors import InvalidCommand, InvalidSshTarget
from gpulayer.ssh.target import SshTarget


def test_target_defaults_and_text() -> None:
    target = SshTarget("10.0.0.2", key_path="/k")  # type: ignore[arg-type]
    assert (target.port, target.user, target.host_key) == (22, "root", None)
    assert target.key_path == Path("/k")
    assert str(target) == "root@10.0.0.2:22"
    assert str(SshTarget("fe80::1", 2222, "ubuntu", key_path=Path("/k"))) == "ubuntu@[fe80::1]:2222"
    assert target.with_host_key("ssh-ed25519 AAAA").host_key == "ssh-ed25519 AAAA"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"host": ""}, "host"),
        ({"host": "a b"}, "host"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": "22"}, "port"),
        ({"port": True}, "port"),
        ({"user": " "}, "user"),
        ({"key_path": ""}, "key_path"),
        ({"host_key": "  "}, "host_key"),
    ],
)
def test_target_field_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"host": "h", "key_path": Path("/k"), **kwargs}
    with pytest.raises(InvalidSshTarget, match=f"'{field}'") as caught:
        SshTarget(**args)  # type: ignore[arg-type]
    assert isinstance(caught.value, UsageError)
    assert caught.value.exit_code == 2
    assert "\n" not in str(caught.value)


def test_render_command_quotes_words_and_exports_env() -> None:
    assert render_command("echo $HOME | wc -c") == "echo $HOME | wc -c"
    assert shlex.split(render_command(["a b", "c'd", "$e"])) == ["a b", "c'd", "$e"]
    line = render_command(["env"], {"A": "1 2", "B_2": "x'y"})
    assert line == "export A='1 2' B_2='x'\"'\"'y'; env"


@pytest.mark.parametrize(
    ("command", "env", "match"),
    [
        ("", None, "empty"),
        ("   ", None, "empty"),
        (["a", 1], None, "strings"),
        ("a\0b", None, "NUL"),
        ("true", {"1BAD": "x"}, "1BAD"),
        ("true", {"A-B": "x"}, "A-B"),
        ("true", {"A\n": "x"}, "A"),  # a newline would split the exported line
        ("true", {"A\u0661": "x"}, "A"),
        ("true", {"OK": "a\0b"}, "OK"),
    ],
)
def test_render_command_refuses_bad_input(command: object, env: object, match: str) -> None:
    with pytest.raises(InvalidCommand, match=match):
        render_command(command, env)  # type: ignore[arg-type]

"""Commands over a real SSH session: exit codes, streamed output, environment, timeouts."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from gpulayer.ssh.errors import SshCommandTimeout, SshConnectionError, SshSessionClosed
from gpulayer.ssh.session import SshSession
from tests.support.sshd_hosts import SshdHost


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_exit_code_is_returned(ssh_host: SshdHost, code: int) -> None:
    with SshSession(ssh_host.target()) as session:
        assert session.exec(f"exit {code}") == code


def test_stdout_and_stderr_arrive_on_their_own_streams(ssh_host: SshdHost) -> None:
    with SshSession(ssh_host.target()) as session:
        result = session.run("echo to-out; echo to-err >&2; exit 7")
    assert result.exit_code == 7
    assert result.stdout == "to-out\n"
    assert result.stderr == "to-err\n"


def test_output_is_streamed_while_the_command_runs(ssh_host: SshdHost, tmp_path: Path) -> None:
    # The command only finishes after the callback has seen its first line: if output were
    # delivered at the end, the command would wait until the timeout instead.
    go = f"/tmp/go-{secrets.token_hex(4)}"  # on the host, which shares no disk with us
    seen: list[tuple[str, str]] = []

    def on_output(stream: str, text: str) -> None:
        seen.append((stream, text))
        if "waiting" in text:
            ssh_host.run(["touch", go], check=True)

    with SshSession(ssh_host.target()) as session:
        code = session.exec(
            f"echo waiting; while [ ! -e {go} ]; do sleep 0.02; done; echo released",
            on_output=on_output,
            timeout=60,
        )
    assert code == 0
    text = "".join(t for s, t in seen if s == "stdout")
    assert text == "waiting\nreleased\n"
    assert len([t for s, t in seen if s == "stdout"]) >= 2


def test_multibyte_text_survives_chunking(ssh_host: SshdHost) -> None:
    line = "αβγ—日本語—🙂"
    with SshSession(ssh_host.target()) as session:
        result = session.run(
            ["python3", "-c", f"import sys\nfor _ in range(20000): sys.stdout.write({line!r})"]
        )
    assert result.exit_code == 0
    assert result.stdout == line * 20000


def test_env_values_are_quoted_and_exported(ssh_host: SshdHost) -> None:
    env = {"PLAIN": "x", "TRICKY": 'it\'s $HOME; `rm -rf /` "q"', "EMPTY": ""}
    with SshSession(ssh_host.target()) as session:
        result = session.run(
            [
                "python3",
                "-c",
                "import os; print(repr([os.environ[k] for k in ('PLAIN','TRICKY','EMPTY')]))",
            ],
            env=env,
        )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == repr([env["PLAIN"], env["TRICKY"], env["EMPTY"]])


def test_argument_lists_are_quoted_word_by_word(ssh_host: SshdHost) -> None:
    words = ["printf", "%s|", "two words", "semi;colon", "$DOLLAR", "*"]
    with SshSession(ssh_host.target()) as session:
        result = session.run(words)
    assert result.stdout == "two words|semi;colon|$DOLLAR|*|"


def test_stdin_is_closed(ssh_host: SshdHost) -> None:
    with SshSession(ssh_host.target()) as session:
        result = session.run("cat; echo after-cat", timeout=30)
    assert result.exit_code == 0
    assert result.stdout == "after-cat\n"


def test_timeout_raises_and_the_session_stays_usable(ssh_host: SshdHost) -> None:
    with SshSession(ssh_host.target()) as session:
        with pytest.raises(SshCommandTimeout) as caught:
            session.exec("sleep 30", timeout=0.5)
        assert caught.value.timeout == 0.5
        assert session.run("echo still-here").stdout == "still-here\n"


def test_commands_run_on_the_host_itself(ssh_host: SshdHost) -> None:
    with SshSession(ssh_host.target()) as session:
        result = session.run("hostname; id -un")
    expected_name = (
        ssh_host.name if ssh_host.lab.namespaced else ssh_host.run("hostname").stdout.strip()
    )
    assert result.stdout.split() == [expected_name, ssh_host.user]


def test_connection_refused_is_typed(ssh_hosts, host_keys) -> None:
    (host,) = ssh_hosts(1, start=False)
    with pytest.raises(SshConnectionError):
        SshSession(host.target(), host_keys=host_keys).connect(timeout=5)


def test_use_after_close_is_typed(ssh_host: SshdHost) -> None:
    session = SshSession(ssh_host.target()).connect()
    session.close()
    session.close()
    assert not session.connected
    with pytest.raises(SshSessionClosed):
        session.exec("true")


def test_dropped_host_surfaces_as_connection_error(ssh_host: SshdHost) -> None:
    session = SshSession(ssh_host.target()).connect()
    try:
        ssh_host.stop()
        with pytest.raises((SshConnectionError, SshSessionClosed)):
            session.exec("true", timeout=30)
    finally:
        session.close()

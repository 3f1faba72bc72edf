"""`gpulayer server` says it listens only once it does: a port in use is one line, exit 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.cli import run_cli
from tests.support.servers import ServerProcess

pytestmark = pytest.mark.slow


def test_a_port_in_use_is_one_line_and_nothing_claims_to_listen(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = run_cli(
            ["server", "--host", "127.0.0.1", "--port", str(port)],
            env={"GPULAYER_HOME": str(tmp_path / "home")},
            timeout=60,
        )
    assert result.returncode == 2, result.stderr
    assert "listening" not in result.stdout
    assert "admin token" not in result.stdout  # refused before anything was set up
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--port: 127.0.0.1:{port} is already in use" in lines[0], lines


def test_listening_is_said_once_the_server_answers(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "home").start()
    try:
        assert server.client().health(timeout=5)["ok"] is True
        log = (tmp_path / "home" / "server.log").read_text()
        assert log.count(f"listening on http://127.0.0.1:{server.port}") == 1
    finally:
        server.stop()

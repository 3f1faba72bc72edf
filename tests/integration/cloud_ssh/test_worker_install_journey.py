"""Two jobs in a row on one ssh-provider host, through the real command line and its local
control plane: the second job's log says the worker's install was verified and reused, nothing
was installed, and the host's install is the same one, untouched."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow

INSTALL_WORDS = ("installing the worker", "creating venv", "wheels from", "wheelhouse: uploading")


@pytest.fixture
def home(tmp_path: Path, ssh_host: SshdHost) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    entry = {
        "name": "box",
        "address": ssh_host.address,
        "port": ssh_host.port,
        "user": ssh_host.user,
        "key_path": str(ssh_host.client_key),
        "authorized_keys": str(ssh_host.authorized_keys),
        "hourly_price": 0.5,
        "region": "lab",
        "python": "python3",
        "install_root": str(tmp_path / "installs"),
    }
    config = {
        "ssh": {"hosts": [entry], "state_dir": str(tmp_path / "ssh-state")},
        "gpulayer": {
            "ssh_cidr": "127.0.0.1/32",
            # Test hosts share this kernel: the dead-man switch only records what it would do.
            "deadman_action": f"record:{tmp_path / 'deadman.jsonl'}",
        },
    }
    (home / "providers.yaml").write_text(yaml.safe_dump(config))
    yield home
    stop_local_control_plane(home)


def _cli(home: Path, *args: str) -> Any:
    env = {
        "GPULAYER_HOME": str(home),
        "GPULAYER_IDLE_SECONDS": "120",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    done = run_cli(list(args), env=env, cwd=home.parent, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _job(home: Path, word: str) -> str:
    """Submit a one-line job to the ssh host, as a user would, and follow it to its end; its
    log."""
    submit = ("submit", "--target", "cloud", "--provider", "ssh")
    _cli(home, *submit, "--", "python", "-c", f"print({word!r})")
    job_id = json.loads(_cli(home, "ls", "-n", "1", "--json").stdout)[0]["id"]
    # With --json the log holds the control plane's own lines too (the bootstrap's).
    lines = json.loads(_cli(home, "logs", job_id, "--json").stdout)
    log = "".join(line["text"] + "\n" for line in lines)
    assert word in log, log
    return log


def _install_dirs(host: SshdHost, tmp_path: Path) -> dict[str, str]:
    """The worker installs on the host, by name, with their seal's inode and mtime."""
    root = tmp_path / "installs" / "worker"
    found = {}
    for name in host.listing(root) or []:
        if name.startswith("gpulayer-"):
            seal = host.run(["stat", "-c", "%i %Y", f"{root}/{name}/seal.json"], check=True)
            found[name] = seal.stdout.strip()
    return found


def test_the_second_job_on_a_host_reuses_its_worker_install(
    home: Path, ssh_host: SshdHost, tmp_path: Path
) -> None:
    first_log = _job(home, "first-job")
    assert "installing the worker into" in first_log, first_log
    installs = _install_dirs(ssh_host, tmp_path)
    assert len(installs) == 1, installs

    second_log = _job(home, "second-job")
    [name] = installs
    assert f"reusing its verified install {tmp_path}/installs/worker/{name}" in second_log
    assert not [w for w in INSTALL_WORDS if w in second_log], second_log
    assert _install_dirs(ssh_host, tmp_path) == installs
    # The jobs' own dirs are gone; the install stays for the next job.
    left = set(ssh_host.listing(tmp_path / "installs") or [])
    assert "worker" in left and left <= {"worker", "wheelhouse", "setup-envs"}, left

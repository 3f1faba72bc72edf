"""The README's "Try it without a cloud account", step by step, against a real sshd host.

The README points the ssh provider at this machine's own sshd; here a lab host (a machine of
its own, with its own filesystem and sshd) stands in for it, reached at its own address and
port. Every other step is the README's own: its commands run as written (a fresh HOME stands
in for the user's), and its providers.yaml is used with only the host's address, port and user
swapped in.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane
from tests.support.sshd_hosts import SshdHost, SshdLab

README = Path(__file__).resolve().parents[2] / "docs" / "clouds.md"
TITLE = "## Try it without a cloud account"


def _section() -> str:
    text = README.read_text()
    start = text.index(TITLE)
    end = text.index("\n## ", start + len(TITLE))
    return text[start:end]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def _commands(block: str) -> list[str]:
    """The block's command lines as written, their trailing comments dropped."""
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh user: HOME of its own, gpulayer's home where the README says it is."""
    home = tmp_path / "alice"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("GPULAYER_HOME", "XDG_DATA_HOME", "GPULAYER_PROVIDERS_FILE", "GPULAYER_SERVER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "300")
    yield home
    stop_local_control_plane(home / ".local" / "share" / "gpulayer")


@pytest.fixture
def own_sshd(sshd_lab: SshdLab, ssh_hosts: Any) -> SshdHost:
    """A host whose sshd reads keys where a stock sshd does, ~/.ssh/authorized_keys."""
    if sshd_lab.mode != "rootfs":
        pytest.skip("needs a host with a filesystem of its own (root, network namespaces)")
    (host,) = ssh_hosts(1, start=False)
    host.configure("AuthorizedKeysFile .ssh/authorized_keys")
    host.start()
    host.wait_ready()
    return host


@pytest.mark.slow
def test_the_readme_steps_run_a_cloud_job_on_an_ssh_host(
    own_sshd: SshdHost, user_home: Path
) -> None:
    section = _section()
    setup, run = (_commands(b) for b in _blocks(section, "bash"))
    (providers_text,) = _blocks(section, "yaml")

    # Steps 1-2 install and start sshd: the lab host is that sshd.
    assert setup[0].startswith("sudo apt-get install -y openssh-server")
    assert "ssh start" in setup[1] or "enable --now ssh" in setup[1]
    # Step 3: the key, made as the README makes it.
    assert "ssh-keygen" in setup[2]
    subprocess.run(["sh", "-c", setup[2]], check=True, capture_output=True, timeout=60)
    public = (user_home / ".ssh" / "gpulayer_try.pub").read_text().strip()
    # Step 4 runs on the host (this very machine, in the README): the key is authorized there.
    step = setup[3].replace("cat ~/.ssh/gpulayer_try.pub", f"echo {shlex.quote(public)}")
    assert step != setup[3]
    # On the host, ~ is its user's home there (host.run passes this test's HOME along).
    own_sshd.run(f"export HOME=~{own_sshd.user} && mkdir -p -m 700 ~/.ssh && {step}", check=True)

    config = yaml.safe_load(providers_text)
    (host,) = config["ssh"]["hosts"]
    assert set(config) == {"ssh"} and (host["address"], host["port"]) == ("127.0.0.1", 22)
    host.update(address=own_sshd.address, port=own_sshd.port, user=own_sshd.user)
    gpulayer_home = user_home / ".local" / "share" / "gpulayer"
    gpulayer_home.mkdir(parents=True)
    (gpulayer_home / "providers.yaml").write_text(yaml.safe_dump(config))

    check, offers, submit = run
    assert check.startswith("gpulayer config check") and offers.startswith("gpulayer offers")
    checked = run_cli(shlex.split(check)[1:])
    assert checked.returncode == 0, checked.stderr
    listed = run_cli(shlex.split(offers)[1:])
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()[1:]]
    assert rows and rows[0][:3] == ["ssh", "on-prem", host["name"]], (
        listed.stdout[-2500:] + listed.stderr
    )

    assert submit.startswith("gpulayer submit --target cloud -- python -c")
    result = run_cli(shlex.split(submit)[1:], timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"hello from {own_sshd.name}" in result.stdout

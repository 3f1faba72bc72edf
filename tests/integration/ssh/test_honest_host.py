"""A test host is a machine of its own: none of the controller's paths, packages or processes.

A rented-machine test proves something only if the host cannot see what the controller has;
this checks it through SSH, the way gpulayer sees a host. Only rootfs hosts (as root) are such
machines: loopback and netns hosts share this machine's filesystem by design.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import pytest

import gpulayer
from gpulayer.ssh.session import SshSession
from tests.support.sshd_hosts import SshdHost, SshdLab


@pytest.fixture
def honest_host(sshd_lab: SshdLab, ssh_host: SshdHost) -> SshdHost:
    if sshd_lab.mode != "rootfs":
        pytest.skip(f"{sshd_lab.mode} hosts share this machine's filesystem (rootfs needs root)")
    return ssh_host


def test_no_path_of_the_controller_exists_on_the_host(
    honest_host: SshdHost, tmp_path: Path
) -> None:
    submit_folder = tmp_path / "project"
    submit_folder.mkdir()
    (submit_folder / "train.py").write_text("print('hello')\n")
    home = os.environ["GPULAYER_HOME"]
    paths: list[str | os.PathLike[str]] = [
        submit_folder,
        submit_folder / "train.py",
        home,
        sys.prefix,
        Path(gpulayer.__file__).parent,
        "/work",
        # The lab's own files for the host (its client key, its sshd config, the run's
        # state) stay here too: what the host's sshd needs is on the host's own disk.
        honest_host.workdir,
        honest_host.client_key,
        honest_host.config_path,
        honest_host.lab.run_dir,
    ]
    assert all(Path(p).exists() for p in paths)  # all of them are here ...
    with SshSession(honest_host.target()) as session:
        # ... and none of them on the host.
        for path in paths:
            assert session.run(["test", "-e", str(path)]).exit_code == 1, path
        assert session.run(["test", "-s", str(honest_host.authorized_keys)]).exit_code == 0
        # A file the host writes is not on the controller either.
        mark = f"/tmp/gpulayer-honest-{secrets.token_hex(4)}"
        assert session.run(["touch", mark]).exit_code == 0
        assert session.run(["test", "-e", mark]).exit_code == 0
    assert not Path(mark).exists()


def test_the_host_runs_its_own_python_without_gpulayer_or_torch(honest_host: SshdHost) -> None:
    with SshSession(honest_host.target()) as session:
        own = session.run(["python3", "-c", "import sys; print(sys.prefix, sys.version_info[:2])"])
        assert own.exit_code == 0, own.stderr
        assert own.stdout.split()[0] == "/usr" != sys.prefix
        for module in ("gpulayer", "torch"):
            imported = session.run(["python3", "-c", f"import {module}"])
            assert imported.exit_code == 1, module
            assert f"No module named '{module}'" in imported.stderr


def test_the_host_has_its_own_processes_and_name(honest_host: SshdHost) -> None:
    ours = {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("pid", "mnt", "uts", "net")}
    with SshSession(honest_host.target()) as session:
        theirs = {
            kind: session.run(["readlink", f"/proc/1/ns/{kind}"]).stdout.strip() for kind in ours
        }
        init = session.run(["cat", "/proc/1/cmdline"]).stdout
        table = session.run(["ps", "-e", "-ww", "-o", "pid=,args="]).stdout
        name = session.run(["hostname"]).stdout.strip()
    assert all(theirs[kind] and theirs[kind] != ours[kind] for kind in ours), (ours, theirs)
    # PID 1 on the host is the host's own, not this machine's init.
    assert init != Path("/proc/1/cmdline").read_text()
    assert init.split("\0")[0] == "/usr/bin/python3"
    # Its process table is its own: this test's process is not in it, whose pid 1 is there.
    own = Path(f"/proc/{os.getpid()}/cmdline").read_text().replace("\0", " ").strip()
    assert table.split()[0] == "1" and own not in table, table
    assert name == honest_host.name != os.uname().nodename

"""The worker installed once per machine and version: a second job on a host reuses the install
(nothing installed, no wheel sent), a changed install is found and rebuilt, and the cold path
says what it waits for at least every 5 s. Real sshd hosts, a real control plane, the real
scripts."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from gpulayer.cloud.bootstrap import bootstrap_worker
from gpulayer.cloud.wheelhouse import Wheelhouse
from tests.integration.cloud_ssh.helpers import ControlPlane, connect, make_plan
from tests.support.servers import wait_for_job
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow

INSTALL_LINES = ("installing the worker", "creating venv", "wheels from", "wheelhouse: uploading")


class Job:
    """One job's bootstrap on the host, with what it said and when."""

    def __init__(self, host: SshdHost, control_plane: ControlPlane, install_dir: Path) -> None:
        self.host = host
        self.control_plane = control_plane
        self.install_dir = install_dir
        self.lines: list[tuple[float, str]] = []

    @property
    def said(self) -> list[str]:
        return [line for _, line in self.lines]

    def run(self, wheelhouse: Wheelhouse) -> str:
        """Bootstrap, run one command job on the worker, stop and clean up; returns where the
        job dir's venv pointed while it ran."""
        plan = make_plan(
            self.install_dir,
            self.control_plane.port,
            self.control_plane.worker_token(),
            kind="remote",
            worker_name=self.install_dir.name,
        )
        session = connect(self.host)
        try:
            begun = time.monotonic()
            self.lines.append((begun, "start"))
            worker = bootstrap_worker(
                session,
                plan,
                wheelhouse,
                lambda line: self.lines.append((time.monotonic(), line)),
                timeout=240,
            )
            self.lines.append((time.monotonic(), "joined"))
            try:
                linked = self.host.run(["readlink", str(self.install_dir / "venv")], check=True)
                assert worker.worker_id is not None
                job = self.control_plane.client.submit(
                    {
                        "workload": {
                            "kind": "command",
                            "command": ["python", "-c", "import sys; print('ran', sys.prefix)"],
                        },
                        "placement": {"target": "remote", "worker_ids": [worker.worker_id]},
                    }
                )
                done = wait_for_job(self.control_plane.client, job["id"], {"succeeded", "failed"})
                assert done["state"] == "succeeded", done
                logs = self.control_plane.client.logs(job["id"])["lines"]
                assert any(f"ran {self.install_dir}/venv" in line["text"] for line in logs), logs
            finally:
                worker.stop()
                worker.cleanup()
        finally:
            session.close()
        assert not self.host.exists(self.install_dir)
        return linked.stdout.strip()


def _installs(host: SshdHost, root: Path) -> list[str]:
    return [name for name in host.listing(root) or [] if name.startswith("gpulayer-")]


def _identity(host: SshdHost, path: Path) -> str:
    """Inode and modification time, as the host sees them."""
    return host.run(["stat", "-c", "%i %Y.%y", str(path)], check=True).stdout.strip()


def test_a_second_job_on_the_host_reuses_the_worker_install(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    root = tmp_path / "gpulayer" / "worker"
    first = Job(ssh_host, control_plane, tmp_path / "gpulayer" / "job-a")
    venv = first.run(wheelhouse)
    assert any("installing the worker into" in line for line in first.said), first.said
    [install] = _installs(ssh_host, root)
    assert venv == str(root / install / "venv")
    seal, module = root / install / "seal.json", root / install / "venv" / "pyvenv.cfg"
    before = (_identity(ssh_host, root / install), _identity(ssh_host, seal))
    before_module = _identity(ssh_host, module)
    # The cold path was never silent for more than 5 s.
    stamps = [at for at, _ in first.lines]
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= 5.0, first.lines

    second = Job(ssh_host, control_plane, tmp_path / "gpulayer" / "job-b")
    assert second.run(wheelhouse) == venv
    assert any(f"reusing its verified install {root / install}" in s for s in second.said)
    assert not [s for s in second.said if any(word in s for word in INSTALL_LINES)], second.said
    assert _installs(ssh_host, root) == [install]
    # The same install: its inode and contents untouched (its mtime marks it used last).
    assert _identity(ssh_host, root / install).split()[0] == before[0].split()[0]
    assert _identity(ssh_host, seal) == before[1]
    assert _identity(ssh_host, module) == before_module


def test_a_changed_install_is_found_and_rebuilt(
    ssh_host: SshdHost, control_plane: ControlPlane, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    root = tmp_path / "gpulayer" / "worker"
    Job(ssh_host, control_plane, tmp_path / "gpulayer" / "job-a").run(wheelhouse)
    [install] = _installs(ssh_host, root)
    site = ssh_host.run(
        f"ls -d {root / install}/venv/lib/python3*/site-packages", check=True
    ).stdout.strip()
    module = f"{site}/gpulayer/__init__.py"
    original = ssh_host.read_text(module)
    # A job (or anything else on the host) changes a module of the shared install.
    ssh_host.run(f"chmod u+w {module} && echo 'TAMPERED = 1' >> {module}", check=True)

    second = Job(ssh_host, control_plane, tmp_path / "gpulayer" / "job-b")
    second.run(wheelhouse)
    said = "\n".join(second.said)
    assert "gpulayer/__init__.py changed" in said, said
    assert "worker installed in" in said
    assert ssh_host.read_text(module) == original

    # A file added to it (a .pth runs at every start) is found as well.
    ssh_host.run(f"chmod u+w {site} && echo 'import os' > {site}/extra.pth", check=True)
    third = Job(ssh_host, control_plane, tmp_path / "gpulayer" / "job-c")
    third.run(wheelhouse)
    assert any("extra.pth was added" in line for line in third.said), third.said
    assert not ssh_host.exists(f"{site}/extra.pth")
    assert _installs(ssh_host, root) == [install]

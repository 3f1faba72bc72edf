"""Two bootstraps that install the same worker on one machine at once (nodes on a shared
filesystem, a retried bootstrap) build it once: one installs, the other waits for it, saying so,
and takes it. The host side runs as the bootstrap runs it (``python -c SOURCE install ...``),
with this machine's python as the host's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpulayer.cloud.bootstrap.worker_install import host_source, wheelset_digest
from gpulayer.cloud.wheelhouse import build_wheelhouse

pytestmark = pytest.mark.slow


def test_two_installs_at_once_build_one_worker(tmp_path: Path) -> None:
    wheelhouse = build_wheelhouse(tmp_path / "wheelhouse-cache")
    root = tmp_path / "installs" / "worker"
    digest = wheelset_digest(wheelhouse, system_site_packages=False)
    argv = [sys.executable, "-c", host_source(), "install", str(root), digest]
    argv += [wheelhouse.gpulayer_version, str(wheelhouse.path), "0"]
    runs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = []
    for run in runs:
        out, _ = run.communicate(timeout=600)
        assert run.returncode == 0, out
        outputs.append(out)

    venvs = {
        line.split("=", 1)[1]
        for out in outputs
        for line in out.splitlines()
        if "worker-venv=" in line
    }
    [venv] = venvs
    installed = [out for out in outputs if "installing the worker into" in out]
    assert len(installed) == 1, outputs
    [other] = [out for out in outputs if out is not installed[0]]
    assert "reusing the worker install" in other, other
    assert Path(venv).parent.parent == root
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == [
        Path(venv).parent.name
    ]
    done = subprocess.run(
        [venv + "/bin/python", "-I", "-c", "import gpulayer, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == venv

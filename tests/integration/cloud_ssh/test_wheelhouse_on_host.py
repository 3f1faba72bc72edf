"""A wheelhouse built from this controller installs on a host with no package index, and the
venv it makes runs the worker without the server-only packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.cloud.wheelhouse import SERVER_ONLY, Wheelhouse
from tests.integration.cloud_ssh.helpers import PYTHON, connect
from tests.support.sshd_hosts import SshdHost

pytestmark = pytest.mark.slow


def test_venv_made_on_a_host_from_the_wheelhouse_runs_the_worker_cli(
    ssh_host: SshdHost, wheelhouse: Wheelhouse, tmp_path: Path
) -> None:
    remote_wheels = tmp_path / "host-wheels"
    venv = tmp_path / "venv"
    pip = next(w for w in wheelhouse.files if w.distribution == "pip")
    wheels = [str(remote_wheels / w.name) for w in wheelhouse.files if w.distribution != "pip"]
    session = connect(ssh_host)
    try:
        assert session.put_dir(wheelhouse.path, str(remote_wheels)) >= len(wheelhouse.files)

        def run(*argv: str) -> str:
            result = session.run(list(argv), env={"PIP_CONFIG_FILE": "/dev/null"}, timeout=300)
            assert result.exit_code == 0, result.stderr
            return result.stdout

        run(PYTHON, "-m", "venv", "--without-pip", str(venv))
        run(
            str(venv / "bin" / "python"),
            str(remote_wheels / pip.name / "pip"),
            "install",
            "--no-index",
            "--find-links",
            str(remote_wheels),
            "--no-deps",
            "--no-cache-dir",
            *wheels,
        )
        python = str(venv / "bin" / "python")
        assert "worker" in run(python, "-m", "gpulayer", "--help")
        assert "--deadman-action" in run(python, "-m", "gpulayer", "worker", "start", "--help")
        located = run(python, "-c", "import gpulayer; print(gpulayer.__file__)").strip()
        # The package came from the wheel, not from the source tree of this checkout.
        assert located.startswith(str(venv))
        check = "; ".join(
            f"import importlib.util as u; assert u.find_spec({name!r}) is None, {name!r}"
            for name in sorted(SERVER_ONLY)
        )
        run(python, "-c", check)
        # The gpulayer console script was written by pip from the wheel's entry points.
        assert "worker" in run(str(venv / "bin" / "gpulayer"), "--help")
    finally:
        session.close()


def test_a_host_keeps_only_the_newest_two_wheelhouses(ssh_host: SshdHost, tmp_path: Path) -> None:
    import shlex

    from gpulayer.cloud.bootstrap.commands import prune_wheelhouses_command

    shelf = tmp_path / "root" / "wheelhouse"  # on the host
    names = [f"gpulayer-0.{i}-cp311-linux_x86_64-abc{i}" for i in range(4)]
    steps = [f"mkdir -p {shlex.quote(str(shelf / 'not-ours'))}"]
    for age, name in enumerate(reversed(names)):
        folder = shlex.quote(str(shelf / name))
        steps += [
            f"mkdir -p {folder}",
            f"echo wheel > {folder}/w.whl",
            f"touch -d @{1_000_000 - age * 100} {folder}",
        ]
    ssh_host.run(" && ".join(steps), check=True)
    current = shelf / names[0]  # the oldest, but the one this job just used
    command = prune_wheelhouses_command(str(current))
    assert command is not None
    session = connect(ssh_host)
    try:
        assert session.run(command, timeout=60).exit_code == 0
    finally:
        session.close()
    left = ssh_host.run(["ls", "-A", str(shelf)], check=True).stdout.split()
    assert sorted(left) == sorted([names[0], names[3], "not-ours"])
    assert prune_wheelhouses_command(str(tmp_path / "elsewhere" / names[0])) is None

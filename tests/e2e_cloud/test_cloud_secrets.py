"""A job's `secrets` on a rented machine (a real sshd host of its own, which has none of the
submitter's environment): read from the submitting shell, held in the local control plane's
memory, handed to the job's worker with its claim; never written down on either side."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.support.cli import run_cli
from tests.support.sshd_hosts import SshdLab

pytestmark = pytest.mark.slow

# A value no test or log elsewhere holds: found anywhere on disk, it was written down.
SECRET = "hf_gpulayer_secret_41_never_written"
READS = (
    "import hashlib, os; v = os.environ['HF_TOKEN']; "
    "print('digest', hashlib.sha256(v.encode()).hexdigest()); print('value', v)"
)


def _holding(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if SECRET.encode() in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def test_a_secret_from_the_submitting_shell_reaches_the_rented_machine(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(host, "rented", 0.5, tmp_path / "installs")])
    argv = ["submit", "--target", "cloud", "--secret", "HF_TOKEN", "--", "python", "-c", READS]
    done = run_cli(argv, env={"HF_TOKEN": SECRET}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"digest {hashlib.sha256(SECRET.encode()).hexdigest()}" in done.stdout
    assert "value ***" in done.stdout  # masked in the job's log
    assert SECRET not in done.stdout + done.stderr
    assert not _holding(cloud_home), "the secret was written on the controller"
    assert not _holding(host.fs_dir), "the secret was written on the rented machine"

    # A shell without it: the job fails naming the secret, and nothing is left running.
    missing = run_cli(argv, timeout=300)
    assert missing.returncode != 0
    assert "secret_missing" in missing.stderr and "HF_TOKEN" in missing.stderr, missing.stderr

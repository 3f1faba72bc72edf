"""A job on a rented machine (a real sshd host of its own) that writes files outside
$GPULAYER_OUTPUT_DIR, as the DDP tutorial writes snapshot.pt: its end names what the machine's
teardown deletes, and `outputs.paths` keeps what it names instead."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.e2e_cloud.test_cloud_ssh_lifecycle import assert_nothing_left
from tests.support.cli import run_cli
from tests.support.sshd_hosts import SshdLab

pytestmark = pytest.mark.slow

WRITES = "import pathlib; pathlib.Path('snapshot.pt').write_bytes(b'x' * 2048); print('saved')"
NOTE = (
    "note: 1 file written outside $GPULAYER_OUTPUT_DIR is deleted with the machine: "
    "snapshot.pt (2.0 KB); see outputs.paths"
)


def test_files_left_in_the_working_folder_are_named_or_kept(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "rented", 0.5, root)])
    left = run_cli(["submit", "--target", "cloud", "--", "python", "-c", WRITES], timeout=300)
    assert left.returncode == 0, left.stderr
    assert NOTE in left.stderr, left.stderr
    first = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]["id"]

    job = tmp_path / "job.json"
    job.write_text(
        json.dumps(
            {
                "workload": {"kind": "command", "command": ["python", "-c", WRITES]},
                "placement": {"target": "cloud"},
                "outputs": {"paths": ["snapshot.pt"]},
            }
        )
    )
    kept = run_cli(["submit", "-f", str(job)], timeout=300)
    assert kept.returncode == 0, kept.stderr
    assert "written outside $GPULAYER_OUTPUT_DIR" not in kept.stderr, kept.stderr
    newest = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]["id"]
    listed = json.loads(run_cli(["artifacts", newest, "--json"]).stdout)
    assert [a["path"] for a in listed] == ["snapshot.pt"]
    assert_nothing_left(cloud_home, [first, newest], root, sshd_lab, host)

"""`outputs.paths` on a remote worker process: files a script writes in its working folder
(as the DDP tutorial's snapshot.pt) are kept as outputs; a link it plants there to a file of
the worker's is named and never read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_gangs import all_lines
from tests.support.servers import wait_for_job

pytestmark = pytest.mark.slow

SCRIPT = """
import os, pathlib
pathlib.Path("snapshot.pt").write_bytes(b"weights")
pathlib.Path("ckpt").mkdir()
pathlib.Path("ckpt/epoch-1.pt").write_bytes(b"epoch one")
pathlib.Path("notes.txt").write_text("not asked for")
os.symlink(os.environ["WORKER_FILE"], "stolen.pt")
"""


def test_files_outside_the_output_folder_are_kept_as_named(
    cluster_factory: Any, tmp_path: Path
) -> None:
    cluster = cluster_factory(1)
    client = cluster.client
    secret = tmp_path / "worker-only.txt"
    secret.write_text("the worker's own file")
    spec = {
        "name": "outside",
        "workload": {"kind": "command", "command": ["python", "-c", SCRIPT]},
        "env": {"WORKER_FILE": str(secret)},
        "outputs": {"paths": ["*.pt", "ckpt/**"]},
        "placement": {"target": "remote"},
    }
    job_id = str(client.submit(spec)["id"])
    job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=120)
    assert job["state"] == "succeeded", all_lines(client, job_id)
    paths = {a["path"] for a in client.artifacts(job_id)}
    assert paths == {"snapshot.pt", "ckpt/epoch-1.pt"}
    client.download_artifact(job_id, "ckpt/epoch-1.pt", tmp_path / "epoch.pt")
    assert (tmp_path / "epoch.pt").read_bytes() == b"epoch one"
    lines = [line["text"] for line in all_lines(client, job_id)]
    assert any(
        "outputs.paths: skipped stolen.pt: a symbolic link, not followed" in line
        for line in lines
    ), lines
    assert not any("the worker's own file" in line for line in lines)

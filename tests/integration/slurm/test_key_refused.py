"""A job key written where the cluster's sshd does not read keys, on the real cluster: the
allocated node answers and refuses the key, so the job ends in seconds with one line naming the
cluster's setting, the allocation is released at once (not held for the 600 s window), the
ledger ends at the refusal, and `gpulayer config check` names the setting before any job."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e_cloud.journey import last_job, ledger, wait_until
from tests.integration.slurm.test_journeys import write_providers
from tests.support.cli import run_cli
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slow


def _point_job_keys_at(home: Path, cluster: SlurmCluster, path: str) -> None:
    config = yaml.safe_load((home / "providers.yaml").read_text())
    config["slurm"]["clusters"][cluster.name]["authorized_keys"] = path
    (home / "providers.yaml").write_text(yaml.safe_dump(config))


def _seconds(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).timestamp()


def test_a_refused_job_key_releases_the_allocation_at_once(
    slurm_cluster: SlurmCluster, slurm_home: Path, tmp_path: Path
) -> None:
    write_providers(slurm_home, slurm_cluster, tmp_path)
    checked = run_cli(["config", "check"], timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"slurm {slurm_cluster.name} login node: ok" in checked.stdout, checked.stdout

    unread = slurm_cluster.shared / tmp_path.name / "keys-sshd-does-not-read"
    unread.parent.mkdir(parents=True, exist_ok=True)
    on_nodes = str(slurm_cluster.on_nodes(unread))
    _point_job_keys_at(slurm_home, slurm_cluster, on_nodes)
    setting = f"slurm.clusters[{slurm_cluster.name}].authorized_keys"
    line = (
        f"{setting}: the host refused the job key written to {on_nodes}; "
        "set the file its sshd reads"
    )
    checked = run_cli(["config", "check"], timeout=120)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"slurm {slurm_cluster.name} login node: {line}" in checked.stdout, checked.stdout

    begun = time.monotonic()
    result = run_cli(
        ["submit", "--target", "cloud", "--provider", "slurm", "--timeout", "120", "--",
         "python3", "-c", "print('never runs')"],
        timeout=240,
    )  # fmt: skip
    took = time.monotonic() - begun
    assert result.returncode != 0, result.stdout[-3000:] + result.stderr[-3000:]
    job = last_job()
    lines = json.loads(run_cli(["logs", job["id"], "--json"]).stdout)
    log = "".join(entry["text"] + "\n" for entry in lines)
    assert line in log, log[-4000:]
    assert "never runs" not in log
    assert took < 120, (took, log[-3000:])
    # The allocation goes with the refusal, not after the provisioning window.
    wait_until(lambda: slurm_cluster.queue() == [], timeout=30, what="the allocation to end")
    wait_until(
        lambda: all(i["state"] == "terminated" for i in ledger(job["id"])["instances"]),
        what="teardown",
    )
    # A configuration error gets one more offer of the provider (another partition), then
    # the provider is blocked for the job: at most 2 allocations, each charged to its refusal.
    instances = ledger(job["id"])["instances"]
    assert 1 <= len(instances) <= 2, instances
    for instance in instances:
        launched, ended = _seconds(instance["launched_at"]), _seconds(instance["ended_at"])
        assert 0 < ended - launched < 20, instance

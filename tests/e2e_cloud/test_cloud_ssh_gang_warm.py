"""Gangs on warm machines (real sshd hosts, machines of their own, with `idle_seconds`): a
2-node gang's machines go idle together once it ends, and a second 2-node gang submitted right
after takes both at once, on the same hosts and workers, with no launch and no bootstrap; a
reap ends them and nothing is left."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import last_job, wait_until
from tests.e2e_cloud.test_cloud_ssh_fleets import nothing_left
from tests.e2e_cloud.test_cloud_ssh_gang import gang_job, rank_reports, teardown_done, two_hosts
from tests.e2e_cloud.test_cloud_ssh_lifecycle import instances, status
from tests.e2e_cloud.test_cloud_ssh_warm import keep_warm
from tests.support.cli import run_cli
from tests.support.package_index import PackageIndex
from tests.support.sshd_hosts import SshdLab

pytestmark = pytest.mark.slow


def idle_gang() -> list[dict[str, Any]] | None:
    idle = [i for i in instances() if i["state"] == "idle"]
    return idle if len(idle) == 2 else None


def run_gang(folder: Path, torch_index: PackageIndex) -> tuple[dict[str, Any], str]:
    job_file = gang_job(folder, torch=torch_index)
    result = run_cli(["submit", "-f", str(job_file)], cwd=job_file.parent, timeout=600)
    job = last_job()
    assert result.returncode == 0, (result.stderr[-3000:], job)
    assert job["state"] == "succeeded"
    reports = rank_reports(result.stdout + result.stderr)
    assert sorted(r["rank"] for r in reports) == [0, 1]
    return job, result.stderr


def test_a_second_gang_runs_on_the_first_gangs_warm_hosts_without_launch_or_bootstrap(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path, torch_index: PackageIndex
) -> None:
    root, hosts = two_hosts(ssh_hosts, cloud_home, tmp_path, ("w1", "w2"))
    keep_warm(cloud_home, 300)
    first, first_log = run_gang(tmp_path / "first", torch_index)
    assert "bootstrapping the worker" in first_log
    # Its machines go idle together, neither torn down.
    idle = wait_until(idle_gang, what="both of the gang's machines to go idle")
    assert {i["job_id"] for i in idle} == {first["id"]}

    second, second_log = run_gang(tmp_path / "second", torch_index)
    assert "on 2 warm instances together" in second_log
    assert "no launch and no bootstrap" in second_log
    assert "bootstrapping the worker" not in second_log
    assert "launched together" not in second_log
    taken = status(second["id"])["instances"]
    assert {i["request_id"] for i in taken} == {i["request_id"] for i in idle}
    assert sorted(i["node_rank"] for i in taken) == [0, 1]
    assert len({i["launch_id"] for i in taken}) == 1
    for instance in taken:
        moves = [(h["from"], h["to"]) for h in instance["history"]]
        after = moves[moves.index(("idle", "ready")) :]
        assert ("ready", "in_use") in after
        assert not any(to in ("booting", "bootstrapping") for _, to in after)
    # The same two worker processes ran both gangs.
    workers = {a["worker_id"] for a in first["attempts"]}
    assert {a["worker_id"] for a in second["attempts"]} == workers and len(workers) == 2

    wait_until(idle_gang, what="the machines to go idle again")
    reaped = run_cli(["reap"], timeout=120)
    assert reaped.returncode == 0, reaped.stderr
    ended = teardown_done(second["id"])
    assert {i["state"] for i in ended} == {"terminated"}
    # The first gang's share of each machine is a handed_over entry; nothing else is left.
    assert {i["state"] for i in status(first["id"])["instances"]} == {"handed_over"}
    nothing_left(cloud_home, root, sshd_lab, *hosts)


def test_a_gang_takes_two_machines_of_a_fleet_at_once_and_gives_them_back_to_it(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path, torch_index: PackageIndex
) -> None:
    from tests.e2e_cloud.test_cloud_ssh_fleets import fleet_machines, set_fleets

    root, hosts = two_hosts(ssh_hosts, cloud_home, tmp_path, ("p1", "p2"))
    set_fleets(cloud_home, [{"name": "pair", "providers": ["ssh"], "min_nodes": 2}])

    def kept_pair() -> list[dict[str, Any]] | None:
        kept = [m for m in fleet_machines("pair") if m["state_label"] == "idle (kept: min_nodes)"]
        return kept if len(kept) == 2 else None

    up = wait_until(kept_pair, timeout=300, what="the fleet's two machines")
    job, log = run_gang(tmp_path / "on-fleet", torch_index)
    assert "on 2 warm instances together" in log and "bootstrapping the worker" not in log
    taken = status(job["id"])["instances"]
    assert {i["request_id"] for i in taken} == {m["request_id"] for m in up}
    assert {i["fleet"] for i in taken} == {"pair"}
    back = wait_until(kept_pair, what="both machines back in the fleet, kept")
    assert {m["request_id"] for m in back} == {m["request_id"] for m in up}
    set_fleets(cloud_home, [])
    nothing_left(cloud_home, root, sshd_lab, *hosts)

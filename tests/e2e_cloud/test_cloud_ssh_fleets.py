"""Named fleets on ssh-provider hosts (real sshd hosts, machines of their own): `fleets:` in
providers.yaml keeps min_nodes machines up with no job (launched, bootstrapped, idle and kept),
a job that fits takes one without a launch or bootstrap, the fleet tops back up when its
machine is gone, never holds more than max_nodes however many jobs fit it, and a fleet taken
out of the file ends its machines; nothing is left.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, job_processes, write_providers
from tests.e2e_cloud.test_cloud_ssh_lifecycle import (
    instances,
    logs,
    open_gate,
    status,
    submit_gated,
)
from tests.e2e_cloud.test_cloud_ssh_warm import run_job
from tests.support.cli import run_cli
from tests.support.sshd_hosts import SshdHost, SshdLab

pytestmark = pytest.mark.slow

ENDED = {"terminated", "never_launched", "handed_over"}


def set_fleets(home: Path, fleets: list[dict[str, Any]]) -> None:
    path = home / "providers.yaml"
    config = yaml.safe_load(path.read_text())
    if fleets:
        config["fleets"] = fleets
    else:
        config.pop("fleets", None)
    path.write_text(yaml.safe_dump(config))


def fleet_machines(fleet: str) -> list[dict[str, Any]]:
    return [i for i in instances() if i.get("fleet") == fleet and i["state"] not in ENDED]


def kept_idle(fleet: str, *, not_: str | None = None) -> dict[str, Any] | None:
    for item in fleet_machines(fleet):
        if item["state_label"] == "idle (kept: min_nodes)" and item["request_id"] != not_:
            return item
    return None


def nothing_left(home: Path, root: Path, lab: SshdLab, *hosts: SshdHost) -> None:
    wait_until(
        lambda: all(i["state"] in ENDED for i in instances("--all")),
        timeout=120,
        what="every instance to be torn down",
    )
    wait_until(lambda: not job_processes(root, *hosts), what="the workers to end")
    assert not list((home / "keys").glob("r-*"))  # key pairs and pinned host keys
    for host in hosts:
        wait_until(lambda h=host: not h.session_pids(), what=f"sessions on {host.name} to close")


def test_a_fleet_comes_up_without_a_job_a_job_takes_it_and_it_tops_back_up_until_removed(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    hosts = ssh_hosts(2)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(h, f"f{i}", 0.5, root) for i, h in enumerate(hosts)])
    set_fleets(
        cloud_home,
        [{"name": "train", "providers": ["ssh"], "min_nodes": 1, "max_nodes": 2}],
    )
    # No job: the control plane (started by this listing) launches and bootstraps one machine.
    kept = wait_until(lambda: kept_idle("train"), timeout=240, what="the fleet's machine")
    assert kept["job_id"] is None and kept["idle_seconds_left"] is None
    moves = [(h["from"], h["to"]) for h in kept["history"]]
    assert ("bootstrapping", "ready") in moves and moves[-1] == ("ready", "idle")
    listed = run_cli(["instances"]).stdout
    assert "idle (kept: min_nodes)" in listed and "train" in listed
    assert len(fleet_machines("train")) == 1  # min_nodes, not max_nodes
    assert job_processes(root, *hosts)  # its worker runs, waiting for a job

    job_id, job_log, _ = run_job("on the fleet")
    assert "no launch and no bootstrap" in job_log
    assert "bootstrapping the worker" not in job_log
    (taken,) = status(job_id)["instances"]
    assert taken["request_id"] == kept["request_id"] and taken["fleet"] == "train"
    # Its job ended: the machine is the fleet's again, kept (the only one, within min_nodes).
    again = wait_until(lambda: kept_idle("train"), what="the machine to be the fleet's again")
    assert again["request_id"] == kept["request_id"] and again["job_id"] == job_id
    assert len(fleet_machines("train")) == 1
    # The time no job took it is the fleet's on the ledger.
    ledger = json.loads(run_cli(["cost", "--json"]).stdout)
    assert ledger["per_fleet"]["train"]["USD"] > 0
    (share,) = [i for i in ledger["instances"] if i["state"] == "handed_over"]
    assert share["job_id"] is None and share["fleet"] == "train"

    # Its machine is ended (a reap ends idle machines at once): the fleet tops back up.
    reaped = run_cli(["reap"], timeout=120)
    assert reaped.returncode == 0, reaped.stderr
    fresh = wait_until(
        lambda: kept_idle("train", not_=kept["request_id"]), timeout=240, what="the top-up"
    )
    assert fresh["job_id"] is None

    # Taken out of providers.yaml: the fleet's machine ends, and none is launched again.
    set_fleets(cloud_home, [])
    nothing_left(cloud_home, root, sshd_lab, *hosts)
    assert not fleet_machines("train")


def test_a_fleet_never_holds_more_than_max_nodes_however_many_jobs_fit_it(
    ssh_hosts: Any, sshd_lab: SshdLab, cloud_home: Path, tmp_path: Path
) -> None:
    hosts = ssh_hosts(3)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(h, f"m{i}", 0.5, root) for i, h in enumerate(hosts)])
    set_fleets(
        cloud_home,
        # Machines above min_nodes stay idle a while: the third job takes one the others free.
        [
            {
                "name": "pool",
                "providers": ["ssh"],
                "min_nodes": 1,
                "max_nodes": 2,
                "idle_seconds": 120,
            }
        ],
    )
    wait_until(lambda: kept_idle("pool"), timeout=240, what="the fleet's machine")

    most: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            live = [i for i in instances() if i["state"] not in ENDED]
            most.append(len(live))
            done.wait(0.5)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        gate = tmp_path / "gate"
        jobs = [submit_gated(gate, f"job {n}") for n in range(3)]
        wait_until(
            lambda: sum(status(j)["state"] == "running" for j in jobs) == 2,
            timeout=240,
            what="two jobs to run on the fleet's two machines",
        )
        (waiting,) = [j for j in jobs if status(j)["state"] != "running"]
        wait_until(
            lambda: "max_nodes" in (status(waiting).get("message") or ""),
            what="the third job to say it waits for the fleet",
        )
        assert len(fleet_machines("pool")) == 2
        assert all(i.get("fleet") == "pool" for i in instances())  # no machine outside it
        open_gate(gate, *hosts)
        for job_id in jobs:
            wait_until(lambda j=job_id: status(j)["state"] == "succeeded", timeout=240, what=job_id)
    finally:
        done.set()
        watcher.join()
    assert max(most) <= 2, most
    assert "no launch and no bootstrap" in logs(waiting)  # it took a machine the fleet freed
    set_fleets(cloud_home, [])
    nothing_left(cloud_home, root, sshd_lab, *hosts)

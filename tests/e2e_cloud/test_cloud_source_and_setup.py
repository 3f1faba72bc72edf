"""A job on a rented machine that shares nothing with this one: `submit --target cloud --
python train.py` from a project folder, its packages from `setup`, on hosts with their own root
filesystem (no path of ours, no gpulayer, their own python3)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_cloud.journey import last_job, ledger, wait_until
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.support.cli import run_cli
from tests.support.package_index import PackageIndex, make_wheel
from tests.support.sshd_hosts import SshdLab

pytestmark = pytest.mark.slow


@pytest.fixture
def index(sshd_lab: SshdLab, tmp_path: Path) -> Iterator[PackageIndex]:
    """A package index where the hosts reach it: on the lab's bridge (loopback otherwise)."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "gltest-greeting", "1.0", {"gltest_greeting.py": "WORDS = 'hello 1.0'\n"})
    with PackageIndex(wheels, address=sshd_lab.gateway) as served:
        yield served


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(
        textwrap.dedent(
            """
            import os, socket, time
            from helpers import steps
            print("train on", socket.gethostname(), "steps", steps(), flush=True)
            # Training takes a while: longer than the control plane keeps the worker's idle
            # connection open (5 s), so the outputs go up after the server closed it.
            time.sleep(7)
            print("data", open("data/config.txt").read().strip(), flush=True)
            print("ignored shipped:", os.path.exists("big.bin"), flush=True)
            out = os.environ["GPULAYER_OUTPUT_DIR"]
            open(os.path.join(out, "model.txt"), "w").write("weights")
            """
        )
    )
    (folder / "helpers.py").write_text("def steps():\n    return 3\n")
    (folder / "data").mkdir()
    (folder / "data" / "config.txt").write_text("lr=0.1\n")
    (folder / ".gitignore").write_text("big.bin\n")
    (folder / "big.bin").write_bytes(b"\0" * 4096)
    return folder


def _torn_down(job_id: str) -> None:
    wait_until(
        lambda: all(i["state"] == "terminated" for i in ledger(job_id)["instances"]),
        what="teardown",
    )


def test_submit_folder_travels_to_a_host_that_shares_nothing(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    project = _project(tmp_path / "project")
    assert not host.exists(project)  # an honest host: our submit folder is not there
    installs = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, installs)])

    # The worker's log lives in the job's install dir, which teardown removes: keep it.
    kept_log = installs / "kept-worker.log"
    with host.keeping(f"{installs}/*/worker.log", kept_log):
        result = run_cli(
            ["submit", "--target", "cloud", "--", "python", "train.py"], cwd=project, timeout=300
        )
        _torn_down(last_job()["id"])
    assert result.returncode == 0, result.stderr
    assert f"train on {host.name} steps 3" in result.stdout
    assert "data lr=0.1" in result.stdout
    assert "ignored shipped: False" in result.stdout  # .gitignore holds for the bundle
    job = last_job()
    assert job["state"] == "succeeded"
    out = tmp_path / "out"
    assert run_cli(["artifacts", job["id"], "--download", str(out)]).returncode == 0
    assert (out / "model.txt").read_text() == "weights"  # outputs come back
    # ... on the first try: the upload through the tunnel did not break and retry.
    worker_log = host.read_text(kept_log)
    assert " joined " in worker_log, worker_log[-2000:]
    assert "retrying" not in worker_log, worker_log[-3000:]
    assert "Broken pipe" not in worker_log, worker_log[-3000:]


def test_local_inputs_travel_too_from_outside_the_folder_and_ignored_ones(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    project = tmp_path / "project"
    project.mkdir()
    (project / ".gitignore").write_text("*.csv\n")
    (project / "train.csv").write_text("x,y\n1,2\n")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "doc.txt").write_text("far away")
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    script = (
        "import os; d = os.environ['GPULAYER_INPUT_DIR']; "
        "print(open(d + '/data/train.csv').read().split()[1], open(d + '/corpus/doc.txt').read())"
    )
    result = run_cli(
        [
            "submit", "--target", "cloud",
            "--input", "train.csv:data/train.csv", "--input", f"{corpus}:corpus",
            "--", "python", "-c", script,
        ],
        cwd=project,
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1,2 far away" in result.stdout
    _torn_down(last_job()["id"])


def test_the_folder_is_taken_at_submit_so_later_edits_do_not_leak(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    (host,) = ssh_hosts(1)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('version', 1)\n")
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    submitted = run_cli(
        ["submit", "-d", "--target", "cloud", "--", "python", "train.py"], cwd=project
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split()[-1]
    (project / "train.py").write_text("print('version', 2)\n")  # while the job is queued
    wait_until(
        lambda: (
            json.loads(run_cli(["status", job_id, "--json"]).stdout)["state"]
            in ("succeeded", "failed")
        ),
        timeout=300,
        what="the job to end",
    )
    logs = run_cli(["logs", job_id]).stdout
    assert "version 1" in logs and "version 2" not in logs
    _torn_down(job_id)


def _job_file(folder: Path, index: PackageIndex) -> Path:
    spec = {
        "name": "with-setup",
        "workload": {
            "kind": "command",
            "command": [
                "python",
                "-c",
                "import gltest_greeting, sys; print(gltest_greeting.WORDS, 'in', sys.prefix)",
            ],
        },
        "placement": {"target": "cloud"},
        "setup": {
            "commands": [["sh", "-c", "echo preparing $(hostname)"]],
            "pip": ["gltest-greeting==1.0"],
            "index_url": index.url,
        },
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_setup_installs_the_jobs_packages_on_the_host_and_a_later_job_reuses_them(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, index: PackageIndex
) -> None:
    (host,) = ssh_hosts(1)
    assert host.run(["python3", "-c", "import gltest_greeting"]).returncode != 0
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    folder = tmp_path / "project"
    folder.mkdir()
    job_file = _job_file(folder, index)

    cold = run_cli(["submit", "-f", str(job_file)], cwd=folder, timeout=300)
    assert cold.returncode == 0, cold.stderr
    assert "hello 1.0 in" in cold.stdout
    assert f"preparing {host.name}" in cold.stdout + cold.stderr  # setup's phase is in the log
    first = last_job()
    assert first["attempts"][0]["setup_seconds"] > 0  # status shows setup as its own phase
    shown = run_cli(["logs", first["id"]])
    logs = (shown.stdout + shown.stderr).splitlines()
    setup_lines = [line for line in logs if "[setup]" in line]
    assert any("installing gltest-greeting==1.0" in line for line in setup_lines), setup_lines
    fetched = list(index.downloads)
    assert fetched
    _torn_down(first["id"])

    warm = run_cli(["submit", "-f", str(job_file)], cwd=folder, timeout=300)
    assert warm.returncode == 0, warm.stderr
    second = last_job()
    assert second["id"] != first["id"]
    warm_shown = run_cli(["logs", second["id"]])
    warm_logs = warm_shown.stdout + warm_shown.stderr
    assert "reusing environment" in warm_logs
    assert index.downloads == fetched  # nothing fetched for the second job
    _torn_down(second["id"])


def test_a_package_the_index_lacks_fails_setup_naming_it(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, index: PackageIndex
) -> None:
    (host,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    spec = {
        "workload": {"kind": "command", "command": ["python", "-c", "print('never')"]},
        "placement": {"target": "cloud"},
        "setup": {"pip": ["gltest-absent-package"], "index_url": index.url},
    }
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps(spec))
    result = run_cli(["submit", "-f", str(job_file)], cwd=tmp_path, timeout=300)
    assert result.returncode != 0
    job = last_job()
    assert (job["state"], job["reason"]) == ("failed", "setup_failed")
    assert "gltest-absent-package" in (job.get("message") or "")
    _torn_down(job["id"])


def test_wheels_shipped_in_the_source_install_on_a_host_that_reaches_no_index(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    """No package index on the hosts' network: the wheels the submitting machine has travel in
    the job's folder and setup installs from them alone."""
    (host,) = ssh_hosts(1)
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    folder = tmp_path / "offline-project"
    make_wheel(
        folder / "wheels", "gltest-offline", "2.0", {"gltest_offline.py": "WORDS = 'shipped 2.0'\n"}
    )
    (folder / "train.py").write_text(
        "import gltest_offline\nprint(gltest_offline.WORDS, flush=True)\n"
    )
    spec = {
        "workload": {"kind": "command", "command": ["python", "train.py"]},
        "placement": {"target": "cloud"},
        "setup": {"pip": ["gltest-offline==2.0"], "find_links": ["wheels"]},
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(spec))
    assert not host.exists(folder)
    result = run_cli(["submit", "-f", "job.yaml"], cwd=folder, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "shipped 2.0" in result.stdout
    _torn_down(last_job()["id"])


def test_a_scheduled_run_on_a_rented_host_runs_in_the_folder_taken_when_it_was_applied(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path
) -> None:
    """A schedule's runs may go to machines that share nothing: its folder travels with each."""
    (host,) = ssh_hosts(1)
    project = _project(tmp_path / "project")
    write_providers(cloud_home, [host_entry(host, "box1", 0.5, tmp_path / "installs")])
    created = run_cli(
        [
            "schedule",
            "create",
            "nightly",
            "--cron",
            "0 3 * * *",
            "--target",
            "cloud",
            "--",
            "python",
            "train.py",
        ],
        cwd=project,
    )
    assert created.returncode == 0, created.stderr
    (project / "helpers.py").write_text("def steps():\n    return 99\n")  # after apply: not sent
    triggered = run_cli(["schedule", "trigger", "nightly", "--json"])
    assert triggered.returncode == 0, triggered.stderr
    job_id = json.loads(triggered.stdout)["job_id"]
    wait_until(
        lambda: (
            json.loads(run_cli(["status", job_id, "--json"]).stdout)["state"]
            in ("succeeded", "failed")
        ),
        timeout=240,
        what="the scheduled run",
    )
    job = json.loads(run_cli(["status", job_id, "--json"]).stdout)
    shown = run_cli(["logs", job_id])
    assert job["state"] == "succeeded", shown.stdout + shown.stderr
    assert f"train on {host.name} steps 3" in shown.stdout
    assert run_cli(["schedule", "delete", "nightly"]).returncode == 0
    _torn_down(job_id)

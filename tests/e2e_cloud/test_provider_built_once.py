"""A control plane builds each provider once per settings change, not once per step.

The ssh provider is installed a second time, as a distribution of this test's own found through
the real `gpulayer.providers` entry-point group ahead of the installed one (PYTHONPATH comes
first on sys.path, and the first distribution to claim a name wins). Its subclass writes a line
each time it is constructed and each time it is asked to describe an instance, so the test can
count, in the control plane's own process, how many providers a launch, the checks of a running
instance, its drain and its terminate built.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.e2e_cloud.journey import ledger, wait_until, why_it_failed
from tests.e2e_cloud.test_cloud_ssh_journey import host_entry, write_providers
from tests.e2e_cloud.test_cloud_ssh_lifecycle import open_gate, status, submit_gated
from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

_PLUGIN = """
import os

from gpulayer_ssh import SshHostsProvider


def _mark(what):
    with open(os.environ["GPULAYER_TEST_PROVIDER_MARKS"], "a") as out:
        out.write(f"{what} {os.getpid()}\\n")


class CountedSsh(SshHostsProvider):
    def __init__(self, settings=None):
        super().__init__(settings)
        _mark("built")

    def describe(self, ids):
        _mark("describe")
        return super().describe(ids)
"""


def install_counting_plugin(where: Path) -> None:
    """A distribution on ``where`` whose entry point ``ssh`` is the counting subclass."""
    where.mkdir(parents=True)
    (where / "gpulayer_counted_ssh.py").write_text(_PLUGIN)
    info = where / "gpulayer_counted_ssh-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gpulayer-counted-ssh\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text(
        "[gpulayer.providers]\nssh = gpulayer_counted_ssh:CountedSsh\n"
    )


def marks(path: Path, what: str) -> Counter[int]:
    """How many times each process wrote ``what``."""
    found: Counter[int] = Counter()
    for line in path.read_text().splitlines() if path.exists() else ():
        kind, pid = line.split()
        if kind == what:
            found[int(pid)] += 1
    return found


def server_pid(home: Path) -> int:
    return int(json.loads((home / "server.json").read_text())["pid"])


def torn_down(job_id: str) -> bool:
    found = ledger(job_id)["instances"]
    return bool(found) and all(i["state"] == "terminated" for i in found)


def test_a_provider_is_built_once_per_settings_change(
    ssh_hosts: Any, cloud_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = tmp_path / "plugins"
    install_counting_plugin(plugins)
    counted = tmp_path / "marks.txt"
    paths = [str(plugins), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    monkeypatch.setenv("GPULAYER_TEST_PROVIDER_MARKS", str(counted))
    (host,) = ssh_hosts(1)
    root = tmp_path / "installs"
    write_providers(cloud_home, [host_entry(host, "box", 0.5, root)])

    gate = tmp_path / "gate"
    job_id = submit_gated(gate, "counted")
    try:
        wait_until(lambda: status(job_id)["state"] == "running", timeout=180, what="the job")
    except AssertionError:
        logs = run_cli(["logs", job_id])
        raise AssertionError(why_it_failed(logs.stdout + logs.stderr)) from None
    # A running instance is checked every few seconds: let it be checked twice.
    wait_until(lambda: sum(marks(counted, "describe").values()) >= 2, what="two checks")
    open_gate(gate, host)
    wait_until(lambda: status(job_id)["state"] == "succeeded", timeout=120, what="the job")
    wait_until(lambda: torn_down(job_id), what="teardown")
    # Planning, the launch, every check, the drain and the terminate shared one provider in
    # each control plane process (a CLI started with changed code starts a new one).
    first = marks(counted, "built")
    assert first and set(first.values()) == {1}, first

    # New content in providers.yaml is a new provider; the same content is not.
    write_providers(cloud_home, [host_entry(host, "box", 0.75, root)])
    second = run_cli(["submit", "--target", "cloud", "--", "true"], timeout=300)
    assert second.returncode == 0, second.stderr
    wait_until(lambda: torn_down(last_id()), what="the second teardown")
    pid = server_pid(cloud_home)
    assert marks(counted, "built")[pid] == first[pid] + 1


def last_id() -> str:
    jobs = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)
    return str(jobs[0]["id"])

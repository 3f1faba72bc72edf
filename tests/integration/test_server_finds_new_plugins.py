"""A team server finds a provider plugin installed after it started: `offers` lists the new
provider's offers and `plan` plans with it, without a restart.

Real processes: a team server whose sys.path holds an (empty) site folder, the CLI. The plugin
is installed into that folder while the server runs, as pip leaves one: its module, then its
dist-info with a `gpulayer.providers` entry point, moved into place."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, ServerProcess

_PLUGIN = textwrap.dedent(
    '''
    """A cloud of one machine type, priced in its own code."""

    from gpulayer.cloud import Offer, ProviderError


    class LabCloud:
        name = "labcloud"

        def __init__(self, settings=None):
            self.settings = dict(settings or {})

        def offers(self, query):
            return [
                Offer(
                    provider="labcloud",
                    instance_type="lab.gpu1",
                    region="lab-1",
                    accelerator="cuda",
                    gpu_name="L4",
                    gpu_count=1,
                    gpu_memory_gb=24,
                    cpu_cores=4,
                    memory_gb=16,
                    hourly_price=0.25,
                )
            ]

        def launch(self, offer, request):
            raise ProviderError("the lab launches nothing", provider="labcloud")

        def describe(self, ids):
            return []

        def terminate(self, ids):
            return None

        def list_owned(self, tags):
            return []
    '''
)


def install_plugin(site: Path, staging: Path) -> None:
    """Install the labcloud distribution into ``site`` as pip does: files written aside, then
    moved in (the module first, its metadata last)."""
    staging.mkdir()
    (staging / "gpulayer_labcloud.py").write_text(_PLUGIN)
    info = staging / "gpulayer_labcloud-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-labcloud\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpulayer.providers]\nlabcloud = gpulayer_labcloud:LabCloud\n"
    )
    (staging / "gpulayer_labcloud.py").rename(site / "gpulayer_labcloud.py")
    info.rename(site / info.name)


PLAN = ["plan", "--target", "cloud", "--gpus", "1", "--accelerator", "cuda", "--json", "--", "true"]


def _cli(args: list[str], server: ServerProcess) -> Any:
    return run_cli(args, env={"GPULAYER_SERVER": server.url, "GPULAYER_TOKEN": ADMIN_TOKEN})


@pytest.mark.slow
def test_a_plugin_installed_after_the_server_started_is_offered_and_planned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    current = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{current}" if current else str(site))
    server = ServerProcess(tmp_path / "server")
    server.home.mkdir(parents=True)
    # The settings name the plugin before it is installed, as a team's admin would prepare them.
    (server.home / "providers.yaml").write_text(yaml.safe_dump({"labcloud": {}}))
    server.start()
    try:
        before = _cli(["offers", "--provider", "labcloud", "--json"], server)
        install_plugin(site, tmp_path / "staging")
        offers = _cli(["offers", "--provider", "labcloud", "--json"], server)
        planned = _cli(PLAN, server)
    finally:
        server.stop()

    assert before.returncode == 2 and "labcloud" in before.stderr, before
    assert offers.returncode == 0, (offers.stdout, offers.stderr)
    listed = json.loads(offers.stdout)
    assert [(o["instance_type"], o["enabled"], o["source"]) for o in listed] == [
        ("lab.gpu1", True, "live")
    ], listed
    assert planned.returncode == 0, (planned.stdout, planned.stderr)
    plan = json.loads(planned.stdout)
    assert plan["target"] == "cloud", plan
    assert "labcloud/lab-1/lab.gpu1" in json.dumps(plan), plan


def install_editable(site: Path, source: Path) -> None:
    """Install the labcloud distribution as an editable install does: its metadata in
    ``site``, its module left in ``source``, a folder that only an interpreter starting now
    puts on sys.path (pip writes a .pth file for that, which only a starting one reads)."""
    source.mkdir()
    (source / "gpulayer_labcloud.py").write_text(_PLUGIN)
    info = site / "gpulayer_labcloud-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-labcloud\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpulayer.providers]\nlabcloud = gpulayer_labcloud:LabCloud\n"
    )


@pytest.mark.slow
def test_a_plugin_that_needs_a_restart_is_named_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site, source = tmp_path / "site-packages", tmp_path / "src"
    site.mkdir()
    current = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), current) if p))
    server = ServerProcess(tmp_path / "server")
    server.home.mkdir(parents=True)
    (server.home / "providers.yaml").write_text(yaml.safe_dump({"labcloud": {}}))
    server.start()
    try:
        install_editable(site, source)
        offers = _cli(["offers", "--provider", "labcloud", "--json"], server)
        planned = _cli(PLAN, server)
        server.stop()
        # Started again, the interpreter finds the module (as it would read the .pth file).
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), str(source)) if p))
        server.start()
        after = _cli(["offers", "--provider", "labcloud", "--json"], server)
    finally:
        server.stop()

    for result in (offers, planned):
        assert result.returncode == 2, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "'labcloud'" in lines[0] and "installed after the control plane started" in lines[0]
        assert "restart" in lines[0] and "Traceback" not in result.stderr
    assert after.returncode == 0, after.stderr
    assert [o["instance_type"] for o in json.loads(after.stdout)] == ["lab.gpu1"]

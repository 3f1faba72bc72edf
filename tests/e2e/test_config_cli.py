"""`gpulayer config` and a bad providers.yaml at submit, through the real command line."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.cli import run_cli


def _jobs() -> list[str]:
    listed = run_cli(["ls", "--json"])
    assert listed.returncode == 0, listed.stderr
    return [job["id"] for job in json.loads(listed.stdout)]


def test_config_check_and_show(shared_home: Path) -> None:
    path = shared_home / "providers.yaml"
    path.unlink(missing_ok=True)
    missing = run_cli(["config", "check"])
    assert missing.returncode == 0 and "no provider is enabled" in missing.stdout
    path.write_text("aws:\n  regions: [eu-west-1]\ngpulayer:\n  deadman_seconds: 90\n")
    try:
        checked = run_cli(["config", "check", "--json"])
        assert checked.returncode == 0, checked.stderr
        assert json.loads(checked.stdout)["enabled"] == ["aws"]
        shown = json.loads(run_cli(["config", "show", "--json"]).stdout)
        assert shown["aws"]["regions"] == ["eu-west-1"] and shown["aws"]["ssh_user"] == "ubuntu"
        assert shown["gpulayer"]["deadman_seconds"] == 90
        text = run_cli(["config", "show"]).stdout
        assert "price_source: api" in text and str(path) in text

        path.write_text("aws:\n  regions: [eu-west-1]\ngpulayer:\n  ssh_cidr: notacidr\n")
        bad = run_cli(["config", "check"])
        assert bad.returncode == 2
        assert bad.stderr.strip() == (
            f"error: {path}: gpulayer.ssh_cidr: 'notacidr' is not a CIDR such as 203.0.113.7/32"
        )
    finally:
        path.unlink(missing_ok=True)


def test_bad_providers_yaml_refuses_a_cloud_job_before_it_exists(
    shared_home: Path, tmp_path: Path
) -> None:
    path = shared_home / "providers.yaml"
    path.write_text("aws:\n  regions: [us-east-1]\ngpulayer:\n  deadman_seconds: soon\n")
    try:
        before = _jobs()
        refused = run_cli(["submit", "--target", "cloud", "--", "true"], cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "gpulayer.deadman_seconds: 'soon' (a string) is not a number" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert _jobs() == before
        # A job that never goes to a cloud does not read the file.
        local = run_cli(["submit", "--", "python", "-c", "print('ran')"], cwd=tmp_path)
        assert local.returncode == 0 and "ran" in local.stdout
    finally:
        path.unlink(missing_ok=True)


FLAKY_PLUGIN = """
from gpulayer.cloud import Offer, ProviderSettingsError


class Provider:
    name = "flaky"

    def __init__(self, settings):
        self.record = settings["record"]

    def offers(self, query):
        return [
            Offer(provider="flaky", instance_type="box", region="r1", zone=f"r1{z}",
                  cpu_cores=4, memory_gb=16, hourly_price=0.1 * (i + 1))
            for i, z in enumerate("abcde")
        ]

    def launch(self, offer, request):
        with open(self.record, "a") as out:
            out.write(offer.zone + "\\n")
        raise ProviderSettingsError("image: no such image here", provider="flaky")

    def describe(self, ids):
        return []

    def terminate(self, ids):
        pass

    def list_owned(self, tags):
        return []
"""


def test_a_config_error_is_retried_once_not_per_offer(shared_home: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    info = plugin / "gpulayer_flaky-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpulayer-flaky\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[gpulayer.providers]\nflaky = gpulayer_flaky:Provider\n"
    )
    (plugin / "gpulayer_flaky.py").write_text(FLAKY_PLUGIN)
    record = tmp_path / "launches"
    path = shared_home / "providers.yaml"
    path.write_text(f"flaky:\n  record: {record}\n")
    env = {"PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    submit = ["submit", "--target", "cloud", "--provider", "flaky", "--", "true"]
    # A cloud job takes its submit folder along: one of its own, apart from the test's files.
    project = tmp_path / "project"
    project.mkdir()
    try:
        # No image release covers this provider: the same error for each of five offers.
        no_release = run_cli(submit, env=env, cwd=project)
        launched_without_release = record.exists()
        images = _images_with_flaky(tmp_path / "images")
        ran = run_cli(submit, env={**env, "GPULAYER_IMAGES_DIR": str(images)}, cwd=project)
    finally:
        path.unlink(missing_ok=True)
    assert no_release.returncode == 1, no_release.stderr
    notes = [
        line
        for line in no_release.stderr.splitlines()
        if "flaky/r1" in line and "launching" not in line and "every offer failed" not in line
    ]
    assert len(notes) == 2 and "not trying flaky again" in notes[1], no_release.stderr
    assert not launched_without_release

    assert ran.returncode == 1, ran.stderr
    assert record.exists(), ran.stderr
    assert record.read_text().split() == ["r1a", "r1b"]  # of five offers, two tries
    assert "no such image here; not trying flaky again" in ran.stderr
    assert "every offer failed" in ran.stderr


def _images_with_flaky(folder: Path) -> Path:
    from gpulayer.cloud.images import find_images_dir

    source = find_images_dir()
    folder.mkdir(parents=True)
    release = {"date": "2030-01-01", "notes": "test", "providers": {"flaky": {}}}
    catalog = {"schema": 1, "description": "test", "releases": {"t1": release}}
    (folder / "releases.json").write_text(json.dumps(catalog))
    for name in ("bootstrap.sh", "cloud-init.yaml"):
        if (source / name).exists():
            (folder / name).symlink_to(source / name)
    return folder

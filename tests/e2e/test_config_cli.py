"""`gpulayer config` and a bad providers.yaml at submit, through the real command line."""

from __future__ import annotations

import json
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

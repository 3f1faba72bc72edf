"""`setup` for a job on this machine, through the CLI: the same environments as elsewhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpulayer.worker.setup_env import uv_binary
from tests.support.cli import run_cli
from tests.support.package_index import make_wheel

pytestmark = pytest.mark.skipif(uv_binary() is None, reason="uv is not installed")


def test_a_local_job_installs_wheels_shipped_in_its_source_without_any_index(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    make_wheel(project / "wheels", "gltest-offline", "0.3", {"gltest_offline.py": "N = 3\n"})
    (project / "main.py").write_text("import gltest_offline\nprint('offline', gltest_offline.N)\n")
    spec = {
        "workload": {"kind": "command", "command": ["python", "main.py"]},
        "setup": {"pip": ["gltest-offline"], "find_links": ["wheels"]},
    }
    (project / "job.json").write_text(json.dumps(spec))
    result = run_cli(["submit", "-f", "job.json"], cwd=project, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "offline 3" in result.stdout
    job = json.loads(run_cli(["ls", "--json", "-n", "1"]).stdout)[0]
    status = json.loads(run_cli(["status", job["id"], "--json"]).stdout)
    assert status["attempts"][0]["setup_seconds"] >= 0

    # The same request reuses the environment; other wheels in the folder are another request.
    same = run_cli(["submit", "-f", "job.json"], cwd=project, timeout=180)
    assert same.returncode == 0 and "offline 3" in same.stdout
    assert "reusing environment" in same.stdout + same.stderr
    shutil.rmtree(project / "wheels")
    (project / "wheels").mkdir()
    emptied = run_cli(["submit", "-f", "job.json"], cwd=project, timeout=180)
    assert emptied.returncode == 1
    assert "setup_failed" in emptied.stderr and "gltest-offline" in emptied.stderr


def test_a_bad_setup_is_refused_at_submit_naming_the_field(tmp_path: Path) -> None:
    spec = {
        "workload": {"kind": "command", "command": ["true"]},
        "setup": {"pip": ["not a requirement!"]},
    }
    (tmp_path / "job.json").write_text(json.dumps(spec))
    result = run_cli(["submit", "-f", "job.json"], cwd=tmp_path)
    assert result.returncode == 2
    assert "setup.pip" in result.stderr
    assert "Traceback" not in result.stderr

"""The on-demand local control plane starts with a scrubbed environment; each local job gets the
environment of the `submit` that sent it, in memory only, and no other submitter's."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from gpulayer.control.local_daemon import daemon_environment
from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane

ALPHA = "alpha-secret-value-7f3a"
BETA = "beta-secret-value-91c2"


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


# The job compares digests: the values themselves must not be in its command line (the store).
PROBE = (
    "import os, json, hashlib; d = lambda k: hashlib.sha256(os.environ.get(k, '').encode())"
    ".hexdigest(); print(json.dumps({k: d(k) == v for k, v in "
    f"[('ALPHA_API_KEY', {digest(ALPHA)!r}), ('BETA_API_KEY', {digest(BETA)!r}), "
    f"('UNRELATED_A', {digest('a')!r})]}}))"
)


def submitter_env(**extra: str) -> dict[str, str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ALPHA_API_KEY", "BETA_API_KEY", "UNRELATED_A")
    }
    return {**clean, **extra}


def run_probe(tmp_path: Path, env: dict[str, str]) -> dict[str, bool]:
    result = run_cli(["submit", "--", "python", "-c", PROBE], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    seen: dict[str, bool] = json.loads(result.stdout.strip().splitlines()[-1])
    return seen


def daemon_environ(home: Path) -> bytes:
    pid = int(json.loads((home / "server.json").read_text())["pid"])
    return Path(f"/proc/{pid}/environ").read_bytes()


def test_each_job_gets_its_own_submitters_environment_and_the_daemon_none(
    tmp_path: Path, shared_home: Path
) -> None:
    stop_local_control_plane(shared_home)  # the first submit below starts it
    env_a = submitter_env(ALPHA_API_KEY=ALPHA, UNRELATED_A="a")
    env_b = submitter_env(BETA_API_KEY=BETA)

    seen_a = run_probe(tmp_path, env_a)
    assert seen_a == {"ALPHA_API_KEY": True, "BETA_API_KEY": False, "UNRELATED_A": True}
    environ = daemon_environ(shared_home)
    for leaked in (b"ALPHA_API_KEY", ALPHA.encode(), b"UNRELATED_A"):
        assert leaked not in environ
    assert b"GPULAYER_HOME=" in environ and b"PATH=" in environ

    seen_b = run_probe(tmp_path, env_b)
    assert seen_b == {"ALPHA_API_KEY": False, "BETA_API_KEY": True, "UNRELATED_A": False}
    environ = daemon_environ(shared_home)
    assert ALPHA.encode() not in environ and BETA.encode() not in environ

    # Memory only: neither value was written anywhere under the gpulayer home.
    for path in shared_home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert ALPHA.encode() not in data, path
            assert BETA.encode() not in data, path


def test_scrubbed_environment_keeps_what_the_control_plane_needs() -> None:
    given = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "GPULAYER_IDLE_SECONDS": "5",
        "GPULAYER_TOKEN": "client-side-token",
        "GPULAYER_SERVER": "http://elsewhere",
        "AWS_PROFILE": "lab",
        "OPENAI_API_KEY": "sk-nope",
        "SOME_UNRELATED": "x",
    }
    kept = daemon_environment(given, "/home/g")
    assert kept == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "GPULAYER_IDLE_SECONDS": "5",
        "AWS_PROFILE": "lab",
        "GPULAYER_HOME": "/home/g",
    }


def test_a_bad_log_cap_setting_is_refused_before_the_daemon_starts(
    tmp_path: Path, shared_home: Path
) -> None:
    from tests.support.daemon import stop_local_control_plane as stop

    stop(shared_home)
    (shared_home / "server.json").unlink(missing_ok=True)  # left by a daemon killed in the stop
    result = run_cli(["ls"], env={"GPULAYER_MAX_LOG_BYTES": "huge"}, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: GPULAYER_MAX_LOG_BYTES: 'huge' is not a size such as 1GiB, 500MB or 1048576"
    )
    assert not (shared_home / "server.json").exists()

"""The worker's wheelhouse is built once per gpulayer version and platform in the user cache,
shared by every GPULAYER_HOME: two control-plane processes of two homes that need it at once
build it once between them, and the build says what it builds at least every 5 s. Real
processes, real files."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BUILD = """
import json, os, pathlib, sys, time
from gpulayer.cloud.wheelhouse import build_wheelhouse
lines = []
begun = time.monotonic()
# As the cloud lifecycle calls it (naming its home's cache), or with no dir at all.
where = pathlib.Path(os.environ["GPULAYER_HOME"]) / "cache" / "wheelhouse"
house = build_wheelhouse(
    where if sys.argv[1] == "home" else None,
    on_progress=lambda line: lines.append([time.monotonic(), line]),
)
ended = time.monotonic()
print(json.dumps({"path": str(house.path), "lines": lines, "begun": begun, "ended": ended}))
"""


def _environment(tmp_path: Path, home: str, setting: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAYER_")}
    env["GPULAYER_HOME"] = str(tmp_path / home)
    # The user cache dir (platformdirs reads XDG_CACHE_HOME): one user, two homes.
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")
    if setting:
        env["GPULAYER_WHEELHOUSE_DIR"] = str(tmp_path / "user-cache" / "gpulayer" / "wheelhouse")
    return env


@pytest.mark.parametrize(
    "call", ["default", "home"], ids=["no-dir-given", "home-dir-given-with-the-setting"]
)
def test_two_homes_build_one_wheelhouse_in_the_user_cache(tmp_path: Path, call: str) -> None:
    builds = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, call],
            env=_environment(tmp_path, home, setting=call == "home"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for home in ("home-a", "home-b")
    ]
    results = []
    for process in builds:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    cache = tmp_path / "user-cache" / "gpulayer" / "wheelhouse"
    [built] = [p for p in cache.iterdir() if p.is_dir()]
    assert {r["path"] for r in results} == {str(built)}
    # One of the two built it; the other waited for it (or found it done).
    builders = [r for r in results if any(line.startswith("building") for _, line in r["lines"])]
    assert len(builders) == 1, results
    [waiter] = [r for r in results if r is not builders[0]]
    assert not [line for _, line in waiter["lines"] if line.startswith("building")]
    assert not [
        p.name for p in cache.iterdir() if p.name.startswith(f".{built.name}.") and p.is_dir()
    ]
    for home in ("home-a", "home-b"):
        assert not list((tmp_path / home).rglob("*.whl"))

    # Never silent for more than 5 s, and each line says what it builds.
    builder = builders[0]
    stamps = [builder["begun"], *(at for at, _ in builder["lines"]), builder["ended"]]
    assert max(b - a for a, b in itertools.pairwise(stamps)) <= 5.0, builder["lines"]
    assert all(built.name in line for _, line in builder["lines"]), builder["lines"]


def test_the_wheelhouse_dir_setting_moves_the_shared_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer.cloud.wheelhouse import default_cache_dir

    monkeypatch.setenv("GPULAYER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    monkeypatch.delenv("GPULAYER_WHEELHOUSE_DIR", raising=False)
    assert default_cache_dir() == tmp_path / "user-cache" / "gpulayer" / "wheelhouse"
    monkeypatch.setenv("GPULAYER_WHEELHOUSE_DIR", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"

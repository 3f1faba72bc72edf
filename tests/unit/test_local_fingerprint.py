"""What tells a command that the local control plane runs other code or environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpulayer.control import fingerprint
from gpulayer.control.environment import compare, daemon_environment
from gpulayer.control.fingerprint import code_fingerprint, what_changed


def test_the_same_code_is_current() -> None:
    assert what_changed(code_fingerprint()) == []


def test_a_version_plugin_or_source_change_is_named() -> None:
    now = code_fingerprint()
    assert what_changed({**now, "version": "0.0.1"}) == [f"gpulayer 0.0.1 is now {now['version']}"]
    fewer = {**now, "plugins": [p for p in now["plugins"] if not p.startswith("aws=")]}
    assert what_changed({**fewer, "paths": "other"}) == ["the installed plugins changed (+aws)"]
    bumped = [p.replace("@", "@9") if p.startswith("ssh=") else p for p in now["plugins"]]
    assert what_changed({**now, "plugins": bumped, "paths": "x"}) == [
        "the installed plugins changed (~ssh)"
    ]
    assert what_changed({**now, "source": "0" * 16}) == ["gpulayer's source changed"]
    assert what_changed(None) and what_changed({"version": now["version"]})


def test_editing_a_plugins_source_is_seen(tmp_path: Path) -> None:
    plugin = tmp_path / "plug"
    plugin.mkdir()
    module = plugin / "mod.py"
    module.write_text("x = 1\n")
    now = code_fingerprint()
    started = {**now, "plugin_dirs": [str(plugin)]}
    started["source"] = fingerprint._source(started["plugin_dirs"])
    assert what_changed(started) == []
    module.write_text("x = 22\n")
    stamp = os.stat(module).st_mtime_ns
    os.utime(module, ns=(stamp + 10**9, stamp + 10**9))
    assert what_changed(started) == ["gpulayer's source changed"]


def test_environment_changes_split_by_when_they_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GPULAYER_PROVIDERS_FILE", "GPULAYER_IDLE_SECONDS", "GPULAYER_IMAGES_DIR"):
        monkeypatch.delenv(name, raising=False)
    started = daemon_environment()
    assert "GPULAYER_TOKEN" not in started and "GPULAYER_HOME" not in started
    monkeypatch.setenv("GPULAYER_PROVIDERS_FILE", "/etc/p.yaml")
    monkeypatch.setenv("GPULAYER_IDLE_SECONDS", "30")
    diff = compare(started, daemon_environment())
    assert diff.next_job == {"GPULAYER_PROVIDERS_FILE": "/etc/p.yaml"}
    assert diff.restart == {"GPULAYER_IDLE_SECONDS": "30"}
    back = compare(daemon_environment(), started)
    assert back.next_job == {"GPULAYER_PROVIDERS_FILE": None}
    assert compare(started, started).next_job == {} == compare(started, started).restart

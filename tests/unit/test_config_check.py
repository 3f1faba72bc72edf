"""providers.yaml is validated whole: every section, the gpulayer: one included."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulayer.cloud.config import ConfigError, check_config, orchestrator_settings
from gpulayer.cloud.install_hint import not_installed_line


def _write(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("GPULAYER_PROVIDERS_FILE", raising=False)
    (tmp_path / "providers.yaml").write_text(text)
    return tmp_path


BAD = """
aws:
  region: [us-east-1]
  allow_spot: yes please
shh:
  hosts: []
gpulayr: {}
gpulayer:
  ssh_cidr: notacidr
  deadman_seconds: soon
  deadman_secs: 3
"""


def test_every_problem_is_reported_at_once_with_the_closest_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _write(tmp_path, BAD, monkeypatch)
    with pytest.raises(ConfigError) as caught:
        check_config(root)
    lines = caught.value.lines
    assert caught.value.exit_code == 2
    assert all(line.startswith(f"{root / 'providers.yaml'}: ") for line in lines)
    text = "\n".join(lines)
    assert "aws.region: unknown setting; did you mean 'regions'?" in text
    assert "aws.allow_spot:" in text
    assert "shh: no provider is called 'shh'" in text and "did you mean 'ssh'?" in text
    assert "gpulayer-shh" not in text
    assert "gpulayr: no provider is called 'gpulayr'" in text
    assert "did you mean 'gpulayer'?" in text
    assert "gpulayer.ssh_cidr: 'notacidr' is not a CIDR" in text
    assert "gpulayer.deadman_seconds: 'soon' (a string) is not a number" in text
    assert "gpulayer.deadman_secs: unknown setting; did you mean 'deadman_seconds'?" in text
    assert len(lines) == 7, lines
    assert all("\n" not in line for line in lines)


def test_nested_unknown_keys_get_the_closest_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _write(
        tmp_path,
        "ssh:\n  hosts:\n    - {name: a, adress: 10.0.0.5, key_path: /k,"
        " hardware: {cpu_core: 4}}\n",
        monkeypatch,
    )
    with pytest.raises(ConfigError) as caught:
        check_config(root)
    text = "\n".join(caught.value.lines)
    assert "ssh.hosts.0.adress: unknown setting; did you mean 'address'?" in text
    assert "ssh.hosts.0.hardware.cpu_core: unknown setting; did you mean 'cpu_cores'?" in text


def test_a_valid_file_shows_every_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _write(
        tmp_path,
        "aws:\n  regions: [us-west-2]\n  image: {ami_id: ami-0123}\n"
        "gpulayer:\n  ssh_cidr: 203.0.113.7\n  deadman_seconds: 120\n",
        monkeypatch,
    )
    checked = check_config(root)
    assert sorted(checked.providers) == ["aws"]
    shown = checked.shown()
    assert shown["aws"]["regions"] == ["us-west-2"]
    assert shown["aws"]["image"] == {"ami_id": "ami-0123"}
    assert shown["aws"]["allow_spot"] is False and shown["aws"]["price_source"] == "api"
    assert shown["gpulayer"] == {
        "ssh_cidr": "203.0.113.7/32",
        "deadman_seconds": 120.0,
        "deadman_action": None,
        "system_site_packages": False,
        "hold_reclaimed_seconds": 600.0,
        "cloud_wait_seconds": 30.0,
        "parallel_launches": 8,
        "state_timeouts": {},
        "idle_seconds": 0.0,
    }
    assert orchestrator_settings(root)["deadman_seconds"] == 120.0


def test_a_provider_section_takes_idle_seconds_over_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """idle_seconds in a provider's section is the orchestrator's to read (the plugin never
    sees it) and overrides the ``gpulayer:`` section's; a bad one names its key."""
    root = _write(
        tmp_path,
        "aws:\n  regions: [us-west-2]\n  idle_seconds: 45\ngcp: {}\n"
        "gpulayer:\n  idle_seconds: 20\n",
        monkeypatch,
    )
    checked = check_config(root)
    assert checked.idle_seconds_of("aws") == 45.0
    assert checked.idle_seconds_of("gcp") == 20.0
    assert checked.shown()["aws"]["idle_seconds"] == 45.0
    bad = _write(tmp_path, "aws:\n  idle_seconds: -1\n", monkeypatch)
    with pytest.raises(ConfigError) as raised:
        check_config(bad)
    assert "aws.idle_seconds: Input should be greater than or equal to 0" in str(raised.value)


def test_no_file_means_defaults_and_nothing_enabled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPULAYER_PROVIDERS_FILE", raising=False)
    checked = check_config(tmp_path)
    assert checked.exists is False and checked.providers == {}
    assert checked.shown()["gpulayer"]["deadman_seconds"] == 600


def test_a_section_that_is_not_a_mapping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _write(tmp_path, "aws: [us-east-1]\ngpulayer: 5\n", monkeypatch)
    with pytest.raises(ConfigError) as caught:
        check_config(root)
    assert [line.split(": ", 1)[1] for line in caught.value.lines] == [
        "aws: must be a mapping of settings, not ['us-east-1']",
        "gpulayer: must be a mapping of settings, not 5",
    ]


def test_install_hints_name_a_command_that_works() -> None:
    line = not_installed_line("ssh", ["aws"])
    directory = Path(__file__).resolve().parents[2] / "providers" / "ssh"
    assert line.endswith(f"pip install -e {directory}")
    assert (directory / "pyproject.toml").is_file()
    typo = not_installed_line("shh", ["aws", "ssh"])
    assert "did you mean 'ssh'?" in typo and "pip install" not in typo


def test_the_cloud_wait_is_bounded_and_read_past_other_sections_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpulayer.cloud.config import orchestrator_section

    root = _write(tmp_path, "azur: {}\ngpulayer: {cloud_wait_seconds: 7}\n", monkeypatch)
    assert orchestrator_section(root)["cloud_wait_seconds"] == 7
    assert orchestrator_section(_write(tmp_path, "aws: {}\n", monkeypatch))[
        "cloud_wait_seconds"
    ] == pytest.approx(30)
    for bad in ("0", "241"):
        root = _write(tmp_path, f"gpulayer: {{cloud_wait_seconds: {bad}}}\n", monkeypatch)
        with pytest.raises(ConfigError) as caught:
            orchestrator_section(root)
        assert len(caught.value.lines) == 1
        assert "gpulayer.cloud_wait_seconds" in caught.value.lines[0]
    assert (
        orchestrator_section(_write(tmp_path, "gpulayer: {parallel_launches: 2}\n", monkeypatch))[
            "parallel_launches"
        ]
        == 2
    )
    for bad in ("0", "65", "2.5", '"2"'):
        root = _write(tmp_path, f"gpulayer: {{parallel_launches: {bad}}}\n", monkeypatch)
        with pytest.raises(ConfigError) as caught:
            orchestrator_section(root)
        assert "gpulayer.parallel_launches" in caught.value.lines[0]


SSH_HOST = "ssh:\n  hosts:\n    - {name: h0, address: 127.0.0.1, key_path: /nonexistent/key}\n"


def test_fleets_are_checked_with_the_file_and_each_problem_names_its_fleet_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.cli import run_cli

    root = _write(
        tmp_path,
        SSH_HOST + "fleets:\n"
        "  - {name: train, providers: [ssh], min_nodes: 3, max_nodes: 2}\n"
        "  - {name: infer, providers: [aws], idle_secs: 5}\n",
        monkeypatch,
    )
    with pytest.raises(ConfigError) as caught:
        check_config(root)
    where = f"{root / 'providers.yaml'}: "
    assert caught.value.lines == [
        where + "fleets[train].min_nodes: must be <= max_nodes (2)",
        where + "fleets[infer].idle_secs: unknown setting; did you mean 'idle_seconds'?",
    ]
    monkeypatch.setenv("GPULAYER_HOME", str(root))
    checked = run_cli(["config", "check", "--no-login"])
    assert checked.returncode == 2
    assert "fleets[train].min_nodes: must be <= max_nodes (2)" in checked.stderr
    (root / "providers.yaml").write_text(
        SSH_HOST + "fleets:\n  - {name: train, providers: [ssh], min_nodes: 1}\n"
    )
    valid = run_cli(["config", "check", "--no-login"])
    assert valid.returncode == 0 and "; fleet train: 1..1 machines" in valid.stdout
    fleet = check_config(root).fleet_rules()
    assert [(f.name, f.min_nodes, f.max_nodes, f.idle_seconds) for f in fleet] == [
        ("train", 1, 1, 0.0)
    ]

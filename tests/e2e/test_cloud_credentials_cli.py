"""`offers` and `plan` read cloud credentials as `submit` does: AWS keys exported in the shell
after the local control plane started are used by all three, held in memory only.

Real parts: the CLI in subprocesses, the local control plane it starts on demand (started by
a shell without AWS credentials), moto's EC2 server as the cloud. An offer listed from the API
is marked `live`; one listed from the shipped catalog because no credentials were found,
`catalog`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cli import run_cli
from tests.support.daemon import stop_local_control_plane
from tests.support.moto_lab import moto_server

# Values no test or log elsewhere holds: found anywhere on disk, a key was written down.
KEY_ID = "AKIAGPULAYERTESTKEY39"
SECRET = "gpulayer-test-secret-39-never-stored"


@pytest.fixture
def keyless_home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A gpulayer home whose providers.yaml enables aws at moto, and an environment without
    AWS credentials (no keys, no credential files)."""
    home = tmp_path / "home"
    home.mkdir()
    with moto_server() as moto:
        aws = {"regions": ["us-east-1"], "endpoint_url": moto.url, "cache_dir": str(tmp_path / "c")}
        (home / "providers.yaml").write_text(yaml.safe_dump({"aws": aws}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            GPULAYER_HOME=str(home),
            AWS_EC2_METADATA_DISABLED="true",
            AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
            AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        )
        try:
            yield home, env
        finally:
            stop_local_control_plane(home)


def _gpulayer(args: list[str], env: dict[str, str]) -> Any:
    result = run_cli(args, env=env, timeout=180)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout), result.stderr


OFFERS = ["offers", "--provider", "aws", "--gpu", "A10G", "-n", "3", "--json"]
PLAN = [
    *("plan", "--target", "cloud", "--provider", "aws"),
    *("--accelerator", "cuda", "--gpus", "1", "--json", "--", "true"),
]


def _control_plane_pid(home: Path) -> int:
    return int(json.loads((home / "server.json").read_text())["pid"])


@pytest.mark.slow
def test_offers_and_plan_use_keys_exported_after_the_control_plane_started(
    keyless_home: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, keyless = keyless_home
    # The control plane starts from a shell without credentials: the catalog is all it has.
    offers, said = _gpulayer(OFFERS, keyless)
    assert offers and {o["source"] for o in offers} == {"catalog"}, said
    assert "no AWS credentials found" in said
    started = _control_plane_pid(home)

    keyed = {**keyless, "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET}
    offers, said = _gpulayer(OFFERS, keyed)
    assert offers and {o["source"] for o in offers} == {"live"}, said
    assert "no AWS credentials found" not in said
    planned, said = _gpulayer(PLAN, keyed)
    text = json.dumps(planned)
    assert '"sources": {"aws": "live"}' in text, (text[:3000], said)
    assert "no AWS credentials found" not in text
    # The same control plane as before: not one started again from the shell with the keys.
    assert _control_plane_pid(home) == started, said
    # A shell without keys again: what the keys fetched is not shown to it as live.
    offers, said = _gpulayer(OFFERS, keyless)
    assert offers and {o["source"] for o in offers} == {"catalog"}, said

    # A client_env of the wrong shape is one line naming it (400), for offers and plan alike.
    monkeypatch.setenv("GPULAYER_HOME", str(home))
    from gpulayer.errors import UsageError
    from gpulayer.sdk.connection import connect

    client = connect().client
    spec = {"workload": {"kind": "command", "command": ["true"]}}
    for route in ("/v1/offers", "/v1/plan"):
        with pytest.raises(UsageError, match=r"^client_env: "):
            client.request("POST", route, {"spec": spec, "client_env": {"AWS_X": 1}})

    # Never written down: not in the control plane's files (its log, its database).
    for path in home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data, path
            assert KEY_ID.encode() not in data, path

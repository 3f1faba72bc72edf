"""The team server's secret store, with a real server and a remote worker process whose own
environment lacks the secret: kept from stdin, listed by name only, encrypted at rest under a
key file only the server's user reads, handed to the attempt that names it, never returned."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from gpulayer.errors import NotFoundError, UsageError
from tests.integration.test_gangs import all_lines
from tests.support.cli import run_cli
from tests.support.servers import ADMIN_TOKEN, wait_for_job

pytestmark = pytest.mark.slow

VALUE = "hf_store_secret_41_never_written_plain"
READS = (
    "import hashlib, os; v = os.environ.get('HF_TOKEN', 'unset'); "
    "print('digest', hashlib.sha256(v.encode()).hexdigest())"
)


def test_a_stored_secret_reaches_the_job_that_names_it_and_nothing_else(
    cluster_factory: Any, tmp_path: Path
) -> None:
    import hashlib

    cluster = cluster_factory(1)
    client = cluster.client
    env = {"GPULAYER_SERVER": cluster.server.url, "GPULAYER_TOKEN": ADMIN_TOKEN}
    kept = run_cli(["secret", "set", "HF_TOKEN"], env=env, input=VALUE + "\n")
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == "kept secret HF_TOKEN"
    assert VALUE not in kept.stdout + kept.stderr
    listed = run_cli(["secret", "ls", "--json"], env=env)
    assert [s["name"] for s in __import__("json").loads(listed.stdout)] == ["HF_TOKEN"]
    assert VALUE not in listed.stdout

    def run(spec_secrets: list[dict[str, str]]) -> str:
        spec = {
            "workload": {"kind": "command", "command": ["python", "-c", READS]},
            "secrets": spec_secrets,
            "placement": {"target": "remote"},
        }
        job_id = str(client.submit(spec)["id"])
        job = wait_for_job(client, job_id, {"succeeded", "failed"}, timeout=120)
        assert job["state"] == "succeeded", all_lines(client, job_id)
        return " ".join(line["text"] for line in all_lines(client, job_id))

    digest = hashlib.sha256(VALUE.encode()).hexdigest()
    assert f"digest {digest}" in run([{"name": "HF_TOKEN"}])
    # A job that names no secret gets none of the store's.
    unset = hashlib.sha256(b"unset").hexdigest()
    assert f"digest {unset}" in run([])

    # Encrypted at rest, under a key only the server's user may read, kept out of the database.
    key = cluster.server.home / "secrets.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    for path in cluster.server.home.rglob("*"):
        if path.is_file():
            assert VALUE.encode() not in path.read_bytes(), path

    # Replaced, then removed; bad names and empty values are one line naming the field.
    replaced = run_cli(["secret", "set", "HF_TOKEN"], env=env, input="other\n")
    assert replaced.stdout.strip() == "replaced secret HF_TOKEN"
    with pytest.raises(UsageError, match=r"^name: '1BAD' is not a secret name"):
        client.request("PUT", "/v1/secrets/1BAD", {"value": "x"})
    with pytest.raises(UsageError, match=r"value"):
        client.request("PUT", "/v1/secrets/OK", {"value": ""})
    empty = run_cli(["secret", "set", "OK"], env=env, input="")
    assert empty.returncode == 2 and empty.stderr.startswith("error: stdin: empty")
    assert run_cli(["secret", "rm", "HF_TOKEN"], env=env).returncode == 0
    with pytest.raises(NotFoundError, match="no secret named 'HF_TOKEN'"):
        client.request("DELETE", "/v1/secrets/HF_TOKEN")
    assert client.request("GET", "/v1/secrets") == []


def test_a_key_file_others_may_read_stops_the_server(cluster_factory: Any) -> None:
    cluster = cluster_factory(0)
    cluster.client.request("PUT", "/v1/secrets/A", {"value": "v"})
    cluster.server.stop()
    key = cluster.server.home / "secrets.key"
    key.chmod(0o644)
    started = run_cli(
        ["server", "--host", "127.0.0.1", "--port", str(cluster.server.port)],
        env={"GPULAYER_HOME": str(cluster.server.home), "GPULAYER_TOKEN": ADMIN_TOKEN},
        timeout=60,
    )
    assert started.returncode != 0
    said = started.stderr.strip().splitlines()
    assert said == [
        f"error: secrets key file {key} is open to others (mode 644); run chmod 600 {key}"
    ]

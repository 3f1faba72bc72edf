"""A worker never opens a path of its own machine for a job, and no credential of the worker's
reaches a job's log: real server and worker processes, real root-only files."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpulayer.protocol.bundle import create_bundle
from tests.support.cluster import command_job, submit
from tests.support.procs import wait_until
from tests.support.servers import ADMIN_TOKEN, wait_for_job, wait_for_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="root-only files and --run-as need root"),
]


@pytest.fixture
def open_work_dir() -> Iterator[Path]:
    """A work dir the jobs' users can reach (pytest's own tree is closed to others)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-paths-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def root_only(tmp_path: Path) -> Path:
    """A 0700 folder of root's with a key in it: what /root/.ssh is on a worker machine."""
    folder = tmp_path / "dot-ssh"
    folder.mkdir(mode=0o700)
    key = folder / "id_ed25519"
    key.write_text(f"PRIVATE-{secrets.token_hex(8)}\n")
    key.chmod(0o600)
    return folder


def _post_job(server_url: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.post(f"{server_url}/v1/jobs", json=body, headers=headers, timeout=30)


def _into(lines: list[str]) -> Callable[[str, str], None]:
    return lambda stream, text: lines.append(text)


def _lister(python: str) -> list[str]:
    """A job that prints every staged input's bytes."""
    code = (
        "import os\n"
        "for root, _, files in os.walk(os.environ['GPULAYER_INPUT_DIR']):\n"
        "    for name in files:\n"
        "        print('STAGED', name, open(os.path.join(root, name), 'rb').read()[:200])\n"
    )
    return [python, "-c", code]


@pytest.mark.parametrize("isolation", ["--run-as-range", "--run-as"])
def test_a_remote_job_naming_worker_paths_is_refused_at_submit_and_reads_nothing(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path, root_only: Path, isolation: str
) -> None:
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python
    cluster = cluster_factory(0)
    client = cluster.client
    flag = (
        ("--run-as-range", "61200-61209")
        if isolation == "--run-as-range"
        else ("--run-as", "nobody")
    )
    worker = cluster.add_worker("rooted", None, *flag, "--work-dir", str(open_work_dir))
    wait_for_workers(client, 1)
    identity = worker.home / "worker-identity.json"
    # Written just after the server lists the worker: waited for, as the other test here does.
    wait_until(identity.is_file, 30, "the worker's identity file")
    credential = json.loads(identity.read_text())["token"]
    shadow = Path("/etc/shadow").read_bytes()[:40]
    named = [
        "/etc/shadow",
        f"file://{identity}",
        str(root_only),
    ]
    for index, artifact in enumerate(named):
        spec = command_job(_lister(python))
        spec["inputs"] = [{"artifact": artifact, "path": f"in{index}"}]
        reply = _post_job(cluster.server.url, {"spec": spec})
        _refused(client, reply, artifact)
        error = reply.text
        assert "inputs[0].artifact" in error and "bundle" in error, error
        assert credential not in reply.text
    assert client.jobs(limit=50) == []
    # Beside a bundle that does not carry it: a relative path climbing out of the source.
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('hi')\n")
    bundle = tmp_path / "src.tar.gz"
    create_bundle(source, bundle)
    bundle_id = client.upload_bundle(bundle)
    spec = command_job(_lister(python))
    spec["inputs"] = [{"artifact": "../../etc/shadow", "path": "shadow"}]
    reply = _post_job(cluster.server.url, {"spec": spec, "bundle_id": bundle_id})
    _refused(client, reply, "../../etc/shadow")
    assert "inputs[0].artifact" in reply.text, reply.text
    assert client.jobs(limit=50) == []  # nothing half-created
    # A list of jobs in one request: the one that names a path is named, none is kept.
    fine = command_job(["true"])
    reply = httpx.post(
        f"{cluster.server.url}/v1/jobs",
        json=[{"spec": fine}, {"spec": spec}],
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert reply.status_code in (400, 422), reply.text  # a spec error, as for any list item
    assert "jobs[1].inputs[0].artifact" in reply.text, reply.text
    assert client.jobs(limit=50) == []
    # A schedule's runs likewise: refused when it is made, not when a run reaches a worker.
    job = command_job(_lister(python))
    job["inputs"] = [{"artifact": "/etc/shadow", "path": "shadow"}]
    schedule = {"name": "reads-shadow", "cron": "0 * * * *", "job": job}
    reply = httpx.post(
        f"{cluster.server.url}/v1/schedules",
        json={"schedule": schedule},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=30,
    )
    assert reply.status_code == 400 and "job.inputs[0].artifact" in reply.text, reply.text
    assert client.request("GET", "/v1/schedules") == []
    assert shadow  # the file the jobs named is there to be read


def _refused(client: Any, reply: httpx.Response, artifact: str) -> None:
    if reply.status_code != 400:
        # Accepted: show what the worker staged for it.
        job = reply.json()["id"]
        done = wait_for_job(client, job, {"succeeded", "failed"})
        text = "".join(x["text"] for x in client.logs(job)["lines"])
        pytest.fail(f"{artifact} accepted ({reply.status_code}), job {done['state']}: {text[:400]}")


def test_a_job_that_reads_the_workers_credential_itself_sees_it_masked_in_its_log(
    cluster_factory: Any,
) -> None:
    # Without --run-as the job runs as the worker's user and can open its identity file: the
    # file is its to read, but the value never reaches the job's log.
    cluster = cluster_factory(1)
    client = cluster.client
    (worker,) = cluster.workers
    identity = worker.home / "worker-identity.json"
    # The server lists a worker once it registered; the worker writes its file just after.
    wait_until(identity.exists, 30, "the worker's identity file")
    credential = json.loads(identity.read_text())["token"]
    job = submit(client, command_job(["cat", str(identity), str(worker.home / "join.token")]))
    done = wait_for_job(client, job, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    text = "".join(x["text"] for x in client.logs(job)["lines"])
    assert "worker_id" in text  # the file was read and printed
    assert credential not in text and cluster.worker_token not in text
    assert "***" in text


def test_a_worker_refuses_local_paths_its_bundle_does_not_carry(
    tmp_path: Path, root_only: Path
) -> None:
    # What a server that let them through (an older one, a row written by hand) would hand a
    # worker: the worker itself opens none of them, as root or not.
    from gpulayer.spec import JobSpec
    from gpulayer.worker.runner import JobRun, RunContext

    source = tmp_path / "src"
    source.mkdir()
    carried = tmp_path / "carried.csv"
    carried.write_text("rows\n")
    bundle, carrying = tmp_path / "src.tar.gz", tmp_path / "carrying.tar.gz"
    create_bundle(source, bundle)
    create_bundle(source, carrying, inputs={0: carried})
    for artifact in ("/etc/shadow", "../../etc/shadow", f"file://{root_only}", str(root_only)):
        lines: list[str] = []
        spec = JobSpec.model_validate(
            {
                "workload": {"kind": "command", "command": _lister(shutil.which("python3") or "")},
                "inputs": [{"artifact": artifact, "path": "x"}],
            }
        )
        job_dir = tmp_path / secrets.token_hex(4)
        outcome = JobRun(RunContext("job-1", 1, spec, job_dir, bundle=bundle), _into(lines)).run()
        assert outcome.state == "failed" and outcome.reason == "setup_failed", outcome
        assert outcome.message is not None and outcome.message.startswith("inputs[0].artifact")
        assert "never opens its own machine's files" in outcome.message
        assert not (job_dir / "input" / "x").exists()
        assert "STAGED" not in "".join(lines)
    # What the bundle carried is staged, under the input's index.
    spec = JobSpec.model_validate(
        {
            "workload": {"kind": "command", "command": _lister(shutil.which("python3") or "")},
            "inputs": [{"artifact": "/data/carried.csv", "path": "c"}],
        }
    )
    lines = []
    outcome = JobRun(
        RunContext("job-1", 1, spec, tmp_path / "carried", bundle=carrying), _into(lines)
    ).run()
    assert outcome.state == "succeeded", lines
    assert "STAGED c b'rows\\n'" in "".join(lines)


def test_a_file_in_a_jobs_outputs_that_is_not_the_jobs_own_is_not_uploaded(
    cluster_factory: Any, tmp_path: Path, open_work_dir: Path
) -> None:
    # Where hard links to others' files are allowed (fs.protected_hardlinks=0), a job can put
    # a root-only file into its outputs by name; the test makes that link itself, as root.
    python = shutil.which("python3", path="/usr/bin:/bin")
    assert python
    cluster = cluster_factory(0)
    client = cluster.client
    cluster.add_worker(
        "ranged", None, "--run-as-range", "61220-61229", "--work-dir", str(open_work_dir)
    )
    wait_for_workers(client, 1)
    private = open_work_dir / "root-only"
    private.mkdir(mode=0o700)
    secret = private / "key"
    secret.write_text(f"ROOT-ONLY-{secrets.token_hex(6)}\n")
    secret.chmod(0o600)
    gate = open_work_dir / "gate"
    code = (
        "import os, time\n"
        "out = os.environ['GPULAYER_OUTPUT_DIR']\n"
        "open(os.path.join(out, 'mine.txt'), 'w').write('mine')\n"
        "print('OUT', out, flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
    )
    job = submit(client, command_job([python, "-c", code]))
    wait_for_job(client, job, {"running"})
    out: list[str] = []

    def printed() -> bool:
        lines = [x["text"] for x in client.logs(job)["lines"] if x["text"].startswith("OUT ")]
        out[:] = [lines[0].split(" ", 1)[1].strip()] if lines else []
        return bool(lines)

    from tests.support.procs import wait_until

    wait_until(printed, 30, "the job printed its output folder")
    os.link(secret, Path(out[0]) / "key")
    gate.touch()
    done = wait_for_job(client, job, {"succeeded", "failed"})
    assert done["state"] == "succeeded", done
    assert [a["path"] for a in client.artifacts(job)] == ["mine.txt"]
    text = "".join(x["text"] for x in client.logs(job)["lines"])
    assert "outputs: skipped key: not the job's own file" in text, text

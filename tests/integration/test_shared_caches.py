"""What one job leaves in a worker's shared caches (setup environments, source bundles) never
runs in another job, and a root helper acting for a job reads only what that job may read:
real runners, real uv, real server and worker processes."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from gpulayer.worker.process import RunAs
from gpulayer.worker.runner import JobRun, RunContext, RunOutcome
from gpulayer.worker.setup_env import uv_binary
from tests.integration.test_runner import Logs, command_spec, py
from tests.support.cluster import command_job
from tests.support.package_index import PackageIndex, make_wheel
from tests.support.servers import wait_for_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(uv_binary() is None, reason="uv is not installed"),
]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageIndex]:
    wheels = tmp_path_factory.mktemp("wheels")
    make_wheel(wheels, "gltest-greeting", "1.0", {"gltest_greeting.py": "WORDS = 'hello 1.0'\n"})
    with PackageIndex(wheels) as served:
        yield served


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder other uids can reach (pytest's own tree is closed to them)."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-caches-"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _run(spec: Any, job_dir: Path, cache: Path, logs: Logs, **ctx: Any) -> RunOutcome:
    context = RunContext("job-1", 1, spec, job_dir, setup_cache=cache, **ctx)
    return JobRun(context, logs).run()


def _wheel_source(base: Path, who: str) -> Path:
    """A source whose wheels/ folder holds gltest-same 1.0, whose module says ``who``."""
    source = base / f"src-{who}"
    make_wheel(source / "wheels", "gltest-same", "1.0", {"gltest_same.py": f"WHO = {who!r}\n"})
    return source


def _wheel_size(source: Path) -> int:
    (wheel,) = (source / "wheels").iterdir()
    return wheel.stat().st_size


def test_a_wheel_with_another_jobs_name_and_size_gets_an_environment_of_its_own(
    tmp_path: Path,
) -> None:
    mallory = _wheel_source(tmp_path, f"mallory-{secrets.token_hex(8)}")
    for _ in range(500):  # another module whose wheel has the very same name and size
        bob = _wheel_source(tmp_path, f"bobbyby-{secrets.token_hex(8)}")
        if _wheel_size(bob) == _wheel_size(mallory):
            break
        shutil.rmtree(bob)
    assert _wheel_size(bob) == _wheel_size(mallory), "no look-alike wheel found"
    cache = tmp_path / "envs"
    setup = {"pip": ["gltest-same"], "find_links": ["wheels"]}
    code = "import gltest_same; print(gltest_same.WHO)"
    for source in (mallory, bob):
        bundle = tmp_path / f"{source.name}.tar.gz"
        create_bundle(source, bundle)
        logs = Logs()
        outcome = _run(py(code, setup=setup), tmp_path / source.name, cache, logs, bundle=bundle)
        assert outcome.state == "succeeded", logs.all_text()
        assert logs.text("stdout") == source.name.removeprefix("src-") + "\n", logs.all_text()


_PLANTS = {
    # A new file: a .pth runs at every start of the interpreter.
    "a .pth": "open(os.path.join(site, 'zz_planted.pth'), 'w')"
    ".write(\"import sys; print('PLANTED')\\n\")\n",
    # An installed module rewritten in place (made writable first, as its owner may).
    "an edited module": "path = os.path.join(site, 'gltest_greeting.py')\n"
    "os.chmod(path, 0o644); os.chmod(site, 0o755)\n"
    "open(path, 'a').write(\"print('PLANTED')\\n\")\n",
}


@pytest.mark.parametrize("plant", sorted(_PLANTS))
def test_what_a_job_plants_in_a_cached_environment_never_runs_in_a_later_job(
    index: PackageIndex, tmp_path: Path, plant: str
) -> None:
    # No --run-as: the job runs as the worker's user and can write the environment it ran in.
    cache = tmp_path / "envs"
    setup = {"pip": ["gltest-greeting==1.0"], "index_url": index.url}
    code = (
        "import glob, sys, os\n"
        "site = glob.glob(os.path.join(sys.prefix, 'lib', 'python*', 'site-packages'))[0]\n"
        + _PLANTS[plant]
    )
    logs = Logs()
    first = _run(py(code, setup=setup), tmp_path / "a", cache, logs)
    assert first.state == "succeeded", logs.all_text()
    logs = Logs()
    second = _run(
        py("import gltest_greeting; print(gltest_greeting.WORDS)", setup=setup),
        tmp_path / "b",
        cache,
        logs,
    )
    assert second.state == "succeeded", logs.all_text()
    assert logs.text("stdout") == "hello 1.0\n", logs.all_text()
    assert "changed since it was built" in logs.all_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs of other uids need root")
def test_setup_reads_no_other_jobs_folder_through_a_link(tmp_path: Path, open_dir: Path) -> None:
    # The victim: another attempt's 0700 folder, with a private wheel in it.
    victim_uid, attacker_uid = 61301, 61300
    secret = f"VICTIM-{secrets.token_hex(6)}"
    victim = open_dir / "victim"
    make_wheel(
        victim / "wheels", "gltest-private", "1.0", {"gltest_private.py": f"S = {secret!r}\n"}
    )
    for path in [victim, *victim.rglob("*")]:
        os.chown(path, victim_uid, victim_uid)
    victim.chmod(0o700)
    # The attacker ships a wheels folder, then relinks it in its setup commands.
    source = tmp_path / "src"
    make_wheel(source / "wheels", "gltest-decoy", "1.0", {"gltest_decoy.py": "X = 1\n"})
    bundle = tmp_path / "attacker.tar.gz"
    create_bundle(source, bundle)
    spec = command_spec(
        "sh", "-c", 'cat "$VIRTUAL_ENV"/lib/python*/site-packages/gltest_private.py',
        setup={
            "commands": [["sh", "-c", f"rm -rf wheels && ln -s {victim / 'wheels'} wheels"]],
            "pip": ["gltest-private"],
            "find_links": ["wheels"],
        },
    )  # fmt: skip
    logs = Logs()
    run_as = RunAs(f"gpulayer-{attacker_uid}", attacker_uid, attacker_uid, str(open_dir / "a"))
    outcome = _run(spec, open_dir / "a", open_dir / "envs", logs, bundle=bundle, run_as=run_as)
    assert secret not in logs.all_text(), logs.all_text()
    installed = list((open_dir / "envs").glob("*/lib/python*/site-packages/gltest_private.py"))
    assert installed == [], installed
    assert (outcome.state, outcome.reason) == ("failed", "setup_failed"), logs.all_text()
    assert outcome.message is not None and "setup.find_links: 'wheels'" in outcome.message
    # What the environments' folder holds is not the jobs' to list.
    assert (open_dir / "envs").stat().st_mode & 0o777 == 0o711
    assert (open_dir / "envs" / "uv-cache").stat().st_mode & 0o777 == 0o700


def test_a_cached_bundle_a_job_overwrote_is_never_run(cluster_factory: Any, tmp_path: Path) -> None:
    cluster = cluster_factory(1)  # no --run-as: its jobs can write the worker's work dir
    client = cluster.client
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print('original code')\n")
    (source / "plant.py").write_text(
        "import os, shutil, sys\n"
        "root = os.path.dirname(os.path.dirname(os.path.dirname(os.environ['GPULAYER_OUTPUT_DIR'])))\n"
        "cached = os.path.join(root, '.bundles', sys.argv[2] + '.tar.gz')\n"
        "os.chmod(cached, 0o600) if os.path.exists(cached) else None\n"
        "shutil.copyfile(sys.argv[1], cached)\n"
        "print('overwrote', cached)\n"
    )
    bundle = tmp_path / "src.tar.gz"
    info = create_bundle(source, bundle)
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "train.py").write_text("print('planted code')\n")
    planted = tmp_path / "planted.tar.gz"
    create_bundle(evil, planted)
    bundle_id = client.upload_bundle(bundle)
    first = client.submit(
        command_job(["python", "plant.py", str(planted), info.sha256]), bundle_id=bundle_id
    )["id"]
    done = wait_for_job(client, first, {"succeeded", "failed"})
    assert done["state"] == "succeeded", client.logs(first)["lines"]
    second = client.submit(command_job(["python", "train.py"]), bundle_id=bundle_id)["id"]
    done = wait_for_job(client, second, {"succeeded", "failed"})
    text = "".join(x["text"] for x in client.logs(second)["lines"])
    assert done["state"] == "succeeded", text
    assert "original code" in text and "planted code" not in text, text


def test_gpulayer_workers_says_a_job_s_writes_persist_on_a_worker_that_cannot_isolate(
    cluster_factory: Any, open_dir: Path
) -> None:
    import json

    from tests.support.cli import run_cli
    from tests.support.servers import ADMIN_TOKEN, wait_for_workers

    cluster = cluster_factory(1)  # no --run-as
    if os.geteuid() == 0:
        cluster.add_worker(
            "ranged", None, "--run-as-range", "61310-61319", "--work-dir", str(open_dir)
        )
    wait_for_workers(cluster.client, len(cluster.workers))
    env = {"GPULAYER_SERVER": cluster.server.url, "GPULAYER_TOKEN": ADMIN_TOKEN}
    listed = run_cli(["workers", "--json"], env=env)
    assert listed.returncode == 0, listed.stderr
    persist = {w["name"]: w["job_writes_persist"] for w in json.loads(listed.stdout)}
    expected = {"w0": True, **({"ranged": False} if os.geteuid() == 0 else {})}
    assert persist == expected
    table = run_cli(["workers"], env={**env, "COLUMNS": "250"})
    words = " ".join(table.stdout.split())
    assert "JOB WRITES" in words and "what a job writes persists into later jobs" in words, words
    if os.geteuid() == 0:
        assert "per attempt" in words


def test_a_job_that_imports_its_packages_leaves_its_environment_reusable(
    index: PackageIndex, tmp_path: Path
) -> None:
    # Python writes bytecode beside what it imports where it can (a job run as the worker's
    # user, root included): a checked environment must not count that as a change.
    cache = tmp_path / "envs"
    setup = {"pip": ["gltest-greeting==1.0"], "index_url": index.url}
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    code = "import gltest_greeting; print(gltest_greeting.WORDS)"
    for name in ("a", "b", "c"):
        logs = Logs()
        outcome = _run(py(code, setup=setup), tmp_path / name, cache, logs, worker_env=environ)
        assert outcome.state == "succeeded", logs.all_text()
        setup_lines = [t for s, t in logs.chunks if s == "system" and t.startswith("[setup]")]
        if name != "a":
            assert any("reusing environment" in t for t in setup_lines), setup_lines
        assert not any("changed since it was built" in t for t in setup_lines), setup_lines


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs of other uids need root")
def test_a_job_run_as_its_own_uid_installs_the_wheels_it_shipped(
    tmp_path: Path, open_dir: Path
) -> None:
    source = tmp_path / "src"
    make_wheel(source / "wheels", "gltest-own", "1.0", {"gltest_own.py": "MINE = 'shipped'\n"})
    (source / "requirements.txt").write_text("gltest-own==1.0\n")
    bundle = tmp_path / "own.tar.gz"
    create_bundle(source, bundle)
    spec = command_spec(
        "sh", "-c", 'cat "$VIRTUAL_ENV"/lib/python*/site-packages/gltest_own.py',
        setup={"requirements_file": "requirements.txt", "find_links": ["wheels"]},
    )  # fmt: skip
    run_as = RunAs("gpulayer-61302", 61302, 61302, str(open_dir / "a"))
    logs = Logs()
    outcome = _run(spec, open_dir / "a", open_dir / "envs", logs, bundle=bundle, run_as=run_as)
    assert outcome.state == "succeeded", logs.all_text()
    assert "MINE = 'shipped'" in logs.text("stdout")
    (home,) = [p for p in (open_dir / "envs").iterdir() if len(p.name) == 64]
    assert home.stat().st_uid == 0 and home.stat().st_mode & 0o777 == 0o555
    assert not list((open_dir / "envs" / ".incoming").iterdir())  # the private copy is gone

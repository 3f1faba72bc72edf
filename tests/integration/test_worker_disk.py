"""A worker's disk stays bounded, with real server and worker processes and a small tmpfs as
the worker's work dir: a job that fills it leaves nothing behind for later jobs, a worker that
cannot prepare a job stops claiming and says why until space returns, a gzip bomb bundle is
refused before it expands."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import secrets
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpulayer.protocol.bundle import create_bundle
from tests.support.cli import run_cli
from tests.support.cluster import command_job
from tests.support.procs import wait_until
from tests.support.servers import ADMIN_TOKEN, wait_for_job, wait_for_workers

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@contextlib.contextmanager
def small_tmpfs(size_mib: int) -> Iterator[Path]:
    """A tmpfs of its own in a test-made folder, unmounted at the end."""
    base = Path(tempfile.mkdtemp(prefix="gpulayer-disk-"))
    base.chmod(0o755)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(base)],
        check=True,
    )
    try:
        yield base
    finally:
        subprocess.run(["umount", "-l", str(base)], check=False)
        with contextlib.suppress(OSError):
            base.rmdir()


def bundled_job(client: Any, tmp: Path, argv: list[str]) -> str:
    """A job with a source bundle of its own (different bytes each time: the worker fetches
    it into the attempt's folder rather than finding it in its cache)."""
    source = tmp / f"src-{secrets.token_hex(4)}"
    source.mkdir()
    (source / "job.py").write_text(f"# {secrets.token_hex(16)}\nprint('ran')\n")
    bundle = tmp / f"{source.name}.tar.gz"
    create_bundle(source, bundle)
    return str(client.submit(command_job(argv), bundle_id=client.upload_bundle(bundle))["id"])


def attempt_folders(root: Path) -> list[Path]:
    return [a for job in root.iterdir() if not job.name.startswith(".") for a in job.iterdir()]


# Writes into its working dir (inside its attempt's folder) until the disk is full.
_FILL = "head -c 1G /dev/zero > filler; echo filled; exit 0"


def test_a_job_that_fills_the_work_dir_leaves_it_usable_for_every_later_job(
    cluster_factory: Any, tmp_path: Path
) -> None:
    with small_tmpfs(48) as work:
        cluster = cluster_factory(0)
        client = cluster.client
        cluster.add_worker("small", None, "--work-dir", str(work))
        wait_for_workers(client, 1)
        filler = client.submit(command_job(["sh", "-c", _FILL]))["id"]
        done = wait_for_job(client, filler, {"succeeded", "failed"}, timeout=60)
        assert done["state"] == "succeeded", done
        later = [bundled_job(client, tmp_path, ["python3", "job.py"]) for _ in range(5)]
        states = [wait_for_job(client, j, {"succeeded", "failed"}, 90) for j in later]
        assert [s["state"] for s in states] == ["succeeded"] * 5, [
            (s["reason"], s["message"]) for s in states
        ]
        # Every finished attempt's folder went once its outputs were stored.
        wait_until(lambda: attempt_folders(work) == [], 30, "attempt folders were kept")
        assert os.statvfs(work).f_bavail * os.statvfs(work).f_frsize > 40 * 1024 * 1024


def test_keep_attempts_keeps_finished_folders_for_the_hours_given(
    cluster_factory: Any, tmp_path: Path
) -> None:
    with small_tmpfs(16) as work:
        cluster = cluster_factory(0)
        client = cluster.client
        cluster.add_worker("keeper", None, "--work-dir", str(work), "--keep-attempts", "1")
        wait_for_workers(client, 1)
        job = client.submit(command_job(["sh", "-c", "echo kept > kept.txt"]))["id"]
        assert wait_for_job(client, job, {"succeeded", "failed"})["state"] == "succeeded"
        assert (work / job / "attempt-1" / "work" / "kept.txt").read_text() == "kept\n"
        # Kept folders give way once they fill the disk: a later job still runs.
        filler = client.submit(command_job(["sh", "-c", _FILL]))["id"]
        assert wait_for_job(client, filler, {"succeeded", "failed"})["state"] == "succeeded"
        later = bundled_job(client, tmp_path, ["python3", "job.py"])
        done = wait_for_job(client, later, {"succeeded", "failed"}, timeout=60)
        assert done["state"] == "succeeded", (done["reason"], done["message"])
        assert not (work / filler).exists()


def test_keep_attempts_is_checked_before_the_worker_starts(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    base = ["worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file)]
    for bad in ("-1", "nan", "soon"):
        result = run_cli([*base, "--keep-attempts", bad])
        assert result.returncode == 2, result.stderr
        assert "--keep-attempts" in result.stderr and "Traceback" not in result.stderr


def test_a_worker_whose_disk_is_full_stops_claiming_says_so_and_recovers(
    cluster_factory: Any, tmp_path: Path
) -> None:
    with small_tmpfs(16) as work:
        cluster = cluster_factory(0)
        client = cluster.client
        cluster.add_worker("filled", None, "--work-dir", str(work))
        wait_for_workers(client, 1)
        ballast = work / "ballast"
        with ballast.open("wb") as out, contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * (1 << 20))
        wait_until(
            lambda: [w.get("degraded") for w in client.workers()] == ["disk full"],
            30,
            "the worker never said its disk is full",
        )
        # Its claim in flight when the disk filled may still bring a job: this one comes after.
        job = bundled_job(client, tmp_path, ["python3", "job.py"])
        env = {"GPULAYER_SERVER": cluster.server.url, "GPULAYER_TOKEN": ADMIN_TOKEN}
        listed = run_cli(["workers"], env=env)
        assert "degraded: disk full" in listed.stdout, listed.stdout
        as_json = json.loads(run_cli(["workers", "--json"], env=env).stdout)
        assert [w["degraded"] for w in as_json] == ["disk full"], as_json
        # Not placed there: it waits in the queue, and says why.
        assert client.job(job)["state"] == "queued", client.job(job)
        assert client.job(job)["attempts"] == []
        why = run_cli(["status", job], env=env).stdout
        assert "degraded: disk full" in why, why
        ballast.unlink()
        done = wait_for_job(client, job, {"succeeded", "failed"}, timeout=60)
        assert done["state"] == "succeeded", (done["reason"], done["message"])
        assert [w.get("degraded") for w in client.workers()] == [None]


def gzip_bomb(path: Path, expanded: int) -> None:
    """A valid bundle of one file of zeros: a few hundred KiB that expand to ``expanded``."""
    info = tarfile.TarInfo("zeros.bin")
    info.size = expanded
    with gzip.open(path, "wb", compresslevel=9) as gz, tarfile.open(fileobj=gz, mode="w") as tar:

        class Zeros(io.RawIOBase):
            left = expanded

            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                n = min(len(buffer), self.left)
                buffer[:n] = bytes(n)
                self.left -= n
                return n

        tar.addfile(info, io.BufferedReader(Zeros()))


def test_a_gzip_bomb_bundle_is_refused_with_a_reason_and_nothing_is_kept(
    cluster_factory: Any, tmp_path: Path
) -> None:
    from gpulayer.errors import UsageError

    bomb = tmp_path / "bomb.tar.gz"
    gzip_bomb(bomb, 512 * 1024 * 1024)
    assert bomb.stat().st_size < 1024 * 1024
    with small_tmpfs(64) as work:
        cluster = cluster_factory(0)
        client = cluster.client
        cluster.add_worker("bombed", None, "--work-dir", str(work))
        wait_for_workers(client, 1)
        # The server refuses it at upload, with the limit named.
        with pytest.raises(UsageError) as refused:
            client.upload_bundle(bomb)
        assert "bundle:" in str(refused.value) and "expand" in str(refused.value)
        # A worker refuses it too, should one reach it (a bundle kept before the check).
        from gpulayer.protocol.bundle import BundleError, BundleLimits, extract_bundle

        with pytest.raises(BundleError) as unpacked:
            extract_bundle(bomb, work / "unpacked", BundleLimits())
        assert "expand" in str(unpacked.value)
        assert sum(f.stat().st_size for f in (work / "unpacked").rglob("*") if f.is_file()) == 0


def test_a_bundle_of_too_many_members_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    from gpulayer.protocol.bundle import BundleError, BundleLimits, check_archive, extract_bundle

    source = tmp_path / "many"
    source.mkdir()
    for i in range(150):
        (source / f"f{i}.txt").write_text("x")
    bundle = tmp_path / "many.tar.gz"
    create_bundle(source, bundle)
    limits = BundleLimits(max_members=100)
    for refuse in (lambda: check_archive(bundle, limits),
                   lambda: extract_bundle(bundle, tmp_path / "out", limits)):  # fmt: skip
        with pytest.raises(BundleError) as refused:
            refuse()
        assert "more than 100 members" in str(refused.value)
    assert list((tmp_path / "out").iterdir()) == []
    assert extract_bundle(bundle, tmp_path / "fine") == 150  # within the default limits


@pytest.mark.parametrize("identity", [(), ("--run-as-range", "61130-61139")], ids=str)
def test_an_attempt_disk_quota_keeps_a_filling_job_to_its_own_filesystem(
    cluster_factory: Any, tmp_path: Path, identity: tuple[str, ...]
) -> None:
    with small_tmpfs(96) as work:
        cluster = cluster_factory(0)
        client = cluster.client
        quota = ("--attempt-disk-quota", "32MiB")
        cluster.add_worker("quota", None, "--work-dir", str(work), *quota, *identity)
        wait_for_workers(client, 1)
        fill = "head -c 1G /dev/zero > filler; stat -c 'SIZE %s' filler; df -B1 --output=size ."
        filler = client.submit(command_job(["sh", "-c", fill]))["id"]
        done = wait_for_job(client, filler, {"succeeded", "failed"}, timeout=60)
        texts = [line["text"] for line in client.logs(filler)["lines"]]
        (size_line,) = [t for t in texts if t.startswith("SIZE ")]
        assert 16 << 20 < int(size_line.split()[1]) <= 32 << 20, texts
        assert any("No space left on device" in t for t in texts), texts
        assert done["state"] == "succeeded"  # the job's script ends with df's code
        # The worker's own disk kept its room: never degraded, later jobs run.
        assert [w.get("degraded") for w in client.workers()] == [None]
        later = bundled_job(client, tmp_path, ["python3", "job.py"])
        assert wait_for_job(client, later, {"succeeded", "failed"})["state"] == "succeeded"
        wait_until(lambda: list(work.glob("*/attempt-*")) == [], 30, "attempts or images left")
        mounts = Path("/proc/self/mounts").read_text()
        assert str(work) + "/" not in mounts


def test_attempt_disk_quota_is_checked_before_the_worker_starts(tmp_path: Path) -> None:
    token_file = tmp_path / "join.token"
    token_file.write_text("gl_x\n")
    base = ["worker", "start", "--server", "http://127.0.0.1:9", "--token-file", str(token_file)]
    for bad, why in (("lots", "not a size"), ("1MiB", "at least 16MiB")):
        result = run_cli([*base, "--attempt-disk-quota", bad])
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().startswith("error: --attempt-disk-quota:"), result.stderr
        assert why in result.stderr

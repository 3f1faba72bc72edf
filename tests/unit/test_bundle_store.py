"""The server's bundle store on a real filesystem: bundles held as bytes elsewhere (a schedule's
source) are kept once by digest; a kept bundle is read without being taken, and released only
when no job of an older schema still links it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpulayer.control.bundle_store import DIGEST_FILE, BundleStore
from gpulayer.errors import UsageError


def test_bytes_are_kept_once_by_digest(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    data = b"not really a tarball, but bytes all the same"
    with store.lock:
        first = store.keep_bytes(data)
        second = store.keep_bytes(data)
    assert first == second == hashlib.sha256(data).hexdigest()
    kept = store.path(first)
    assert list(kept.parent.iterdir()) == [kept] and kept.read_bytes() == data
    assert list((tmp_path / "incoming").iterdir()) == []  # no partial write left behind


def test_bytes_are_kept_again_after_they_were_released(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    digest = store.keep_bytes(b"v1")
    store.release(digest)
    assert not store.has(digest)
    assert store.keep_bytes(b"v1") == digest
    assert store.has(digest) and store.read(digest) == b"v1"


def test_a_bundle_an_older_jobs_folder_links_is_not_released(tmp_path: Path) -> None:
    # Before schema 10 a job's folder held a hard link to the kept file and its digest.
    store = BundleStore(tmp_path)
    digest = store.keep_bytes(b"linked")
    job_dir = tmp_path / "jobs" / "j-old"
    job_dir.mkdir(parents=True)
    os.link(store.path(digest), job_dir / "source.tar.gz")
    (job_dir / DIGEST_FILE).write_text(digest)
    assert store.digest_of(job_dir) == digest
    store.release(digest)
    assert store.has(digest)
    (job_dir / "source.tar.gz").unlink()
    store.release(digest)
    assert not store.has(digest)


def test_a_missing_bundle_names_the_field(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    digest = store.keep_bytes(b"kept")
    assert store.read(digest) == b"kept" and store.has(digest)
    store.require(digest)
    missing = "0" * 64
    with pytest.raises(UsageError, match=f"^bundle_id: sha256:{missing} was not uploaded$"):
        store.read(missing)
    with pytest.raises(UsageError, match=f"^bundle_id: sha256:{missing} was not uploaded$"):
        store.require(missing)


def test_a_staged_path_is_fresh_and_kept_by_its_content(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    staged = store.staging_path()
    assert staged.parent == tmp_path / "incoming" and staged != store.staging_path()
    staged.write_bytes(b"snapshot")
    digest = store.keep(staged)
    assert digest == hashlib.sha256(b"snapshot").hexdigest()
    assert not staged.exists() and store.read(digest) == b"snapshot"

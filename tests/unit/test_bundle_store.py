"""The server's bundle store on a real filesystem: bundles held as bytes elsewhere (a schedule's
source) are kept by digest and linked like uploads; a kept bundle is read without being taken."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpulayer.control.bundle_store import DIGEST_FILE, BundleStore
from gpulayer.errors import UsageError


def test_bytes_are_kept_once_by_digest_and_linked_into_each_job(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    data = b"not really a tarball, but bytes all the same"
    first = store.link_bytes_into(data, tmp_path / "jobs" / "a" / "source.tar.gz")
    second = store.link_bytes_into(data, tmp_path / "jobs" / "b" / "source.tar.gz")
    assert first == second == hashlib.sha256(data).hexdigest()
    kept = store.path(first)
    assert list(kept.parent.iterdir()) == [kept] and kept.stat().st_nlink == 3
    assert (tmp_path / "jobs" / "b" / DIGEST_FILE).read_text() == first
    assert list((tmp_path / "incoming").iterdir()) == []  # no partial write left behind


def test_bytes_are_kept_again_after_the_last_job_released_them(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    job = tmp_path / "jobs" / "a" / "source.tar.gz"
    digest = store.link_bytes_into(b"v1", job)
    job.unlink()
    store.release(digest)
    assert not store.has(digest)
    store.link_bytes_into(b"v1", tmp_path / "jobs" / "b" / "source.tar.gz")
    assert store.has(digest) and store.read(digest) == b"v1"


def test_reading_leaves_the_kept_file_and_a_missing_one_names_the_field(tmp_path: Path) -> None:
    store = BundleStore(tmp_path)
    digest = store.link_bytes_into(b"kept", tmp_path / "jobs" / "a" / "source.tar.gz")
    assert store.read(digest) == b"kept" and store.has(digest)
    missing = "0" * 64
    with pytest.raises(UsageError, match=f"^bundle_id: sha256:{missing} was not uploaded$"):
        store.read(missing)

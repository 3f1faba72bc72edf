"""Source bundles: what goes in, that the bytes are reproducible, and that unpacking refuses
members that would land outside the destination."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from gpulayer.errors import UsageError
from gpulayer.protocol.bundle import (
    BundleError,
    BundleTooLargeError,
    UnsafeBundleError,
    create_bundle,
    extract_bundle,
    is_ignored,
    parse_ignore,
)


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def names(bundle: Path) -> list[str]:
    with tarfile.open(bundle) as tar:
        return tar.getnames()


# --- ignore rules (pure) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rules", "path", "is_dir", "ignored"),
    [
        (["*.ckpt"], "model.ckpt", False, True),
        (["*.ckpt"], "runs/a/model.ckpt", False, True),
        (["*.ckpt"], "model.ckpt.txt", False, False),
        (["data/"], "data", True, True),
        (["data/"], "data", False, False),
        (["data/"], "sub/data", True, True),
        (["/data"], "sub/data", True, False),
        (["/data"], "data", True, True),
        (["runs/*.log"], "runs/a.log", False, True),
        (["runs/*.log"], "other/runs/a.log", False, False),
        (["*.log", "!keep.log"], "keep.log", False, False),
        (["*.log", "!keep.log"], "drop.log", False, True),
        (["# a comment", "", "  "], "anything", False, False),
    ],
)
def test_ignore_rules(rules: list[str], path: str, is_dir: bool, ignored: bool) -> None:
    assert is_ignored(path, is_dir, parse_ignore(rules)) is ignored


# --- creating ---------------------------------------------------------------------------------


def test_default_excludes_and_ignore_file(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {
            "train.py": "print(1)",
            "pkg/__init__.py": "",
            "pkg/__pycache__/mod.cpython-311.pyc": "x",
            "pkg/stale.pyc": "x",
            ".git/HEAD": "ref",
            ".venv/bin/python": "x",
            "venv/lib/x.py": "x",
            "node_modules/left-pad/index.js": "x",
            ".mypy_cache/a": "x",
            ".pytest_cache/b": "x",
            ".ruff_cache/c": "x",
            "checkpoints/epoch1.ckpt": "big",
            "notes.md": "keep",
            "logs/run.log": "drop",
            ".gpulayerignore": "# local junk\n*.ckpt\nlogs/\n",
        },
    )
    info = create_bundle(src, tmp_path / "out" / "b.tar.gz")
    assert names(info.path) == [
        ".gpulayerignore",
        "checkpoints",
        "notes.md",
        "pkg",
        "pkg/__init__.py",
        "train.py",
    ]
    assert info.files == 4
    assert info.bytes == sum(len(c) for c in ("# local junk\n*.ckpt\nlogs/\n", "keep", "print(1)"))


def test_same_tree_gives_the_same_bytes(tmp_path: Path) -> None:
    files = {"a.py": "a", "pkg/b.py": "b", "pkg/data/c.bin": "c" * 1000}
    first = make_tree(tmp_path / "one", files)
    second = make_tree(tmp_path / "two", dict(reversed(files.items())))
    os.utime(second / "a.py", (1_000_000, 1_000_000))
    one = create_bundle(first, tmp_path / "one.tar.gz")
    two = create_bundle(second, tmp_path / "two.tar.gz")
    assert one.sha256 == two.sha256
    assert one.path.read_bytes() == two.path.read_bytes()
    (second / "a.py").write_text("changed")
    assert create_bundle(second, tmp_path / "three.tar.gz").sha256 != one.sha256


def test_round_trip_keeps_content_modes_and_inner_links(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"run.sh": "#!/bin/sh\n", "lib/util.py": "X = 1\n"})
    (src / "run.sh").chmod(0o755)
    (src / "empty").mkdir()
    (src / "util_link.py").symlink_to("lib/util.py")
    bundle = create_bundle(src, tmp_path / "b.tar.gz").path
    dest = tmp_path / "dest"
    extract_bundle(bundle, dest)
    assert (dest / "lib" / "util.py").read_text() == "X = 1\n"
    assert os.access(dest / "run.sh", os.X_OK)
    assert not os.access(dest / "lib" / "util.py", os.X_OK)
    assert (dest / "empty").is_dir()
    assert os.readlink(dest / "util_link.py") == "lib/util.py"


def test_link_out_of_the_source_is_refused(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": ""})
    (src / "data").symlink_to(tmp_path)
    with pytest.raises(BundleError, match="link data points outside"):
        create_bundle(src, tmp_path / "b.tar.gz")


def test_too_large_names_the_size_and_biggest_entries(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {"data/a.bin": "x" * 3000, "data/b.bin": "x" * 3000, "model.pt": "x" * 2000, "t.py": "p"},
    )
    dest = tmp_path / "b.tar.gz"
    with pytest.raises(BundleTooLargeError) as caught:
        create_bundle(src, dest, max_bytes=4096)
    error = caught.value
    assert isinstance(error, UsageError)
    assert error.size == 8001
    assert error.biggest[:2] == [("data/", 6000), ("model.pt", 2000)]
    assert "7.8 KiB is more than the 4.0 KiB bundle limit" in str(error)
    assert "data/ (5.9 KiB)" in str(error)
    assert not dest.exists()


def test_a_bundle_written_into_the_source_leaves_itself_out(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "a"})
    first = create_bundle(src, src / "bundle.tar.gz")
    second = create_bundle(src, src / "bundle.tar.gz")
    assert names(second.path) == ["a.py"]
    assert second.sha256 == first.sha256


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="is not a directory"):
        create_bundle(tmp_path / "missing", tmp_path / "b.tar.gz")


# --- unpacking hostile archives ---------------------------------------------------------------


def hostile(tmp_path: Path, *members: tarfile.TarInfo) -> Path:
    path = tmp_path / "hostile.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            data = b"owned" if member.isfile() else None
            if data is not None:
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("members", "complaint"),
    [
        ([member("/tmp/evil")], "absolute path"),
        ([member("../evil")], "climbs out"),
        ([member("a/../../evil")], "climbs out"),
        ([member("link", tarfile.SYMTYPE, "/etc/passwd")], "points to an absolute path"),
        ([member("link", tarfile.SYMTYPE, "../outside")], "points outside"),
        ([member("a/b/link", tarfile.SYMTYPE, "../../../outside")], "points outside"),
        ([member("dev", tarfile.CHRTYPE)], "device"),
        ([member("fifo", tarfile.FIFOTYPE)], "device"),
        ([member("hard", tarfile.LNKTYPE, "../../etc/passwd")], "points outside"),
        ([member("hard", tarfile.LNKTYPE, "/etc/passwd")], "absolute path"),
        ([member("hard", tarfile.LNKTYPE, "later.txt"), member("later.txt")], "not to a file"),
        (
            [member("up", tarfile.SYMTYPE, "."), member("x", tarfile.SYMTYPE, "up/..")],
            "points outside",
        ),
        (
            # The link that leads out comes after the one that goes through it.
            [member("x", tarfile.SYMTYPE, "up/.."), member("up", tarfile.SYMTYPE, ".")],
            "points outside",
        ),
        (
            [member("here", tarfile.SYMTYPE, "."), member("here/x", tarfile.SYMTYPE, "..")],
            "lies under the link",
        ),
    ],
)
def test_unsafe_members_are_refused_before_anything_is_written(
    tmp_path: Path, members: list[tarfile.TarInfo], complaint: str
) -> None:
    bundle = hostile(tmp_path, member("fine.txt"), *members)
    dest = tmp_path / "sandbox" / "dest"
    with pytest.raises(UnsafeBundleError, match=complaint):
        extract_bundle(bundle, dest)
    assert list(dest.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostile.tar.gz", "sandbox"]


def test_hard_link_to_an_earlier_file_is_fine(tmp_path: Path) -> None:
    bundle = hostile(tmp_path, member("a.txt"), member("sub/b.txt", tarfile.LNKTYPE, "a.txt"))
    dest = tmp_path / "dest"
    extract_bundle(bundle, dest)
    assert (dest / "sub" / "b.txt").read_text() == "owned"


def test_link_inside_the_bundle_is_fine(tmp_path: Path) -> None:
    bundle = hostile(
        tmp_path, member("a/real.txt"), member("a/b/link", tarfile.SYMTYPE, "../real.txt")
    )
    dest = tmp_path / "dest"
    assert extract_bundle(bundle, dest) == 2
    assert (dest / "a" / "b" / "link").read_text() == "owned"


def test_corrupt_bundle_is_a_bundle_error(tmp_path: Path) -> None:
    path = tmp_path / "b.tar.gz"
    path.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(BundleError, match=r"cannot unpack b\.tar\.gz"):
        extract_bundle(path, tmp_path / "dest")


# --- .gitignore, .git and the gpulayer home -----------------------------------------------------


def test_gitignore_is_honoured_with_git_semantics_and_gpulayerignore_has_the_last_word(
    tmp_path: Path,
) -> None:
    src = make_tree(
        tmp_path / "src",
        {
            ".gitignore": "*.log\n/build/\ndata/*\n!data/keep.csv\n",
            ".gpulayerignore": "!wanted.log\n",
            "train.py": "x",
            "run.log": "drop",
            "wanted.log": "keep: .gpulayerignore re-includes it",
            "build/out.o": "drop",
            "sub/build/kept.txt": "kept: /build/ is anchored at the root",
            "data/big.bin": "drop",
            "data/keep.csv": "keep",
            "sub/.gitignore": "secret.txt\n!local.log\n",
            "sub/secret.txt": "drop: the nested .gitignore",
            "sub/local.log": "keep: the nested .gitignore re-includes it",
            "other/secret.txt": "keep: the nested rule is sub/'s own",
        },
    )
    info = create_bundle(src, tmp_path / "b.tar.gz")
    assert [n for n in names(info.path) if not n.endswith((".gitignore", ".gpulayerignore"))] == [
        "data",
        "data/keep.csv",
        "other",
        "other/secret.txt",
        "sub",
        "sub/build",
        "sub/build/kept.txt",
        "sub/local.log",
        "train.py",
        "wanted.log",
    ]


def test_git_internals_are_never_bundled(tmp_path: Path) -> None:
    src = make_tree(
        tmp_path / "src",
        {
            "a.py": "a",
            ".git/config": "[credential] helper = store",
            "vendored/.git": "gitdir: ../../.git/worktrees/x",  # a worktree's .git file
            ".gpulayerignore": "!.git/\n!.git\n",
        },
    )
    assert names(create_bundle(src, tmp_path / "b.tar.gz").path) == [
        ".gpulayerignore",
        "a.py",
        "vendored",
    ]


def test_the_gpulayer_home_is_never_bundled(tmp_path: Path) -> None:
    src = make_tree(tmp_path / "src", {"a.py": "a", "state/gpulayer/state.db": "rows"})
    info = create_bundle(src, tmp_path / "b.tar.gz", exclude=[src / "state" / "gpulayer"])
    assert names(info.path) == ["a.py", "state"]


def test_local_inputs_travel_in_the_bundle_beside_the_source(tmp_path: Path) -> None:
    from gpulayer.protocol.bundle import (
        SHIPPED_INPUTS_DIR,
        extract_bundle,
        local_input_paths,
        shipped_input,
    )

    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print(1)\n")
    (source / ".gitignore").write_text("data.csv\n")
    (source / "data.csv").write_text("a,b\n")  # ignored as source, yet named as an input
    outside = tmp_path / "elsewhere" / "corpus"
    (outside / "part").mkdir(parents=True)
    (outside / "part" / "x.txt").write_text("x")
    artifacts = ["data.csv", str(outside), "job:j-1/model", "s3://bucket/key", "missing.txt"]
    inputs = local_input_paths(artifacts, source)
    assert inputs == {0: source / "data.csv", 1: outside}
    bundle = tmp_path / "b.tar.gz"
    create_bundle(source, bundle, inputs=inputs)
    work = tmp_path / "work"
    extract_bundle(bundle, work)
    assert not (work / "data.csv").exists()  # the source's own rules still hold
    assert (work / "train.py").exists()
    first, second = shipped_input(work, 0), shipped_input(work, 1)
    assert first is not None and first.read_text() == "a,b\n"
    assert second is not None and (second / "part" / "x.txt").read_text() == "x"
    assert shipped_input(work, 2) is None
    assert sorted(p.name for p in (work / SHIPPED_INPUTS_DIR).iterdir()) == ["0", "1"]

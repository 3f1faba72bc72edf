"""The wheelhouse: which distributions a worker needs, repacking installed ones into wheels,
the cache, and whether a host's python can install the result."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from gpulayer.cloud.wheelhouse import (
    SERVER_ONLY,
    DistributionNotRepackable,
    WheelFile,
    WheelhouseError,
    build_wheelhouse,
    canonical,
    host_platform_tag,
    incompatibility,
    repack_distribution,
    tag_fits,
    wheel_fits,
    wheel_name,
    worker_distributions,
)

# --- which tags a host can install ------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "python", "platform", "glibc", "fits"),
    [
        ("py3-none-any", "3.10.4", "linux_aarch64", None, True),
        ("py2.py3-none-any", "3.12.0", "linux_x86_64", None, False),  # compressed: split first
        ("py311-none-any", "3.11.2", "linux_x86_64", None, True),
        ("py3-abi3-any", "3.11.2", "linux_x86_64", None, False),  # pip does not install it
        ("py312-none-any", "3.11.2", "linux_x86_64", None, False),
        ("cp311-cp311-manylinux_2_17_x86_64", "3.11.9", "linux_x86_64", "2.36", True),
        ("cp311-cp311-manylinux_2_17_x86_64", "3.10.12", "linux_x86_64", "2.36", False),
        ("cp311-cp311-manylinux_2_17_x86_64", "3.11.9", "linux_aarch64", "2.36", False),
        ("cp311-cp311-manylinux_2_28_x86_64", "3.11.9", "linux_x86_64", "2.17", False),
        ("cp311-cp311-manylinux2014_x86_64", "3.11.9", "linux_x86_64", "2.17", True),
        ("cp311-cp311-manylinux2014_x86_64", "3.11.9", "linux_x86_64", "2.12", False),
        ("cp311-cp311-manylinux_2_28_x86_64", "3.11.9", "linux_x86_64", None, True),
        ("cp39-abi3-manylinux_2_17_x86_64", "3.12.1", "linux_x86_64", "2.36", True),
        ("cp313-abi3-manylinux_2_17_x86_64", "3.12.1", "linux_x86_64", "2.36", False),
        ("cp311-cp311-linux_x86_64", "3.11.0", "linux_x86_64", None, True),
        ("cp311-cp311-macosx_11_0_arm64", "3.11.0", "linux_aarch64", None, False),
    ],
)
def test_tag_fits(tag: str, python: str, platform: str, glibc: str | None, fits: bool) -> None:
    assert tag_fits(tag, python, platform, glibc=glibc) is fits


def test_cpython_wheels_do_not_fit_another_implementation() -> None:
    tag = "cp311-cp311-manylinux_2_17_x86_64"
    assert not tag_fits(tag, "3.11.0", "linux_x86_64", implementation="pypy")
    assert tag_fits("py3-none-any", "3.11.0", "linux_x86_64", implementation="pypy")


def test_a_wheel_fits_by_the_tags_its_file_name_carries() -> None:
    name = "pyyaml-6.0.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert wheel_fits(name, "3.11.4", "linux_x86_64", glibc="2.17")
    assert not wheel_fits(name, "3.11.4", "linux_x86_64", glibc="2.12")
    assert wheel_fits("six-1.17.0-py2.py3-none-any.whl", "3.12.0", "linux_aarch64")
    assert not wheel_fits("not-a-wheel.tar.gz", "3.12.0", "linux_aarch64")


def test_incompatibility_names_the_first_wheel_that_does_not_fit() -> None:
    wheels = [
        WheelFile("a-1-py3-none-any.whl", 1, "0", "a", "1", ("py3-none-any",)),
        WheelFile(
            "b-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            1,
            "0",
            "b",
            "1",
            ("cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux2014_x86_64"),
        ),
    ]
    assert incompatibility(wheels, "3.11.4", "linux_x86_64", glibc="2.31") is None
    why = incompatibility(wheels, "3.12.0", "linux_x86_64", glibc="2.31")
    assert why is not None and why.startswith("b-1-cp311") and "cpython 3.12.0" in why


def test_wheel_names_compress_their_tags() -> None:
    tags = ["cp311-cp311-manylinux_2_17_x86_64", "cp311-cp311-manylinux2014_x86_64"]
    assert (
        wheel_name("PyYAML", "6.0.3", tags)
        == "pyyaml-6.0.3-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    )
    assert wheel_name("typing.extensions", "4.1", ["py3-none-any"], "1") == (
        "typing_extensions-4.1-1-py3-none-any.whl"
    )


# --- fake installed distributions, real metadata on disk ------------------------------------------


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install_fake(
    site: Path,
    name: str,
    requires: tuple[str, ...] = (),
    *,
    files: dict[str, bytes] | None = None,
    record: bool = True,
    wheel: bool = True,
    missing: tuple[str, ...] = (),
) -> None:
    """Lay out ``name`` in ``site`` as pip would have installed it."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(meta) + "\n")
    members = dict(files or {f"{name}/__init__.py": b"VALUE = 1\n"})
    members[f"{name}/__pycache__/__init__.cpython-311.pyc"] = b"\0bytecode"
    if wheel:
        (info / "WHEEL").write_text(
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
    rows = []
    for relative, data in members.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append(f"{relative},{_record_hash(data)},{len(data)}")
    rows += [f"{relative},sha256=x,1" for relative in missing]
    rows += [f"{info.name}/METADATA,,", f"{info.name}/INSTALLER,,", f"{info.name}/RECORD,,"]
    if wheel:
        rows.append(f"{info.name}/WHEEL,,")
    (info / "INSTALLER").write_text("pip\n")
    if record:
        (info / "RECORD").write_text("\n".join(rows) + "\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "site-packages"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def test_closure_follows_markers_and_extras_and_leaves_out_excluded(site: Path) -> None:
    install_fake(
        site,
        "demo",
        (
            "alpha>=1",
            "legacy; python_version < '3'",
            "gamma[fast]",
            "serverthing",
            "docs; extra == 'docs'",
        ),
    )
    install_fake(site, "alpha")
    install_fake(site, "gamma", ("delta; extra == 'fast'", "epsilon; extra == 'slow'"))
    install_fake(site, "delta")
    install_fake(site, "serverthing", ("serverdep",))
    names = [
        canonical(d.metadata["Name"]) for d in worker_distributions("demo", exclude=["ServerThing"])
    ]
    assert names == ["alpha", "delta", "demo", "gamma"]


def test_a_required_distribution_that_is_not_installed_is_named(site: Path) -> None:
    install_fake(site, "demo", ("ghost",))
    with pytest.raises(WheelhouseError, match="ghost is not installed here \\(demo requires it\\)"):
        worker_distributions("demo", exclude=())


def test_worker_closure_of_gpulayer_has_no_server_packages() -> None:
    names = {canonical(d.metadata["Name"]) for d in worker_distributions()}
    assert {"gpulayer", "pydantic", "pydantic-core", "typer", "pyyaml", "packaging"} <= names
    assert not names & {canonical(n) for n in SERVER_ONLY}
    # Dependencies only the server packages need go with them.
    assert not names & {"bcrypt", "pynacl", "h11", "greenlet", "python-dateutil"}


def test_repacked_wheel_holds_the_recorded_files_and_installs(site: Path, tmp_path: Path) -> None:
    install_fake(site, "demo", files={"demo/__init__.py": b"VALUE = 42\n", "demo/data.txt": b"hi"})
    out = tmp_path / "wheels"
    out.mkdir()
    wheel = repack_distribution(metadata.distribution("demo"), out)
    assert wheel.name == "demo-1.0-py3-none-any.whl"
    body = (out / wheel.name).read_bytes()
    assert (wheel.size, wheel.sha256) == (len(body), hashlib.sha256(body).hexdigest())
    with zipfile.ZipFile(out / wheel.name) as archive:
        names = set(archive.namelist())
        record = archive.read("demo-1.0.dist-info/RECORD").decode()
        for line in record.splitlines():
            member, digest, size = line.split(",")
            if digest:
                assert digest == _record_hash(archive.read(member)) and int(size) > 0
    assert names == {
        "demo/__init__.py",
        f"demo/__pycache__/__init__.{sys.implementation.cache_tag}.pyc",
        "demo/data.txt",
        "demo-1.0.dist-info/METADATA",
        "demo-1.0.dist-info/WHEEL",
        "demo-1.0.dist-info/RECORD",
    }
    target = tmp_path / "target"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
         str(target), str(out / wheel.name)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (target / "demo" / "__init__.py").read_text() == "VALUE = 42\n"


def test_repacking_twice_gives_the_same_bytes(site: Path, tmp_path: Path) -> None:
    install_fake(site, "demo")
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    dist = metadata.distribution("demo")
    assert repack_distribution(dist, first).sha256 == repack_distribution(dist, second).sha256


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ({"record": False}, "has no RECORD"),
        ({"wheel": False}, "has no WHEEL"),
        ({"missing": ("demo/gone.py",)}, "gone.py is listed in its RECORD but missing"),
    ],
)
def test_distributions_that_cannot_be_repacked_say_why(
    site: Path, tmp_path: Path, layout: dict[str, object], said: str
) -> None:
    install_fake(site, "demo", **layout)  # type: ignore[arg-type]
    with pytest.raises(DistributionNotRepackable, match=said):
        repack_distribution(metadata.distribution("demo"), tmp_path)


# --- the real wheelhouse of this interpreter ------------------------------------------------------


def test_wheelhouse_is_built_once_and_holds_the_real_gpulayer_package(tmp_path: Path) -> None:
    house = build_wheelhouse(tmp_path / "cache")
    assert house.path.parent == tmp_path / "cache"
    by_name = {w.distribution.lower(): w for w in house.files}
    assert {"gpulayer", "pip", "pydantic"} <= set(by_name)
    for wheel in house.files:
        body = (house.path / wheel.name).read_bytes()
        assert hashlib.sha256(body).hexdigest() == wheel.sha256
    with zipfile.ZipFile(house.path / by_name["gpulayer"].name) as archive:
        names = archive.namelist()
        entry_points = archive.read(
            f"gpulayer-{metadata.version('gpulayer')}.dist-info/entry_points.txt"
        ).decode()
    # Made from the package itself, not from an editable install's .pth file.
    assert "gpulayer/cli/app.py" in names and "gpulayer/cloud/wheelhouse/build.py" in names
    assert not [n for n in names if n.endswith(".pth")]
    # Each module's bytecode rides along where python looks for it, compiled once here, so a
    # host neither compiles nor writes bytecode into its sealed install.
    tag = sys.implementation.cache_tag
    assert "gpulayer/cli/__pycache__/app." + tag + ".pyc" in names
    assert not [n for n in names if n.endswith(".pyc") and "/__pycache__/" not in n]
    assert "gpulayer = gpulayer.cli:main" in entry_points
    with zipfile.ZipFile(house.path / by_name["pip"].name) as archive:
        # pip runs in place from its wheel; its bytecode rides along so it is not compiled anew.
        pip_names = set(archive.namelist())
    assert {"pip/__init__.py", "pip/__init__.pyc", "pip/__main__.pyc"} <= pip_names
    with zipfile.ZipFile(house.path / by_name["typer"].name) as archive:
        # Console scripts are not carried: pip writes them again on the host.
        assert not [n for n in archive.namelist() if ".data/scripts/" in n]
    stamps = {w.name: (house.path / w.name).stat().st_mtime_ns for w in house.files}
    again = build_wheelhouse(tmp_path / "cache")
    assert again == house
    assert stamps == {w.name: (again.path / w.name).stat().st_mtime_ns for w in again.files}


def test_wheelhouse_fits_this_interpreter_and_not_another_version(tmp_path: Path) -> None:
    house = build_wheelhouse(tmp_path / "cache")
    version = ".".join(map(str, sys.version_info[:3]))
    here = host_platform_tag(sysconfig.get_platform())
    assert house.compatible(version, here)
    assert house.python_tag == f"cp{sys.version_info[0]}{sys.version_info[1]}"
    assert house.platform == here
    other = f"{sys.version_info[0]}.{sys.version_info[1] - 1}.0"
    assert not house.compatible(other, here)
    assert house.incompatibility(other, here) is not None


def test_only_the_newest_wheelhouses_are_kept(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = [cache / f"gpulayer-0.0.{i}-cp311-linux_x86_64-{i:012d}" for i in range(4)]
    for index, directory in enumerate(old):
        directory.mkdir(parents=True)
        os.utime(directory, (1_000_000 + index, 1_000_000 + index))
    house = build_wheelhouse(cache)
    left = sorted(p.name for p in cache.iterdir() if p.is_dir())
    assert left == sorted([house.path.name, old[3].name, old[2].name])

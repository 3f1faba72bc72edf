"""The image catalog: release resolution per provider, catalog validation, the shipped files."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpulayer.cloud.images import (
    IMAGES_DIR_ENV,
    RELEASE_FIELD,
    ImageCatalogError,
    UnknownRelease,
    bootstrap_script,
    find_images_dir,
    load_catalog,
    parse_catalog,
    resolve_release,
    select_release,
)
from gpulayer.errors import UsageError

REPO = Path(__file__).parents[2]

CATALOG: dict[str, Any] = {
    "releases": {
        "2024.01": {
            "date": "2024-01-10",
            "providers": {"aws": {"name": "old-*"}, "gcp": {"family": "old"}},
        },
        "2025.03": {"date": "2025-03-01", "providers": {"aws": {"name": "new-*"}}},
        "2024.06": {"date": "2024-06-01", "providers": {"gcp": {"family": "mid"}, "ssh": {}}},
    }
}


def test_newest_release_naming_a_provider_is_its_default() -> None:
    catalog = parse_catalog(CATALOG)
    assert select_release(catalog, "aws").name == "2025.03"
    # gcp is not in the newest release: its newest is the mid one.
    gcp = select_release(catalog, "gcp")
    assert (gcp.name, gcp.date, gcp.selector) == ("2024.06", dt.date(2024, 6, 1), {"family": "mid"})
    assert select_release(catalog, "ssh").selector == {}


def test_a_named_release_is_used_as_named() -> None:
    catalog = parse_catalog(CATALOG)
    assert select_release(catalog, "aws", "2024.01").selector == {"name": "old-*"}


def test_unknown_release_is_a_usage_error_naming_the_field() -> None:
    catalog = parse_catalog(CATALOG)
    with pytest.raises(
        UnknownRelease, match=f"^{re.escape(RELEASE_FIELD)}: unknown release"
    ) as err:
        select_release(catalog, "aws", "1999.01")
    assert isinstance(err.value, UsageError)
    assert "2025.03" in str(err.value)


def test_release_without_an_image_for_the_provider_says_which_releases_have_one() -> None:
    catalog = parse_catalog(CATALOG)
    with pytest.raises(UnknownRelease, match=r"has no image for provider 'ssh'.*2024\.06"):
        select_release(catalog, "ssh", "2025.03")
    with pytest.raises(UnknownRelease, match="no image release covers provider 'azure'"):
        select_release(catalog, "azure")


def test_selectors_handed_out_are_copies() -> None:
    catalog = parse_catalog(CATALOG)
    select_release(catalog, "aws").selector["name"] = "changed"
    assert select_release(catalog, "aws").selector == {"name": "new-*"}


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ([], r"\(top\)"),
        ({"releases": {}}, "releases"),
        (
            {"releases": {"bad name": {"date": "2024-01-01", "providers": {"aws": {}}}}},
            "releases.bad name",
        ),
        ({"releases": {"r1": {"date": "soon", "providers": {"aws": {}}}}}, "releases.r1.date"),
        ({"releases": {"r1": {"date": "2024-01-01", "providers": {}}}}, "releases.r1.providers"),
        (
            {"releases": {"r1": {"date": "2024-01-01", "providers": {"aws": "ami"}}}},
            "releases.r1.providers.aws",
        ),
        (
            {"releases": {"r1": {"date": "2024-01-01", "providers": {"aws": {}}, "x": 1}}},
            "releases.r1.x",
        ),
    ],
)
def test_malformed_catalogs_name_the_entry(document: Any, where: str) -> None:
    with pytest.raises(ImageCatalogError, match=f"catalog.json: {where}"):
        parse_catalog(document, source="catalog.json")


def test_shipped_catalog_resolves_every_provider_it_names() -> None:
    catalog = load_catalog()
    assert {"aws", "gcp", "ssh"} <= set(catalog.providers())
    aws = resolve_release("aws")
    assert aws.name == catalog.release_names()[0]
    assert aws.selector["owners"] and "Ubuntu 22.04" in aws.selector["name"]
    assert aws.selector["ssh_user"] == "ubuntu"
    gcp = resolve_release("gcp")
    assert set(gcp.selector) >= {"project", "family"}
    assert resolve_release("ssh").selector == {}
    for name in catalog.release_names():
        assert resolve_release("aws", name).name == name


def test_images_dir_is_found_beside_the_package_or_where_the_variable_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert find_images_dir() == REPO / "images"
    (tmp_path / "releases.json").write_text(json.dumps(CATALOG))
    (tmp_path / "bootstrap.sh").write_text("#!/bin/sh\n")
    monkeypatch.setenv(IMAGES_DIR_ENV, str(tmp_path))
    assert find_images_dir() == tmp_path
    assert resolve_release("aws").name == "2025.03"
    assert bootstrap_script() == tmp_path / "bootstrap.sh"
    monkeypatch.setenv(IMAGES_DIR_ENV, str(tmp_path / "missing"))
    with pytest.raises(ImageCatalogError, match=IMAGES_DIR_ENV):
        find_images_dir()


def test_bootstrap_script_is_posix_sh() -> None:
    script = bootstrap_script()
    assert script.read_text().startswith("#!/bin/sh\n")
    assert os.access(script, os.X_OK)
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "install_dir", ["/", "/var/tmp", "/root", "/home/alice", "/usr/lib/x", "relative", "/a/../b"]
)
def test_bootstrap_script_refuses_an_install_dir_that_is_not_its_own(install_dir: str) -> None:
    done = subprocess.run(
        ["sh", str(bootstrap_script()), "remove", "--install-dir", install_dir],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "gpulayer-bootstrap: error: --install-dir" in done.stderr


def test_bootstrap_script_removes_only_its_install_dir(tmp_path: Path) -> None:
    keep = tmp_path / "gpulayer" / "other-job"
    gone = tmp_path / "gpulayer" / "this-job"
    for directory in (keep, gone / "venv"):
        directory.mkdir(parents=True)
    (gone / "venv" / "file").write_text("x")
    for _ in range(2):  # the second time there is nothing left to do, and that is fine
        done = subprocess.run(
            ["sh", str(bootstrap_script()), "remove", "--install-dir", str(gone)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert not gone.exists() and keep.is_dir()


def test_cloud_init_template_is_a_cloud_config() -> None:
    path = find_images_dir() / "cloud-init.yaml"
    text = path.read_text()
    assert text.startswith("#cloud-config\n")
    document = yaml.safe_load(text)
    assert {"python3", "python3-venv"} <= set(document["packages"])
    installer = next(f for f in document["write_files"] if f["path"] == "/opt/gpulayer/install.sh")
    assert "/opt/gpulayer/venv" in installer["content"]
    assert any("/opt/gpulayer/install.sh" in " ".join(step) for step in document["runcmd"])
    done = subprocess.run(
        ["sh", "-n"], input=installer["content"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr

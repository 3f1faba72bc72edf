"""Image releases: which machine image each provider boots for a job, and the bootstrap script
that turns it into a worker.

The catalog (``images/releases.json``) names releases; each release says, per provider, how to
find its image (an AMI owner and name pattern, a GCE project and family, nothing for hosts that
already exist) and carries a date. A job that names no release gets the newest release that
covers its provider, so publishing a release moves every provider it names forward at once.

The ``images/`` folder is found beside the ``gpulayer`` package (a source checkout or an
editable install), else inside it as ``gpulayer/_images`` (a wheel built with the folder
included), else where ``GPULAYER_IMAGES_DIR`` points; that variable wins when set.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulayer.errors import GpulayerError, UsageError

IMAGES_DIR_ENV = "GPULAYER_IMAGES_DIR"
CATALOG_FILE = "releases.json"
BOOTSTRAP_FILE = "bootstrap.sh"
CLOUD_INIT_FILE = "cloud-init.yaml"
RELEASE_FIELD = "placement.provisioning.release"

_RELEASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_PROVIDER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class ImageCatalogError(GpulayerError):
    """The image catalog is missing or malformed; the message names the file and the entry."""


class UnknownRelease(UsageError):
    """A job names a release the catalog does not have, or one without an image for its
    provider. The message names ``placement.provisioning.release``."""


@dataclass(frozen=True)
class ImageRelease:
    name: str
    date: dt.date
    selector: dict[str, Any] = field(default_factory=dict)
    """Provider-specific: see each provider's image resolution (e.g. gpulayer_aws.images)."""
    notes: str = ""


@dataclass(frozen=True)
class Catalog:
    releases: tuple[ImageRelease, ...]
    """Every (release, provider) entry, newest release first."""
    providers_of: Mapping[str, frozenset[str]]
    """Release name -> providers it has an image for."""
    selectors: Mapping[tuple[str, str], dict[str, Any]]
    """(release, provider) -> selector."""

    def release_names(self) -> list[str]:
        return [r.name for r in self.releases]

    def providers(self) -> list[str]:
        return sorted({p for names in self.providers_of.values() for p in names})


def find_images_dir() -> Path:
    """The folder holding the catalog and the bootstrap script (see the module docstring)."""
    override = os.environ.get(IMAGES_DIR_ENV)
    if override:
        path = Path(override)
        if not (path / CATALOG_FILE).is_file():
            raise ImageCatalogError(f"{IMAGES_DIR_ENV}={override}: no {CATALOG_FILE} there")
        return path
    import gpulayer

    package = Path(gpulayer.__file__).resolve().parent
    for candidate in (package.parent / "images", package / "_images"):
        if (candidate / CATALOG_FILE).is_file():
            return candidate
    raise ImageCatalogError(
        f"no image catalog found: looked for images/{CATALOG_FILE} beside {package} and in "
        f"{package / '_images'}; set {IMAGES_DIR_ENV} to the images folder"
    )


def bootstrap_script() -> Path:
    """The POSIX sh script that installs and starts a worker (see images/bootstrap.sh)."""
    path = find_images_dir() / BOOTSTRAP_FILE
    if not path.is_file():
        raise ImageCatalogError(f"{path} is missing")
    return path


def parse_catalog(data: Any, *, source: str = CATALOG_FILE) -> Catalog:
    """Validate a catalog document. Pure."""

    def bad(where: str, problem: str) -> ImageCatalogError:
        return ImageCatalogError(f"{source}: {where}: {problem}")

    if not isinstance(data, Mapping):
        raise bad("(top)", "must be a JSON object")
    releases = data.get("releases")
    if not isinstance(releases, Mapping) or not releases:
        raise bad("releases", "must be a non-empty object of release name -> release")
    entries: list[ImageRelease] = []
    providers_of: dict[str, frozenset[str]] = {}
    selectors: dict[tuple[str, str], dict[str, Any]] = {}
    for name, body in releases.items():
        where = f"releases.{name}"
        if not isinstance(name, str) or not _RELEASE_NAME.match(name):
            raise bad(where, "release names are letters, digits, '_', '.' and '-'")
        if not isinstance(body, Mapping):
            raise bad(where, "must be an object with date and providers")
        unknown = sorted(set(body) - {"date", "providers", "notes"})
        if unknown:
            raise bad(f"{where}.{unknown[0]}", "unknown key")
        try:
            date = dt.date.fromisoformat(str(body.get("date")))
        except ValueError:
            raise bad(f"{where}.date", "must be a date such as 2025-11-20") from None
        providers = body.get("providers")
        if not isinstance(providers, Mapping) or not providers:
            raise bad(f"{where}.providers", "must name at least one provider")
        for provider, selector in providers.items():
            if not isinstance(provider, str) or not _PROVIDER_NAME.match(provider):
                raise bad(f"{where}.providers.{provider}", "is not a provider name")
            if not isinstance(selector, Mapping):
                raise bad(f"{where}.providers.{provider}", "the image selector must be an object")
            selectors[(name, provider)] = dict(selector)
        providers_of[name] = frozenset(providers)
        entries.append(ImageRelease(name, date, {}, str(body.get("notes", ""))))
    # Newest first; two releases of one day are ordered by name, so the choice is stable.
    entries.sort(key=lambda r: (r.date, r.name), reverse=True)
    return Catalog(tuple(entries), providers_of, selectors)


def load_catalog(path: Path | None = None) -> Catalog:
    path = path or find_images_dir() / CATALOG_FILE
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ImageCatalogError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ImageCatalogError(f"{path} is not valid JSON: {exc}") from exc
    return parse_catalog(data, source=str(path))


def select_release(catalog: Catalog, provider: str, release: str | None = None) -> ImageRelease:
    """The named release's image for ``provider``, or the newest release that has one. Pure."""
    if release is None:
        for entry in catalog.releases:
            if provider in catalog.providers_of[entry.name]:
                return _with_selector(catalog, entry, provider)
        known = ", ".join(catalog.providers()) or "none"
        raise UnknownRelease(
            f"{RELEASE_FIELD}: no image release covers provider {provider!r} "
            f"(the catalog has images for: {known})"
        )
    for entry in catalog.releases:
        if entry.name != release:
            continue
        if provider not in catalog.providers_of[entry.name]:
            covering = [
                r.name for r in catalog.releases if provider in catalog.providers_of[r.name]
            ]
            raise UnknownRelease(
                f"{RELEASE_FIELD}: release {release!r} has no image for provider {provider!r}"
                f" (releases that do: {', '.join(covering) or 'none'})"
            )
        return _with_selector(catalog, entry, provider)
    raise UnknownRelease(
        f"{RELEASE_FIELD}: unknown release {release!r} "
        f"(known: {', '.join(catalog.release_names())})"
    )


def _with_selector(catalog: Catalog, entry: ImageRelease, provider: str) -> ImageRelease:
    # A copy, so a caller that adds to its selector never changes the loaded catalog.
    selector = json.loads(json.dumps(catalog.selectors[(entry.name, provider)]))
    return ImageRelease(entry.name, entry.date, selector, entry.notes)


def resolve_release(provider: str, release: str | None = None) -> ImageRelease:
    """The image release a job on ``provider`` boots: ``release`` if named, else the newest."""
    return select_release(load_catalog(), provider, release)

"""A wheelhouse and its files, as built and as a host is asked to install them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulayer.cloud.wheelhouse.tags import wheel_fits


@dataclass(frozen=True)
class WheelFile:
    name: str
    """The file name, ``{distribution}-{version}-{tags}.whl``."""
    size: int
    sha256: str
    """Hex digest of the whole file."""
    distribution: str
    version: str
    tags: tuple[str, ...]
    """Every ``python-abi-platform`` tag the WHEEL file lists."""


def incompatibility(
    files: Iterable[WheelFile],
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> str | None:
    """The first wheel that does not fit the host, said in one line; None when all fit."""
    for wheel in files:
        if not wheel_fits(
            wheel.name,
            host_python_version,
            host_platform,
            glibc=glibc,
            implementation=implementation,
        ):
            host = f"{implementation} {host_python_version} on {host_platform}"
            if glibc:
                host += f" (glibc {glibc})"
            return (
                f"{wheel.name} does not install on {host}: it is built for "
                f"{', '.join(wheel.tags)}; the worker's wheels come from this controller, "
                "so the host needs the controller's python version and platform"
            )
    return None


@dataclass(frozen=True)
class Wheelhouse:
    path: Path
    python_tag: str
    """``cp311`` when some wheel is built for one interpreter version, else ``py3``."""
    platform: str
    """``linux_x86_64`` when some wheel is built for one platform, else ``any``."""
    files: tuple[WheelFile, ...]
    key: str = ""
    gpulayer_version: str = ""
    python_version: str = ""
    """The controller's ``major.minor``."""

    def file(self, name: str) -> WheelFile:
        for entry in self.files:
            if entry.name == name:
                return entry
        raise KeyError(name)

    def incompatibility(
        self,
        host_python_version: str,
        host_platform: str,
        *,
        glibc: str | None = None,
        implementation: str = "cpython",
    ) -> str | None:
        """Why these wheels cannot be installed on the host, or None when they can.

        ``host_platform`` is the host's wheel platform tag (``linux_x86_64``: sysconfig's
        platform with '-' and '.' as '_'); ``glibc`` its C library version (``2.36``), None
        when unknown, in which case manylinux wheels are taken to fit any glibc."""
        return incompatibility(
            self.files,
            host_python_version,
            host_platform,
            glibc=glibc,
            implementation=implementation,
        )

    def compatible(
        self,
        host_python_version: str,
        host_platform: str,
        *,
        glibc: str | None = None,
        implementation: str = "cpython",
    ) -> bool:
        return (
            self.incompatibility(
                host_python_version, host_platform, glibc=glibc, implementation=implementation
            )
            is None
        )

"""Whether a host's python can install a wheel, by the wheel's tags. Pure.

A tag is ``python-abi-platform`` (``cp311-cp311-manylinux_2_17_x86_64``). The host is
described by its python version, implementation, wheel platform tag (``linux_x86_64``) and
glibc version. The tags it installs are packaging.tags' for that python, on the platforms the
host admits: its own, ``any``, and on linux the manylinux tags its glibc is at least as new as.
"""

from __future__ import annotations

import functools
import re
import sysconfig

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(.+)$")


def _version_pair(text: str, what: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", text.strip())
    if not match:
        raise ValueError(f"{what}: {text!r} is not a version such as 3.11.7")
    return int(match.group(1)), int(match.group(2))


def _glibc_named(platform: str, arch: str) -> tuple[int, int] | None:
    """The glibc a manylinux platform tag for ``arch`` needs; None for any other tag."""
    for legacy, needed in _LEGACY_MANYLINUX.items():
        if platform == f"{legacy}_{arch}":
            return needed
    match = _MANYLINUX.match(platform)
    if match and match.group(3) == arch:
        return int(match.group(1)), int(match.group(2))
    return None


def host_platforms(host_platform: str, glibc: tuple[int, int] | None) -> tuple[str, ...]:
    """The platform tags a host installs: its own, manylinux ones up to its glibc, ``any``."""
    platforms = [host_platform]
    if host_platform.startswith("linux_") and glibc is not None:
        arch = host_platform[len("linux_") :]
        major, minor = glibc
        platforms += [f"manylinux_{major}_{m}_{arch}" for m in range(minor, -1, -1)]
        platforms += [f"{name}_{arch}" for name, need in _LEGACY_MANYLINUX.items() if glibc >= need]
    return (*platforms, "any")


@functools.lru_cache(maxsize=64)
def supported_tags(
    python: tuple[int, int], platforms: tuple[str, ...], implementation: str
) -> frozenset[Tag]:
    """Every tag a ``python`` (major, minor) of ``implementation`` installs on ``platforms``."""
    if implementation != "cpython":
        # Only pure wheels without an ABI: the cp and abi3 tags are CPython's own.
        return frozenset(compatible_tags(python, None, platforms))
    interpreter = f"cp{python[0]}{python[1]}"
    return frozenset(
        (
            *cpython_tags(python, [interpreter], platforms),
            *compatible_tags(python, interpreter, platforms),
        )
    )


def tag_fits(
    tag: str,
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> bool:
    """Whether one ``python-abi-platform`` wheel tag installs on the host. A compressed tag
    set (``py2.py3-none-any``) is not one tag: split it first."""
    parts = tag.split("-")
    if len(parts) != 3:
        return False
    return _fits(Tag(*parts), host_python_version, host_platform, glibc, implementation)


def wheel_fits(
    filename: str,
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> bool:
    """Whether pip on the host installs the wheel file ``filename``: pip goes by the tags in
    the name (compressed sets expanded), so these are the tags read here. A name that is not
    a wheel's does not fit."""
    try:
        tags = parse_wheel_filename(filename)[3]
    except InvalidWheelFilename:
        return False
    return any(_fits(t, host_python_version, host_platform, glibc, implementation) for t in tags)


def _fits(
    wanted: Tag,
    host_python_version: str,
    host_platform: str,
    glibc: str | None,
    implementation: str,
) -> bool:
    python = _version_pair(host_python_version, "host_python_version")
    libc = _version_pair(glibc, "glibc") if glibc else None
    if libc is None and host_platform.startswith("linux_"):
        # An unknown glibc is taken to be as new as the wheel needs.
        libc = _glibc_named(wanted.platform, host_platform[len("linux_") :])
    platforms = host_platforms(host_platform, libc)
    return wanted in supported_tags(python, platforms, implementation)


def host_platform_tag(raw: str | None = None) -> str:
    """``linux-x86_64`` (sysconfig's form) as a wheel platform tag: ``linux_x86_64``."""
    return (raw or sysconfig.get_platform()).replace("-", "_").replace(".", "_")

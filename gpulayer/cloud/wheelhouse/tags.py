"""Whether a host's python can install a wheel, by the wheel's tags. Pure.

A tag is ``python-abi-platform`` (``cp311-cp311-manylinux_2_17_x86_64``). The host is
described by its python version, implementation, wheel platform tag (``linux_x86_64``) and
glibc version; manylinux tags fit a glibc at least as new as they name.
"""

from __future__ import annotations

import re
import sysconfig
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpulayer.cloud.wheelhouse.model import WheelFile

_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(.+)$")


def _version_pair(text: str, what: str) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)", text.strip())
    if not match:
        raise ValueError(f"{what}: {text!r} is not a version such as 3.11.7")
    return int(match.group(1)), int(match.group(2))


def _python_fits(interpreter: str, abi: str, py: tuple[int, int], implementation: str) -> bool:
    major, minor = py
    if interpreter.startswith("py"):
        digits = interpreter[2:]
        if digits == str(major):
            return True
        return digits.startswith(str(major)) and digits[1:].isdigit() and int(digits[1:]) <= minor
    if interpreter.startswith("cp") and implementation == "cpython":
        digits = interpreter[2:]
        if not digits.isdigit() or not digits.startswith(str(major)) or len(digits) < 2:
            return False
        wanted = int(digits[len(str(major)) :])
        # abi3 wheels run on their version and every later one; others on their version only.
        return wanted <= minor if abi == "abi3" else wanted == minor
    return False


def _abi_fits(abi: str, py: tuple[int, int], implementation: str) -> bool:
    if abi in ("none", "abi3"):
        return abi == "none" or implementation == "cpython"
    return implementation == "cpython" and abi == f"cp{py[0]}{py[1]}"


def _platform_fits(tag: str, host: str, glibc: tuple[int, int] | None) -> bool:
    if tag == "any" or tag == host:
        return True
    if not host.startswith("linux_"):
        return False
    arch = host[len("linux_") :]
    for legacy, needed in _LEGACY_MANYLINUX.items():
        if tag == f"{legacy}_{arch}":
            return glibc is None or glibc >= needed
    match = _MANYLINUX.match(tag)
    if match and match.group(3) == arch:
        return glibc is None or glibc >= (int(match.group(1)), int(match.group(2)))
    return False


def tag_fits(
    tag: str,
    host_python_version: str,
    host_platform: str,
    *,
    glibc: str | None = None,
    implementation: str = "cpython",
) -> bool:
    """Whether one ``python-abi-platform`` wheel tag installs on the host."""
    parts = tag.split("-")
    if len(parts) != 3:
        return False
    interpreter, abi, plat = parts
    py = _version_pair(host_python_version, "host_python_version")
    libc = _version_pair(glibc, "glibc") if glibc else None
    return (
        _python_fits(interpreter, abi, py, implementation)
        and _abi_fits(abi, py, implementation)
        and _platform_fits(plat, host_platform, libc)
    )


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
        if not any(
            tag_fits(
                tag,
                host_python_version,
                host_platform,
                glibc=glibc,
                implementation=implementation,
            )
            for tag in wheel.tags
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


def host_platform_tag(raw: str | None = None) -> str:
    """``linux-x86_64`` (sysconfig's form) as a wheel platform tag: ``linux_x86_64``."""
    return (raw or sysconfig.get_platform()).replace("-", "_").replace(".", "_")

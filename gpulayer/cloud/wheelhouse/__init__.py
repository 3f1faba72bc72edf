"""The worker's install set for a machine that cannot reach a package index.

Built offline from what this controller runs: every distribution the worker needs (gpulayer
and the closure of its runtime requirements, markers evaluated, server-only packages left
out) is repacked from its installed files into a wheel, and pip's wheel is added, with its
bytecode, to run in place, so the host can install without having pip. Repacking reads a
distribution's RECORD (the list of files pip installed), zips those files with their
.dist-info and takes the wheel tags from its WHEEL file; console scripts are left out
because pip writes them again at install time. Each module's bytecode rides along in its
``__pycache__`` (not checked against its source), so a host installs without compiling and
never writes bytecode into the sealed, read-only worker install.

gpulayer itself, when installed editable, has only a .pth file in its RECORD. Its wheel is
then made from the source tree instead: the package directory (without bytecode caches) plus
a .dist-info holding the installed METADATA and entry points, a generated WHEEL and RECORD.

Wheelhouses are cached under ``cache_dir/<key>``; the key names the gpulayer version, the
python and platform tags, and a digest of every distribution's name and version (and of the
source tree for an editable gpulayer), so any change builds a new one. Zips are written
deterministically, so an unchanged distribution gives a byte-identical wheel and a host that
already has it need not receive it again.
"""

from gpulayer.cloud.wheelhouse.build import (
    FORMAT,
    KEEP_WHEELHOUSES,
    MANIFEST,
    build_wheelhouse,
    default_cache_dir,
    wheelhouse_key,
)
from gpulayer.cloud.wheelhouse.closure import (
    ROOT_DISTRIBUTION,
    SERVER_ONLY,
    canonical,
    worker_distributions,
)
from gpulayer.cloud.wheelhouse.errors import DistributionNotRepackable, WheelhouseError
from gpulayer.cloud.wheelhouse.model import WheelFile, Wheelhouse, incompatibility
from gpulayer.cloud.wheelhouse.repack import (
    build_from_source,
    build_pip_runner,
    editable_source,
    repack_distribution,
    source_digest,
    wheel_name,
)
from gpulayer.cloud.wheelhouse.tags import host_platform_tag, tag_fits, wheel_fits

__all__ = [
    "FORMAT",
    "KEEP_WHEELHOUSES",
    "MANIFEST",
    "ROOT_DISTRIBUTION",
    "SERVER_ONLY",
    "DistributionNotRepackable",
    "WheelFile",
    "Wheelhouse",
    "WheelhouseError",
    "build_from_source",
    "build_pip_runner",
    "build_wheelhouse",
    "canonical",
    "default_cache_dir",
    "editable_source",
    "host_platform_tag",
    "incompatibility",
    "repack_distribution",
    "source_digest",
    "tag_fits",
    "wheel_fits",
    "wheel_name",
    "wheelhouse_key",
    "worker_distributions",
]

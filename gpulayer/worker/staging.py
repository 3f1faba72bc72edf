"""Staging a job's inputs under its input directory before it runs.

An input's artifact is one of: a local file or directory (absolute, or relative to the job's
source directory), ``job:<id>/<path>`` (another job's output, found by the control plane),
or a URL whose scheme has a registered fetcher (the aws provider adds s3://, gcp gs://).

A local path names a file of the machine the job was submitted on. Only the worker that runs
on that machine for that person (the local control plane's own, which runs as the submitting
user) opens it there; every other worker takes it from the job's bundle, which carried it from
the submitting machine, and refuses it otherwise: a worker's own files (its credential, the
machine's keys) are never a job's input, whatever rights the worker has.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpulayer.errors import ControlPlaneError, GpulayerError, NotFoundError, UsageError
from gpulayer.protocol.bundle import shipped_input
from gpulayer.spec.models import InputRef

Fetcher = Callable[[str, Path], None]
"""(artifact URL, destination path): writes the file or directory at the destination."""

ArtifactResolver = Callable[[str], Path]

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_PROVIDER_FOR_SCHEME = {"s3": "aws", "gs": "gcp"}
_fetchers: dict[str, Fetcher] = {}


class StagingError(GpulayerError):
    """An input could not be staged."""

    reason = "setup_failed"


class InputMissingError(StagingError, NotFoundError):
    """An input's artifact does not exist."""

    reason = "input_missing"


class FetcherUnavailableError(StagingError):
    """No fetcher is registered for an artifact's URL scheme."""

    reason = "input_missing"


class InputPathError(StagingError, UsageError):
    """An input's path would land outside the input directory."""


class MachinePathRefusedError(StagingError, UsageError):
    """A local-path input its bundle does not carry, on a worker that never opens paths of its
    own machine for a job."""


@dataclass(frozen=True)
class StagedInput:
    artifact: str
    path: Path
    is_dir: bool


def register_fetcher(scheme: str, fetcher: Fetcher) -> None:
    """Let ``scheme://`` artifacts be staged by ``fetcher``; a provider calls this when it
    is loaded. Registering a scheme again replaces its fetcher."""
    _fetchers[scheme.lower()] = fetcher


def unregister_fetcher(scheme: str) -> None:
    _fetchers.pop(scheme.lower(), None)


def _plugin_fetcher(scheme: str) -> Fetcher | None:
    """A fetcher an installed provider offers under the entry-point group gpulayer.fetchers."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="gpulayer.fetchers", name=scheme):
        fetcher: Fetcher = entry.load()
        register_fetcher(scheme, fetcher)
        return fetcher
    return None


def url_scheme(artifact: str) -> str | None:
    match = _SCHEME_RE.match(artifact)
    return match.group(1).lower() if match else None


def destination(input_dir: Path, rel_path: str, field: str) -> Path:
    """``input_dir/rel_path``, refusing any path that resolves outside ``input_dir``, through
    '..' or through a link an earlier input put there."""
    root = input_dir.resolve()
    target = (root / rel_path).resolve()
    if target == root or not target.is_relative_to(root):
        raise InputPathError(f"{field}.path: {rel_path!r} is not inside the input directory")
    return target


def _make_parent(target: Path, field: str) -> None:
    if target.exists() or target.is_symlink():
        raise InputPathError(f"{field}.path: {target.name!r} is already staged by another input")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        message = f"{field}.path: cannot make its directory: {_first_line(exc)}"
        raise InputPathError(message) from exc


def _copy(source: Path, target: Path, field: str) -> bool:
    _make_parent(target, field)
    try:
        if source.is_dir():
            # Links are followed: a dataset made of links (a model hub cache) must arrive as
            # its content, and a link could not be followed on another machine.
            shutil.copytree(source, target, symlinks=False)
            return True
        shutil.copy2(source, target)
    except (OSError, shutil.Error) as exc:
        raise StagingError(f"{field}: cannot copy {source}: {_first_line(exc)}") from exc
    return False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def stage_input(
    ref: InputRef,
    input_dir: Path,
    *,
    source_dir: Path | None,
    resolve_artifact: ArtifactResolver | None,
    field: str = "inputs",
    index: int | None = None,
    machine_paths: bool = False,
) -> StagedInput:
    """``machine_paths``: whether a local-path artifact is opened on this machine (only for
    a job of this machine's own user); otherwise only the bundle's copy of it is staged."""
    artifact = ref.artifact
    target = destination(input_dir, ref.path, field)
    shipped = shipped_input(source_dir, index) if source_dir and index is not None else None
    if shipped is not None:  # a local input, taken at submit on the machine that has it
        return StagedInput(artifact, target, _copy(shipped, target, field))
    if artifact.startswith("job:"):
        if resolve_artifact is None:
            raise StagingError(f"{field}.artifact: {artifact!r} needs a control plane to resolve")
        try:
            local = resolve_artifact(artifact)
        except (FileNotFoundError, NotFoundError) as exc:
            raise InputMissingError(f"{field}.artifact: {artifact!r}: {_first_line(exc)}") from exc
        except ControlPlaneError:
            raise  # the control plane went, not the input: the attempt is lost, not failed
        except Exception as exc:
            raise StagingError(f"{field}.artifact: {artifact!r}: {_first_line(exc)}") from exc
        if not local.exists():
            raise InputMissingError(f"{field}.artifact: {artifact!r} resolved to nothing")
        return StagedInput(artifact, target, _copy(local, target, field))
    scheme = url_scheme(artifact)
    if (scheme is None or scheme == "file") and not machine_paths:
        raise MachinePathRefusedError(
            f"{field}.artifact: {artifact!r} is a path of the submitting machine and the job's "
            "bundle does not carry it; this worker never opens its own machine's files for a job"
        )
    if scheme == "file":
        return _stage_local(artifact[len("file://") :], target, None, field, artifact)
    if scheme is not None:
        fetcher = _fetchers.get(scheme) or _plugin_fetcher(scheme)
        if fetcher is None:
            provider = _PROVIDER_FOR_SCHEME.get(scheme)
            need = f"the {provider} provider must be installed" if provider else "no fetcher"
            raise FetcherUnavailableError(
                f"{field}.artifact: {scheme}:// artifacts cannot be fetched here: {need}"
            )
        _make_parent(target, field)
        try:
            fetcher(artifact, target)
        except (FileNotFoundError, NotFoundError) as exc:
            raise InputMissingError(f"{field}.artifact: {artifact!r}: {_first_line(exc)}") from exc
        except Exception as exc:
            raise StagingError(f"{field}.artifact: {artifact!r}: {_first_line(exc)}") from exc
        if not target.exists():
            raise InputMissingError(f"{field}.artifact: fetching {artifact!r} gave nothing")
        return StagedInput(artifact, target, target.is_dir())
    return _stage_local(artifact, target, source_dir, field, artifact)


def _stage_local(
    local: str, target: Path, source_dir: Path | None, field: str, artifact: str
) -> StagedInput:
    path = Path(local).expanduser()
    if not path.is_absolute():
        if source_dir is None:
            raise StagingError(f"{field}.artifact: relative path {local!r} needs a source dir")
        path = source_dir / path
    if not path.exists():
        raise InputMissingError(f"{field}.artifact: {artifact!r} does not exist ({path})")
    return StagedInput(artifact, target, _copy(path, target, field))


def stage_inputs(
    inputs: Iterable[InputRef],
    input_dir: Path,
    *,
    source_dir: Path | None = None,
    resolve_artifact: ArtifactResolver | None = None,
    machine_paths: bool = False,
) -> list[StagedInput]:
    """Stage each input under ``input_dir``; the first failure raises a StagingError whose
    ``reason`` is the run outcome's. ``machine_paths``: see :func:`stage_input`."""
    input_dir.mkdir(parents=True, exist_ok=True)
    return [
        stage_input(
            ref,
            input_dir,
            source_dir=source_dir,
            resolve_artifact=resolve_artifact,
            field=f"inputs[{index}]",
            index=index,
            machine_paths=machine_paths,
        )
        for index, ref in enumerate(inputs)
    ]

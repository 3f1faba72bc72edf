"""Which installed distributions a worker needs: gpulayer's runtime requirements, followed
recursively with markers evaluated for this interpreter, minus what only the server uses."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import metadata

from gpulayer.cloud.wheelhouse.errors import WheelhouseError

ROOT_DISTRIBUTION = "gpulayer"
SERVER_ONLY = frozenset(
    {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "paramiko", "croniter"}
)
"""Never imported by a worker: the control plane (FastAPI, SQLAlchemy and Alembic, cron
schedules) and the controller's SSH side. Their own dependencies are left out with them unless
something the worker needs requires them too."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def worker_distributions(
    root: str = ROOT_DISTRIBUTION, *, exclude: Iterable[str] = SERVER_ONLY
) -> list[metadata.Distribution]:
    """``root`` and every installed distribution its requirements reach, markers evaluated
    for this interpreter, without following ``exclude``. Sorted by name."""
    from packaging.requirements import InvalidRequirement, Requirement

    excluded = {canonical(name) for name in exclude}
    found: dict[str, metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    pending: list[tuple[str, frozenset[str], str]] = [(root, frozenset(), "")]
    while pending:
        name, extras, needed_by = pending.pop()
        key = canonical(name)
        if key in found and extras <= extras_seen[key]:
            continue
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            by = f"{needed_by} requires it" if needed_by else "it is the worker's package"
            raise WheelhouseError(
                f"{name} is not installed here ({by}); install it on the controller"
            ) from None
        found[key] = dist
        extras_seen.setdefault(key, set()).update(extras)
        environments = [{"extra": extra} for extra in sorted(extras_seen[key] | {""})]
        for line in dist.requires or []:
            try:
                requirement = Requirement(line)
            except InvalidRequirement as exc:
                raise WheelhouseError(f"{dist.metadata['Name']}: bad requirement {line!r}") from exc
            if canonical(requirement.name) in excluded:
                continue
            marker = requirement.marker
            if marker is not None and not any(marker.evaluate(env) for env in environments):
                continue
            pending.append(
                (requirement.name, frozenset(requirement.extras), str(dist.metadata["Name"]))
            )
    return [found[key] for key in sorted(found)]

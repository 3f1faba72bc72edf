"""`gpulayer delete` and `gpulayer prune`: remove finished jobs with their logs and files."""

from __future__ import annotations

import re
from typing import Any, Optional

import typer

from gpulayer.cli.job_commands import JsonOption, ServerOption, _connect
from gpulayer.cli.output import print_json
from gpulayer.errors import UsageError

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str, flag: str = "--older-than") -> float:
    """``30d``, ``12h``, ``1w2d``, ``90m``, ``45s`` (or bare seconds) as seconds."""
    spaced = text.strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", spaced):
        return float(spaced)
    parts = _AGE.findall(spaced)
    if not parts or "".join(n + u for n, u in parts) != spaced:
        raise UsageError(f"{flag}: {text!r} is not an age such as 30d, 12h, 90m or 1w2d")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


DryRunOption = typer.Option(
    False, "--dry-run", help="Only list what would be removed; remove nothing."
)


def _report(jobs: list[dict[str, Any]], *, dry_run: bool, as_json: bool) -> None:
    if as_json:
        print_json(jobs)
        return
    verb = "would delete" if dry_run else "deleted"
    for job in jobs:
        typer.echo(f"{verb} {job['id']} ({job['name']}, {job['state']})")
    typer.echo(f"{len(jobs)} job(s) {verb}", err=True)


def delete(
    jobs: list[str] = typer.Argument(..., metavar="JOB...", help="Job ids (or unique prefixes)."),
    dry_run: bool = DryRunOption,
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Remove finished jobs: their logs, outputs, source bundle and records. A live job is
    refused (cancel it first) and then nothing is removed."""
    removed = _connect(server).client.delete_jobs(list(jobs), dry_run=dry_run)
    _report(removed, dry_run=dry_run, as_json=as_json)


def prune(
    older_than: str = typer.Option(
        ..., "--older-than", help="Age past which finished jobs go, e.g. 30d, 12h, 1w."
    ),
    dry_run: bool = DryRunOption,
    as_json: bool = JsonOption,
    server: Optional[str] = ServerOption,
) -> None:
    """Remove every finished job that ended longer ago than --older-than; live jobs stay."""
    seconds = parse_age(older_than)
    removed = _connect(server).client.prune_jobs(seconds, dry_run=dry_run)
    _report(removed, dry_run=dry_run, as_json=as_json)


def register(app: typer.Typer) -> None:
    for command in (delete, prune):
        app.command()(command)

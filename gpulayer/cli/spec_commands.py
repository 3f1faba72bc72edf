"""`gpulayer validate` and `gpulayer schema`: the contract, checked and published."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpulayer.cli.output import print_json


def validate(
    file: Path = typer.Option(..., "--file", "-f", help="Job file, JSON or YAML."),
    as_json: bool = typer.Option(False, "--json", help="Print the normalized spec as JSON."),
) -> None:
    """Check a job file and print it normalized, every default filled in."""
    from gpulayer.spec.loader import load_spec_data
    from gpulayer.spec.validate import validate_spec

    spec = validate_spec(load_spec_data(file))
    data = spec.model_dump(mode="json")
    if as_json:
        print_json(data)
    else:
        import yaml

        typer.echo(f"# {file}: valid")
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


def schema(
    schedule: bool = typer.Option(False, "--schedule", help="The Schedule's schema instead."),
) -> None:
    """Print the JobSpec JSON Schema (or the Schedule's), for editors that check files."""
    if schedule:
        from gpulayer.schedules.validate import schedule_json_schema

        typer.echo(json.dumps(schedule_json_schema(), indent=2))
        return
    from gpulayer.spec.schema import jobspec_schema

    typer.echo(json.dumps(jobspec_schema(), indent=2))


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(schema)

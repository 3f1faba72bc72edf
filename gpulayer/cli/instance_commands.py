"""`gpulayer instances`: the machines rented for cloud jobs, where each one is in its life."""

from __future__ import annotations

from typing import Any, Optional

import typer

from gpulayer.cli.output import print_json


def instances(
    include_gone: bool = typer.Option(
        False, "--all", help="Also instances already terminated or never launched."
    ),
    job: Optional[str] = typer.Option(None, "--job", help="Only this job's instances."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """Each rented instance: provider, type, region/zone, state, age in state, price, accrued
    cost and job."""
    from gpulayer.sdk.connection import connect

    params = {"all": "true" if include_gone else None, "job": job}
    found: list[dict[str, Any]] = connect(server).client.request(
        "GET", "/v1/instances", params=params
    )
    if as_json:
        print_json(found)
        return
    from gpulayer.cli.render import instances_table

    instances_table(found)


def register(app: typer.Typer) -> None:
    app.command()(instances)

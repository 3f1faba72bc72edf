"""Cloud commands: `gpulayer offers`, `gpulayer cost`, `gpulayer reap`, `gpulayer catalog`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from gpulayer.cli.output import print_json

catalog_app = typer.Typer(
    help="Price catalogs shipped with provider plugins.", no_args_is_help=True
)


def offers(
    gpu: list[str] = typer.Option(
        [], "--gpu", help="GPU model, e.g. A100, H100-80GB, L4 (repeatable: any of them)."
    ),
    gpus: Optional[int] = typer.Option(
        None, "--gpus", help="Exactly this many GPUs per machine (default: any number)."
    ),
    accelerator: Optional[str] = typer.Option(
        None, "--accelerator", help="cpu, cuda, mps or rocm."
    ),
    gpu_slices: bool = typer.Option(
        False, "--gpu-slices", help="List slices of one GPU (AWS g6f) too, as submit would rent."
    ),
    provider: list[str] = typer.Option([], "--provider", help="Only this provider (repeatable)."),
    region: list[str] = typer.Option([], "--region", help="Only this region (repeatable)."),
    max_hourly_cost: Optional[float] = typer.Option(
        None, "--max-hourly-cost", help="Cost cap per hour."
    ),
    file: Optional[Path] = typer.Option(
        None, "--file", "-f", help="Take the needs from a job file."
    ),
    enabled_only: bool = typer.Option(
        False, "--enabled-only", help="Only providers enabled in providers.yaml."
    ),
    limit: int = typer.Option(
        30, "--limit", "-n", min=0, help="How many offers to show; 0: all of them."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """Offers that fit, cheapest first, ranked by the control plane as submit ranks them.

    Every installed provider's catalog is listed, enabled or not, without credentials; rows
    of providers that are not enabled are marked, with the line that enables them."""
    from gpulayer.cli.spec_flags import SubmitFlags, apply_flags
    from gpulayer.sdk.connection import connect
    from gpulayer.spec.loader import load_spec_data
    from gpulayer.spec.validate import validate_spec

    base = load_spec_data(file) if file else {"workload": {"kind": "command", "command": ["true"]}}
    flags = SubmitFlags(
        accelerator=accelerator or ("cuda" if gpus and not file else None),
        gpus=gpus,
        gpu_models=gpu,
        gpu_slices=gpu_slices,
        max_hourly_cost=max_hourly_cost,
        providers=provider,
        regions=region,
    )
    spec = validate_spec(apply_flags(base, flags))
    from gpulayer.cli.cloud_env import cloud_credentials
    from gpulayer.cli.waiting import ASKING_CLOUDS, progress_after

    connection = connect(server)
    with progress_after(ASKING_CLOUDS.format(what="offers")):
        listing = connection.client.offers(
            spec.model_dump(mode="json"),
            # A file's gpu_count is what submit would rent; without one, list every count.
            gpu_count_exact=gpus is not None or bool(file),
            include_disabled=not enabled_only,
            limit=limit,
            names=_flag_names(gpu=gpu, region=region, provider=provider),
            client_env=cloud_credentials(connection),
        )
    if as_json:
        # The offers alone, each with "enabled" and "source"; why and what else go to stderr.
        print_json(listing["offers"])
    else:
        from gpulayer.cli.offers_view import offers_table

        offers_table(listing)
    for note in listing["notes"]:
        typer.echo(f"note: {note}", err=True)


def _flag_names(**given: list[str]) -> dict[str, str]:
    """Names given by a flag are refused under the flag's name; a file's under its field."""
    fields = {"gpu": "gpu_models", "region": "regions", "provider": "providers"}
    return {fields[flag]: f"--{flag}" for flag, values in given.items() if values}


def cost(
    job: Optional[str] = typer.Option(None, "--job", help="Only this job."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """What rented machines cost: per instance, per job, and in total."""
    from gpulayer.sdk.connection import connect

    ledger: dict[str, Any] = connect(server).client.request("GET", "/v1/cost", params={"job": job})
    if as_json:
        print_json(ledger)
        return
    from gpulayer.cli.render import cost_table

    cost_table(ledger)


def reap(
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be ended."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """End owned cloud instances that have no live job (a crashed controller's leftovers)."""
    from gpulayer.sdk.connection import connect

    ended = connect(server).client.request(
        "POST", "/v1/reap", params={"dry_run": str(dry_run).lower()}
    )
    if as_json:
        print_json(ended)
        return
    verb = "would end" if dry_run else "ended"
    for item in ended:
        name = item["instance_id"] or item["request_id"]
        typer.echo(f"{verb} {item['provider']} {name} (job {item['job_id']})")
    if not ended:
        typer.echo("nothing to reap")


@catalog_app.command("refresh")
def catalog_refresh(
    provider: str = typer.Argument(..., help="Provider whose price catalog to rebuild, e.g. aws."),
    region: list[str] = typer.Option(
        [], "--region", help="Region to refresh (repeatable; default: the configured ones)."
    ),
    source: str = typer.Option(
        "bulk",
        "--source",
        help="bulk: the public bulk price list (no credentials); api: the Pricing API.",
    ),
) -> None:
    """Rebuild a provider's catalog from its public price data."""
    from gpulayer.cloud.config import provider_settings
    from gpulayer.cloud.registry import catalog_refresher
    from gpulayer.control.paths import home
    from gpulayer.errors import UsageError

    if source not in ("bulk", "api"):
        raise UsageError(f"--source: bulk or api, not {source!r}")
    plugin = catalog_refresher(provider, provider_settings(home().root).get(provider, {}))
    from gpulayer.cli.waiting import progress_after
    from gpulayer.cloud.config import orchestrator_section

    wait = float(orchestrator_section(home().root)["cloud_wait_seconds"])
    with progress_after(f"reading {provider} prices") as progress:
        path = plugin.refresh_catalog(
            region or None,
            source="api" if source == "api" else "bulk",
            on_region=lambda name: progress.update(f"reading {provider} prices for {name}"),
            wait_seconds=wait,
        )
    typer.echo(f"catalog written to {path}")


def register(app: typer.Typer) -> None:
    for command in (offers, cost, reap):
        app.command()(command)
    app.add_typer(catalog_app, name="catalog")

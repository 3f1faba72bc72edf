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
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU model, e.g. A100, H100, L4."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs per machine."),
    accelerator: Optional[str] = typer.Option(
        None, "--accelerator", help="cpu, cuda, mps or rocm."
    ),
    provider: list[str] = typer.Option([], "--provider", help="Only this provider (repeatable)."),
    region: list[str] = typer.Option([], "--region", help="Only this region (repeatable)."),
    max_hourly_cost: Optional[float] = typer.Option(
        None, "--max-hourly-cost", help="Cost cap per hour."
    ),
    file: Optional[Path] = typer.Option(
        None, "--file", "-f", help="Take the needs from a job file."
    ),
    limit: int = typer.Option(30, "--limit", "-n", help="How many offers to show."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Priced offers from the enabled providers that fit, cheapest first."""
    from gpulayer.cli.spec_flags import SubmitFlags, apply_flags
    from gpulayer.cloud.config import enabled_providers
    from gpulayer.cloud.errors import ProviderError
    from gpulayer.cloud.offer import OfferQuery
    from gpulayer.cloud.ranking import describe_rejections, filter_offers, rank
    from gpulayer.control.paths import home
    from gpulayer.spec.loader import load_spec_data
    from gpulayer.spec.validate import validate_spec

    base = load_spec_data(file) if file else {"workload": {"kind": "command", "command": ["true"]}}
    flags = SubmitFlags(
        accelerator=accelerator or ("cuda" if (gpu or gpus) and not file else None),
        gpus=gpus,
        max_hourly_cost=max_hourly_cost,
        providers=provider,
        regions=region,
    )
    spec = validate_spec(apply_flags(base, flags))
    query = OfferQuery.from_spec(spec, gpu_name=gpu)
    found = []
    problems = []
    enabled = enabled_providers(home().root, tuple(spec.placement.providers))
    for name, plugin in enabled.items():
        try:
            found.extend(plugin.offers(query))
        except ProviderError as exc:
            problems.append(f"{name}: {exc}")
            if hasattr(plugin, "catalog_offers"):  # offline: what its catalog prices
                found.extend(plugin.catalog_offers(query))
                problems[-1] += "; showing its catalog's offers"
    disabled = _catalog_only_providers(spec.placement.providers, set(enabled))
    for plugin in disabled.values():
        found.extend(plugin.catalog_offers(query))
    result = filter_offers(
        rank(found),
        query,
        providers=spec.placement.providers,
        regions=spec.placement.regions,
        max_hourly_cost=spec.placement.max_hourly_cost,
        currency=spec.placement.currency,
    )
    shown = result.offers[:limit]
    if as_json:
        print_json(
            [{**o.model_dump(mode="json"), "enabled": o.provider not in disabled} for o in shown]
        )
    else:
        from gpulayer.cli.render import offers_table

        offers_table(shown, total=len(result.offers), disabled=set(disabled))
        if not result.offers and result.rejected:
            typer.echo(f"nothing fits: {describe_rejections(result.rejected)}", err=True)
    for problem in problems:
        typer.echo(f"warning: {problem}", err=True)


def _catalog_only_providers(named: list[str], enabled: set[str]) -> dict[str, Any]:
    """Installed providers named with --provider but not enabled in providers.yaml that can
    price offers from their catalog alone (no credentials): shown, marked not enabled."""
    from gpulayer.cloud.registry import available_providers, get_provider

    installed = set(available_providers())
    found = {}
    for name in named:
        if name in enabled or name not in installed:
            continue
        plugin = get_provider(name, {})
        if hasattr(plugin, "catalog_offers"):
            found[name] = plugin
    return found


def cost(
    job: Optional[str] = typer.Option(None, "--job", help="Only this job."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """What rented machines cost: per instance, per job, and in total."""
    from gpulayer.control.connect import connect

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
    from gpulayer.control.connect import connect

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
) -> None:
    """Rebuild a provider's price catalog from its APIs (needs credentials)."""
    from gpulayer.cloud.config import provider_settings
    from gpulayer.cloud.registry import get_provider
    from gpulayer.control.paths import home
    from gpulayer.errors import UsageError

    plugin = get_provider(provider, provider_settings(home().root).get(provider, {}))
    refresh = getattr(plugin, "refresh_catalog", None)
    if refresh is None:
        raise UsageError(f"PROVIDER: {provider} has no price catalog to refresh")
    typer.echo(f"catalog written to {refresh()}")


def register(app: typer.Typer) -> None:
    for command in (offers, cost, reap):
        app.command()(command)
    app.add_typer(catalog_app, name="catalog")

"""`gpulayer config check` and `gpulayer config show`: providers.yaml, validated whole."""

from __future__ import annotations

import typer

from gpulayer.cli.output import print_json

config_app = typer.Typer(
    help="Check and show providers.yaml (settings: docs/settings.md).", no_args_is_help=True
)


@config_app.command("check")
def config_check(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Validate providers.yaml whole, every section; exit 2 with one line per problem."""
    from gpulayer.cloud.config import check_config
    from gpulayer.control.paths import home

    checked = check_config(home().root)
    enabled = sorted(checked.providers)
    if as_json:
        print_json(
            {"path": str(checked.path), "exists": checked.exists, "valid": True, "enabled": enabled}
        )
        return
    if not checked.exists:
        typer.echo(f"{checked.path}: no such file; no provider is enabled (defaults apply)")
        return
    typer.echo(f"{checked.path}: valid; enabled: {', '.join(enabled) or 'none'}")


@config_app.command("show")
def config_show(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Print the settings in effect, every default filled in."""
    from gpulayer.cloud.config import check_config
    from gpulayer.control.paths import home

    checked = check_config(home().root)
    sections = checked.shown()
    if as_json:
        print_json(sections)
        return
    import yaml

    where = str(checked.path) if checked.exists else f"{checked.path} (no such file)"
    typer.echo(f"# {where}, defaults filled in")
    typer.echo(yaml.safe_dump(sections, sort_keys=False).rstrip())


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")

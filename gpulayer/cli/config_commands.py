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
    no_login: bool = typer.Option(
        False, "--no-login", help="Only validate the file; log into no host."
    ),
) -> None:
    """Validate providers.yaml whole, every section (exit 2 with one line per problem), then
    log into every ssh host and Slurm login node and check that its sshd accepts a key written
    where the job key goes (exit 1 when one does not)."""
    from gpulayer.cloud.config import check_config
    from gpulayer.cloud.key_check import check_all, configured_logins
    from gpulayer.control.paths import home

    checked = check_config(home().root)
    enabled = sorted(checked.providers)
    logins = check_all(configured_logins(checked)) if not no_login else []
    failed = any(not c.ok for c in logins)
    if as_json:
        print_json(
            {
                "path": str(checked.path),
                "exists": checked.exists,
                "valid": True,
                "enabled": enabled,
                "fleets": [fleet.name for fleet in checked.fleets],
                "logins": [{"name": c.name, "ok": c.ok, "problem": c.problem} for c in logins],
            }
        )
    elif not checked.exists:
        typer.echo(f"{checked.path}: no such file; no provider is enabled (defaults apply)")
    else:
        fleets = "".join(
            f"; fleet {f.name}: {f.min_nodes}..{f.most} machines" for f in checked.fleets
        )
        typer.echo(f"{checked.path}: valid; enabled: {', '.join(enabled) or 'none'}{fleets}")
        for check in logins:
            typer.echo(f"{check.name}: {check.problem or 'ok (the job key file is read)'}")
    if failed:
        raise typer.Exit(1)


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

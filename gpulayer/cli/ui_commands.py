"""`gpulayer ui`: open the control plane's web dashboard in the browser."""

from __future__ import annotations

from typing import Optional

import typer


def ui(
    no_browser: bool = typer.Option(
        False, "--no-browser", help="Print the one-time login URL instead of opening a browser."
    ),
    server: Optional[str] = typer.Option(None, "--server", help="Control plane URL."),
) -> None:
    """Open the web dashboard, logged in through a one-time link (valid once, for 2 minutes).

    The local control plane is started if it is not running."""
    from gpulayer.sdk.connection import connect

    client = connect(server).client
    link = client.request("POST", "/v1/ui/login-links")
    url = client.base_url + str(link["path"])
    if no_browser:
        typer.echo(url)
        return
    import webbrowser

    if webbrowser.open(url):
        typer.echo(f"opened the dashboard at {client.base_url}/ui/")
    else:
        typer.echo(f"no browser to open here; this login link works once: {url}")


def register(app: typer.Typer) -> None:
    app.command()(ui)

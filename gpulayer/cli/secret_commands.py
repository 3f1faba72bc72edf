"""`gpulayer secret set|ls|rm`: the control plane's secret store. A value is read from stdin
(a prompt that does not echo at a terminal), never from argv, and is never printed back."""

from __future__ import annotations

import sys
from typing import Optional
from urllib.parse import quote

import typer

from gpulayer.cli.output import print_json

secret_app = typer.Typer(
    help="Keep secrets on the control plane, for the jobs that name them.", no_args_is_help=True
)

ServerFlag = typer.Option(None, "--server", help="Control plane URL ($GPULAYER_SERVER).")


@secret_app.command("set")
def secret_set(
    name: str = typer.Argument(..., help="The name jobs give in `secrets` (or `--secret`)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = ServerFlag,
) -> None:
    """Keep a secret, its value read from stdin; a job that names it gets it when it starts."""
    from gpulayer.errors import UsageError
    from gpulayer.sdk.connection import connect

    if sys.stdin.isatty():
        import getpass

        value = getpass.getpass(f"value of {name}: ")
    else:
        value = sys.stdin.read()
        if value.endswith("\n"):  # what `echo` and a file's last line add
            value = value[:-1]
    if not value:
        raise UsageError("stdin: empty; give the secret's value on stdin")
    reply = connect(server_url).client.request(
        "PUT", f"/v1/secrets/{quote(name, safe='')}", {"value": value}
    )
    if as_json:
        print_json(reply)
    else:
        typer.echo(f"{'kept' if reply['created'] else 'replaced'} secret {name}")


@secret_app.command("ls")
def secret_ls(
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = ServerFlag,
) -> None:
    """The secrets kept (their names and times, never their values)."""
    from gpulayer.sdk.connection import connect

    listed = connect(server_url).client.request("GET", "/v1/secrets")
    if as_json:
        print_json(listed)
        return
    from gpulayer.cli.render import secret_table

    secret_table(listed)


@secret_app.command("rm")
def secret_rm(
    name: str = typer.Argument(..., help="The secret's name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = ServerFlag,
) -> None:
    """Remove a secret; jobs that name it then read it from their worker's environment."""
    from gpulayer.sdk.connection import connect

    reply = connect(server_url).client.request("DELETE", f"/v1/secrets/{quote(name, safe='')}")
    if as_json:
        print_json(reply)
    else:
        typer.echo(f"removed secret {name}")


def register(app: typer.Typer) -> None:
    app.add_typer(secret_app, name="secret")

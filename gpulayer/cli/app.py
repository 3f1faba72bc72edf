"""The typer application and the entry point that turns typed errors into exit codes."""

from __future__ import annotations

import sys

import typer

from gpulayer.cli import (
    attach_commands,
    cleanup_commands,
    cloud_commands,
    config_commands,
    instance_commands,
    job_commands,
    schedule_commands,
    secret_commands,
    server_commands,
    spec_commands,
    ui_commands,
)
from gpulayer.cli.exits import leave_with
from gpulayer.errors import GpulayerError

app = typer.Typer(
    name="gpulayer",
    help="Run ML jobs wherever the right GPU is: here, on registered workers, or in a cloud.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: rendering it with rich costs more than all else at start
    context_settings={"help_option_names": ["-h", "--help"]},
)

job_commands.register(app)
server_commands.register(app)
secret_commands.register(app)
attach_commands.register(app)
cloud_commands.register(app)
instance_commands.register(app)
spec_commands.register(app)
ui_commands.register(app)
schedule_commands.register(app)
cleanup_commands.register(app)
config_commands.register(app)


def main() -> None:
    from typer._click.exceptions import ClickException, NoArgsIsHelpError

    try:
        outcome = app(standalone_mode=False)
        if isinstance(outcome, int) and outcome:
            sys.exit(outcome)
    except NoArgsIsHelpError as exc:
        exc.show()
        sys.exit(0)
    except ClickException as exc:
        # One line naming the flag, rather than a framed usage box.
        print(f"error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except (GpulayerError, KeyboardInterrupt) as exc:
        leave_with(exc)

"""`gpulayer server`, `gpulayer worker start` and `gpulayer token create`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from gpulayer.cli.output import print_json
from gpulayer.cli.worker_flag_options import (
    AddressFlag,
    AttemptDiskQuotaFlag,
    CurrencyFlag,
    DeadmanActionFlag,
    DeadmanSecondsFlag,
    HeartbeatSecondsFlag,
    HourlyPriceFlag,
    InstanceRequestIdFlag,
    KeepAttemptsFlag,
    KindFlag,
    LabelFlag,
    MaxOutputFileBytesFlag,
    NameFlag,
    ProviderFlag,
    RegionFlag,
    RequireIsolationFlag,
    RunAsFlag,
    RunAsRangeFlag,
    ServerUrlFlag,
    SetupCacheFlag,
    TokenFileFlag,
    WorkDirFlag,
    ZoneFlag,
)

TOKEN_LIFETIME_MAX_SECONDS = 10 * 365.25 * 86400
"""The server's bound on a token's expiry (TokenRequest), said here in the flag's words."""

worker_app = typer.Typer(
    help="Run a worker that takes jobs from a control plane.", no_args_is_help=True
)
token_app = typer.Typer(help="Manage API tokens of a server.", no_args_is_help=True)


server_app = typer.Typer(
    help="Run the team control plane (with options), or manage the local one "
    "(status, stop, restart).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@server_app.callback()
def server(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8765, "--port", help="Port to listen on."),
    database_url: Optional[str] = typer.Option(
        None, "--database-url", help="SQLAlchemy URL (default: SQLite in the gpulayer home)."
    ),
    heartbeat_timeout: float = typer.Option(
        30.0, "--heartbeat-timeout", help="Seconds of silence before a worker counts as lost."
    ),
    max_log_bytes: Optional[str] = typer.Option(
        None,
        "--max-log-bytes",
        help="Output kept per job, newest first (default 1GiB, or $GPULAYER_MAX_LOG_BYTES).",
    ),
    max_output_files: Optional[int] = typer.Option(
        None,
        "--max-output-files",
        help="Files one outputs upload may hold (default 10000, or $GPULAYER_MAX_OUTPUT_FILES).",
    ),
    max_output_bytes: Optional[str] = typer.Option(
        None,
        "--max-output-bytes",
        help="Bytes one outputs upload may expand to (default 20GiB, or "
        "$GPULAYER_MAX_OUTPUT_BYTES).",
    ),
    max_output_ratio: Optional[float] = typer.Option(
        None,
        "--max-output-ratio",
        help="How many times its compressed size an outputs upload may expand to, past 64 MiB "
        "(default 200, or $GPULAYER_MAX_OUTPUT_RATIO).",
    ),
) -> None:
    """Run the team control plane: a queue that registered workers take jobs from.

    `gpulayer server status|stop|restart` manage the local control plane that commands start
    on demand instead."""
    if ctx.invoked_subcommand is not None:
        return
    import logging

    from gpulayer.control.paths import home
    from gpulayer.control.server import run_server

    if not 0 < port < 65536:
        raise typer.BadParameter("must be 1-65535", param_hint="--port")
    if heartbeat_timeout <= 0:
        raise typer.BadParameter("must be > 0", param_hint="--heartbeat-timeout")
    from gpulayer.control.log_cap import MAX_LOG_BYTES_ENV, parse_byte_size

    size_text = max_log_bytes or os.environ.get(MAX_LOG_BYTES_ENV)
    cap = parse_byte_size(size_text) if size_text else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_server(
        home(),
        host=host,
        port=port,
        database_url=database_url,
        heartbeat_timeout=heartbeat_timeout,
        max_log_bytes=cap,
        max_output_files=max_output_files,
        max_output_bytes=max_output_bytes,
        max_output_ratio=max_output_ratio,
    )


@worker_app.command("start")
def worker_start(
    server_url: ServerUrlFlag = None,
    token_file: TokenFileFlag = None,
    run_as: RunAsFlag = None,
    run_as_range: RunAsRangeFlag = None,
    require_isolation: RequireIsolationFlag = False,
    max_output_file_bytes: MaxOutputFileBytesFlag = 10 * 1024**3,
    name: NameFlag = None,
    address: AddressFlag = None,
    label: LabelFlag = [],  # noqa: B006 (typer copies the default; it is never mutated)
    work_dir: WorkDirFlag = None,
    setup_cache: SetupCacheFlag = None,
    keep_attempts: KeepAttemptsFlag = 0.0,
    attempt_disk_quota: AttemptDiskQuotaFlag = None,
    heartbeat_seconds: HeartbeatSecondsFlag = 5.0,
    kind: KindFlag = "remote",
    provider: ProviderFlag = None,
    region: RegionFlag = None,
    zone: ZoneFlag = None,
    hourly_price: HourlyPriceFlag = None,
    currency: CurrencyFlag = "USD",
    deadman_seconds: DeadmanSecondsFlag = None,
    deadman_action: DeadmanActionFlag = "stop",
    instance_request_id: InstanceRequestIdFlag = None,
) -> None:
    """Register this machine with a control plane and run the jobs it assigns, until stopped."""
    from gpulayer.cli.spec_flags import parse_pairs
    from gpulayer.control.paths import home
    from gpulayer.errors import UsageError
    from gpulayer.worker import WorkerOptions, run_worker

    server_url = server_url or os.environ.get("GPULAYER_SERVER")
    if not server_url:
        raise UsageError("--server: the control plane URL is required (or set GPULAYER_SERVER)")
    token = _join_token(token_file)
    labels = parse_pairs(label, "--label")
    if kind not in ("remote", "cloud"):
        raise UsageError(f"--kind: remote or cloud, not {kind!r}")
    options = WorkerOptions(
        server_url=server_url,
        token=token,
        home_root=home().ensure().root,
        name=name,
        kind="cloud" if kind == "cloud" else "remote",
        labels=labels,
        work_dir=work_dir,
        address=address,
        heartbeat_seconds=heartbeat_seconds,
        run_as=run_as,
        run_as_range=run_as_range,
        require_isolation=require_isolation,
        max_output_file_bytes=max_output_file_bytes,
        provider=provider,
        region=region,
        zone=zone,
        hourly_price=hourly_price,
        currency=currency,
        deadman_seconds=deadman_seconds,
        deadman_action=deadman_action,
        instance_request_id=instance_request_id,
        setup_cache=setup_cache,
        keep_attempts_hours=keep_attempts,
        attempt_disk_quota=_quota_bytes(attempt_disk_quota),
    )
    code = run_worker(options)
    if code:
        raise typer.Exit(code)


def _quota_bytes(text: str | None) -> int:
    from gpulayer.control.log_cap import parse_byte_size

    if text is None:
        return 0
    size = parse_byte_size(text, "--attempt-disk-quota")
    if size < 16 << 20:
        from gpulayer.errors import UsageError

        raise UsageError("--attempt-disk-quota: at least 16MiB (an ext4 filesystem's smallest)")
    return size


def _join_token(token_file: Path | None) -> str:
    from gpulayer.errors import UsageError

    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--token-file: cannot read {token_file}: {exc.strerror}") from None
        if not token:
            raise UsageError(f"--token-file: {token_file} holds no token")
        return token
    from_env = os.environ.get("GPULAYER_TOKEN")
    if not from_env:
        raise UsageError("--token-file: a join token is required (or set GPULAYER_TOKEN)")
    return from_env


@token_app.command("create")
def token_create(
    worker: bool = typer.Option(
        False, "--worker", help="A join token: register workers, nothing else."
    ),
    name: str = typer.Option("", "--name", help="A note to remember the token by."),
    max_workers: Optional[int] = typer.Option(
        None, "--max-workers", help="How many workers this join token may register at most."
    ),
    expires: Optional[str] = typer.Option(
        None, "--expires", help="Refuse the token after this long (e.g. 30m, 12h, 7d)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = typer.Option(
        None, "--server", help="Control plane URL ($GPULAYER_SERVER)."
    ),
) -> None:
    """Create a token on the server and print it (it is not shown again)."""
    import time

    from gpulayer.cli.durations import parse_duration
    from gpulayer.errors import UsageError
    from gpulayer.sdk.connection import connect

    if max_workers is not None and not worker:
        raise UsageError("--max-workers: only a join token (--worker) registers workers")
    if max_workers is not None and max_workers < 1:
        raise UsageError("--max-workers: must be at least 1")
    body: dict[str, object] = {"kind": "worker" if worker else "admin", "name": name}
    if max_workers is not None:
        body["max_workers"] = max_workers
    if expires is not None:
        lifetime = parse_duration(expires, "--expires")
        if lifetime > TOKEN_LIFETIME_MAX_SECONDS:
            raise UsageError("--expires: at most ten years (3652d)")
        body["expires_at"] = time.time() + lifetime
    connection = connect(server_url)
    reply = connection.client.request("POST", "/v1/tokens", body)
    if as_json:
        print_json(reply)
    else:
        typer.echo(reply["token"])


@token_app.command("ls")
def token_ls(
    all_kinds: bool = typer.Option(
        False, "--all", help="Also each worker's own credential (made when it registered)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = typer.Option(
        None, "--server", help="Control plane URL ($GPULAYER_SERVER)."
    ),
) -> None:
    """List the server's tokens (never the tokens themselves)."""
    from gpulayer.cli.render import token_table
    from gpulayer.sdk.connection import connect

    connection = connect(server_url)
    tokens = connection.client.request("GET", "/v1/tokens", params={"all_kinds": all_kinds})
    if as_json:
        print_json(tokens)
    else:
        token_table(tokens)


@token_app.command("revoke")
def token_revoke(
    token_id: str = typer.Argument(..., metavar="ID", help="The token's id (from token ls)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    server_url: Optional[str] = typer.Option(
        None, "--server", help="Control plane URL ($GPULAYER_SERVER)."
    ),
) -> None:
    """Refuse a token from its next call on; a join token's workers lose their credentials too."""
    from urllib.parse import quote

    from gpulayer.sdk.connection import connect

    connection = connect(server_url)
    reply = connection.client.request("POST", f"/v1/tokens/{quote(token_id, safe='')}/revoke")
    if as_json:
        print_json(reply)
    else:
        typer.echo(f"revoked {token_id} ({reply['revoked']} token(s) refused from now on)")


def register(app: typer.Typer) -> None:
    from gpulayer.cli.local_server_commands import register_local

    register_local(server_app)
    app.add_typer(server_app, name="server")
    app.add_typer(worker_app, name="worker")
    app.add_typer(token_app, name="token")

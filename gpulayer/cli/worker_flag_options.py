"""The flags of `gpulayer worker start`, declared as typer Annotated types: the command's
signature then fits on a screen (and within the size limit), each flag's words stay here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ServerUrlFlag = Annotated[
    Optional[str], typer.Option("--server", help="Control plane URL ($GPULAYER_SERVER).")
]
TokenFileFlag = Annotated[
    Optional[Path],
    typer.Option(
        "--token-file",
        help="File holding the join token (else $GPULAYER_TOKEN); no token goes in argv.",
    ),
]
RunAsFlag = Annotated[
    Optional[str],
    typer.Option("--run-as", help="Run jobs as this unprivileged user (the worker runs as root)."),
]
RunAsRangeFlag = Annotated[
    Optional[str],
    typer.Option(
        "--run-as-range",
        help="FIRST-LAST: run each attempt as a uid of its own from this range (the worker "
        "runs as root; no account may hold these uids).",
    ),
]
RequireIsolationFlag = Annotated[
    bool,
    typer.Option(
        "--require-isolation",
        help="Refuse to start unless each attempt runs as a uid of its own (--run-as-range): "
        "not where jobs would run as this worker's own user (and could read its credential), "
        "nor as one --run-as user they all share.",
    ),
]
MaxOutputFileBytesFlag = Annotated[
    int,
    typer.Option(
        "--max-output-file-bytes",
        help="Output files larger than this are not uploaded (a line in the job's log says so).",
    ),
]
NameFlag = Annotated[
    Optional[str], typer.Option("--name", help="Worker name (default: host name).")
]
AddressFlag = Annotated[
    Optional[str],
    typer.Option(
        "--address",
        help="Address the other nodes of a multi-node job reach this worker on "
        "(default: this machine's address on the route to the control plane).",
    ),
]
LabelFlag = Annotated[
    list[str], typer.Option("--label", help="K=V label jobs can pin to (repeatable).")
]
WorkDirFlag = Annotated[
    Optional[Path],
    typer.Option(
        "--work-dir",
        help="Where attempts run (default: HOME/worker-jobs; with --run-as or --run-as-range, "
        "/var/lib/gpulayer/worker-jobs-ID, prepared so the jobs' users can reach it).",
    ),
]
SetupCacheFlag = Annotated[
    Optional[Path],
    typer.Option(
        "--setup-cache",
        help="Where jobs' setup environments are kept for later jobs "
        "(default: WORK_DIR/.setup-envs).",
    ),
]
KeepAttemptsFlag = Annotated[
    float,
    typer.Option(
        "--keep-attempts",
        help="Keep each finished attempt's folder this many HOURS (default 0: removed once its "
        "outputs are stored).",
        metavar="HOURS",
    ),
]
AttemptDiskQuotaFlag = Annotated[
    Optional[str],
    typer.Option(
        "--attempt-disk-quota",
        help="Make each attempt's folder a filesystem of this SIZE of its own (such as 20GiB; "
        "root, a loop-mounted ext4 image): a job cannot fill the worker's disk.",
        metavar="SIZE",
    ),
]
HeartbeatSecondsFlag = Annotated[
    float, typer.Option("--heartbeat-seconds", help="Heartbeat interval.")
]
KindFlag = Annotated[
    str, typer.Option("--kind", help="remote, or cloud for a machine rented for a job.")
]
ProviderFlag = Annotated[
    Optional[str], typer.Option("--provider", help="Provider this machine came from.")
]
RegionFlag = Annotated[Optional[str], typer.Option("--region", help="Region of this machine.")]
ZoneFlag = Annotated[Optional[str], typer.Option("--zone", help="Zone of this machine.")]
HourlyPriceFlag = Annotated[
    Optional[float], typer.Option("--hourly-price", help="What this machine costs per hour.")
]
CurrencyFlag = Annotated[str, typer.Option("--currency", help="Currency of --hourly-price.")]
DeadmanSecondsFlag = Annotated[
    Optional[float],
    typer.Option(
        "--deadman-seconds", help="End jobs and act after this long without the control plane."
    ),
]
DeadmanActionFlag = Annotated[
    str,
    typer.Option(
        "--deadman-action", help="poweroff (cloud instances), stop, or record:PATH (tests)."
    ),
]
InstanceRequestIdFlag = Annotated[
    Optional[str],
    typer.Option(
        "--instance-request-id",
        help="The launch request of the instance this worker runs on (set by cloud bootstrap).",
    ),
]

"""What `gpulayer submit` does once its flags are read, with no CLI framework in the way:
the typer command and the fast path (fast_submit) both end here."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpulayer.cli.spec_flags import SubmitFlags


def run_submit(
    *,
    file: Path | None,
    detach: bool,
    server: str | None,
    flags: SubmitFlags,
    array: str | None = None,
    dry_run: bool = False,
    as_json: bool = False,
) -> int:
    """Submit; with detach print the id and return, else stream the job. The exit code.
    With ``dry_run`` print where it would run and why instead, creating nothing."""
    with flags_named(flags):
        return _submit(
            file=file,
            detach=detach,
            server=server,
            flags=flags,
            array=array,
            dry_run=dry_run,
            as_json=as_json,
        )


@contextlib.contextmanager
def flags_named(flags: SubmitFlags, *, under: str = "") -> Iterator[None]:
    """A refusal of a field a flag set names the flag typed, here or from the control plane."""
    from gpulayer.errors import SpecError

    try:
        yield
    except SpecError as exc:
        from gpulayer.cli.spec_flags import name_flags

        raise SpecError(name_flags(exc.lines, flags, under=under)) from None


def _submit(
    *,
    file: Path | None,
    detach: bool,
    server: str | None,
    flags: SubmitFlags,
    array: str | None,
    dry_run: bool,
    as_json: bool,
) -> int:
    from gpulayer.sdk.connection import connect

    tasks = None
    if array is not None:
        from gpulayer.cli.job_arrays import parse_array

        tasks = parse_array(array)  # bad input fails before anything is read or sent
    data = job_data(file, flags)
    connection = connect(server)
    if dry_run:
        from gpulayer.cli.plan_view import show_plan, would_refuse

        # An array's jobs differ only by their index: one plan holds for each.
        planned = plan_job_data(connection, data)
        show_plan(planned, as_json=as_json)
        return 1 if would_refuse(planned) else 0
    if tasks is not None:
        from gpulayer.cli.job_arrays import submit_array

        return submit_array(connection, data, tasks, detach=detach)
    from gpulayer.cli.submit_flow import describe_end, exit_code_of, send_job, stream_until_done
    from gpulayer.cli.waiting import progress_after

    # A gang's offers are searched before it is accepted, which may take the providers' time.
    with progress_after("waiting for the control plane to accept the job"):
        job = send_job(connection, data)
    for warning in job.get("warnings", []):
        sys.stderr.write(f"warning: {warning}\n")
    if detach:
        print(job["id"], flush=True)
        if job["state"] == "failed":
            sys.stderr.write(f"error: {describe_end(job)}\n")
            return 1
        return 0
    final = stream_until_done(connection.client, job["id"])
    ending = describe_end(final)
    if ending:
        sys.stderr.write(f"gpulayer: {ending}\n")
    return exit_code_of(final)


def job_data(file: Path | None, flags: SubmitFlags) -> dict[str, Any]:
    """The job's spec data from its file (if any) and submit's flags, paths made absolute
    (a file's relative to its folder, a flag's to the current one)."""
    from gpulayer.cli.spec_flags import apply_flags
    from gpulayer.sdk.paths import absolutize_paths

    base = None
    if file is not None:
        from gpulayer.spec.loader import load_spec_data

        base = absolutize_paths(load_spec_data(file), str(file.resolve().parent))
    return absolutize_paths(apply_flags(base, flags), os.getcwd())


def plan_job_data(connection: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The control plane's plan for ``data``; the local one also checks, as a submit would,
    that the job's local inputs are there."""
    from gpulayer.cli.cloud_env import cloud_credentials
    from gpulayer.cli.waiting import ASKING_CLOUDS, progress_after

    working_dir = os.getcwd() if connection.embedded else None
    with progress_after(ASKING_CLOUDS.format(what="offers for the plan")):
        result: dict[str, Any] = connection.client.plan(
            data, working_dir=working_dir, client_env=cloud_credentials(connection)
        )
    return result

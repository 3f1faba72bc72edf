"""Which folders a create may name: only the local control plane, which runs as the person who
calls it on their own machine, reads a folder a client names (``source_dir``, or the
``working_dir`` a job's source is taken from). A team server runs with its own rights on its
own machine, where such a path names the server's files (its SSH keys, its store): there a
job's source travels only as a bundle the client uploaded."""

from __future__ import annotations

from gpulayer.errors import UsageError


def refuse_client_paths(
    *,
    embedded: bool,
    working_dir: str | None,
    source_dir: str | None,
    has_bundle: bool,
    where: str = "",
) -> None:
    """Raise UsageError naming the field when a team server would read a client's path.
    ``where``: how the request names this job (``jobs[3].``)."""
    if embedded:
        return
    if source_dir is not None:
        raise UsageError(f"{where}source_dir: only the local control plane reads local directories")
    if working_dir is not None and not has_bundle:
        raise UsageError(
            f"{where}working_dir: a team server reads no folder a client names; send the "
            "source as a bundle (bundle_id)"
        )

"""Local paths in spec data, made absolute before the data leaves this process."""

from __future__ import annotations

from typing import Any


def is_local_artifact(artifact: str) -> bool:
    # An empty artifact names no file: the spec refuses it, and made absolute it would name
    # the base folder itself, which `submit` then staged whole where `validate` refused it.
    return bool(artifact) and "://" not in artifact and not artifact.startswith("job:")


def absolutize_paths(data: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """Make local paths absolute against base_dir: the job file's folder, or the cwd for flags.

    The control plane runs elsewhere (another process, maybe another machine), so a relative
    path would mean something else there. No value changes validity here: the control plane
    judges the spec as `gpulayer validate` judges the file (an empty artifact stays empty).
    """
    import os.path

    workload = data.get("workload")
    if isinstance(workload, dict) and isinstance(workload.get("source"), str):
        workload["source"] = os.path.normpath(
            os.path.join(base_dir, os.path.expanduser(workload["source"]))
        )
    for item in data.get("inputs") or []:
        if (
            isinstance(item, dict)
            and isinstance(item.get("artifact"), str)
            and is_local_artifact(item["artifact"])
        ):
            item["artifact"] = os.path.normpath(
                os.path.join(base_dir, os.path.expanduser(item["artifact"]))
            )
    return data

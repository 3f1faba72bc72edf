"""gpulayer: run ML jobs wherever the right GPU is.

Public names are loaded on first use so that ``import gpulayer`` (and so the CLI) stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "JobSpec": "gpulayer.spec",
    "API_VERSION": "gpulayer.spec",
    "PROFILES": "gpulayer.spec",
    "Job": "gpulayer.sdk.job",
    "JobBuilder": "gpulayer.sdk.builders",
    "JobFailed": "gpulayer.sdk.job",
    "JobTimeout": "gpulayer.sdk.job",
    "command": "gpulayer.sdk.builders",
    "distributed": "gpulayer.sdk.builders",
    "function": "gpulayer.sdk.builders",
    "launch": "gpulayer.sdk.launch",
    "launch_many": "gpulayer.sdk.launch",
    "remote": "gpulayer.sdk.remote",
    "Trainer": "gpulayer.sdk.trainer",
    "TrainResult": "gpulayer.sdk.trainer",
    "train": "gpulayer.sdk",
    "schedule": "gpulayer.sdk.schedule",
    "Schedule": "gpulayer.sdk.schedule",
    "ScheduleSkipped": "gpulayer.sdk.schedule",
    "Cron": "gpulayer.schedules.model",
}

if TYPE_CHECKING:
    # From the defining modules: gpulayer.sdk.launch and .remote are also module names, and
    # mypy, depending on the order it reads modules in, took the name for the module.
    from gpulayer.schedules.model import Cron
    from gpulayer.sdk import train
    from gpulayer.sdk.builders import JobBuilder, command, distributed, function
    from gpulayer.sdk.job import Job, JobFailed, JobTimeout
    from gpulayer.sdk.launch import launch, launch_many
    from gpulayer.sdk.remote import remote
    from gpulayer.sdk.schedule import Schedule, ScheduleSkipped, schedule
    from gpulayer.sdk.trainer import Trainer, TrainResult
    from gpulayer.spec import API_VERSION, PROFILES, JobSpec


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpulayer' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "API_VERSION",
    "PROFILES",
    "Cron",
    "Job",
    "JobBuilder",
    "JobFailed",
    "JobSpec",
    "JobTimeout",
    "Schedule",
    "ScheduleSkipped",
    "TrainResult",
    "Trainer",
    "__version__",
    "command",
    "distributed",
    "function",
    "launch",
    "launch_many",
    "remote",
    "schedule",
    "train",
]

"""The Python SDK: builders, launch(), @remote and the Job handle.

Names are loaded on first use: a CLI submit imports only what it needs (the schedules, the
Trainer and the message models stay unloaded unless asked for).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Cron": "gpulayer.schedules.model",
    "train": "gpulayer.sdk.train",
    "JobBuilder": "gpulayer.sdk.builders",
    "command": "gpulayer.sdk.builders",
    "distributed": "gpulayer.sdk.builders",
    "function": "gpulayer.sdk.builders",
    "Job": "gpulayer.sdk.job",
    "JobFailed": "gpulayer.sdk.job",
    "JobTimeout": "gpulayer.sdk.job",
    "launch": "gpulayer.sdk.launch",
    "launch_many": "gpulayer.sdk.launch",
    "RemoteFunction": "gpulayer.sdk.remote",
    "remote": "gpulayer.sdk.remote",
    "Schedule": "gpulayer.sdk.schedule",
    "ScheduleSkipped": "gpulayer.sdk.schedule",
    "schedule": "gpulayer.sdk.schedule",
    "Trainer": "gpulayer.sdk.trainer",
    "TrainResult": "gpulayer.sdk.trainer",
}

if TYPE_CHECKING:
    from gpulayer.schedules.model import Cron
    from gpulayer.sdk import train
    from gpulayer.sdk.builders import JobBuilder, command, distributed, function
    from gpulayer.sdk.job import Job, JobFailed, JobTimeout
    from gpulayer.sdk.launch import launch, launch_many
    from gpulayer.sdk.remote import RemoteFunction, remote
    from gpulayer.sdk.schedule import Schedule, ScheduleSkipped, schedule
    from gpulayer.sdk.trainer import Trainer, TrainResult


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpulayer.sdk' has no attribute {name!r}")
    loaded = import_module(module)
    value = loaded if name == "train" else getattr(loaded, name)
    globals()[name] = value
    return value


__all__ = [
    "Cron",
    "Job",
    "JobBuilder",
    "JobFailed",
    "JobTimeout",
    "RemoteFunction",
    "Schedule",
    "ScheduleSkipped",
    "TrainResult",
    "Trainer",
    "command",
    "distributed",
    "function",
    "launch",
    "launch_many",
    "remote",
    "schedule",
    "train",
]

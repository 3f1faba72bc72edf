"""The Python SDK: builders, launch(), @remote and the Job handle."""

from gpulayer.schedules.model import Cron
from gpulayer.sdk.builders import JobBuilder, command, distributed, function
from gpulayer.sdk.job import Job, JobFailed, JobTimeout
from gpulayer.sdk.launch import launch
from gpulayer.sdk.remote import RemoteFunction, remote
from gpulayer.sdk.schedule import Schedule, ScheduleSkipped, schedule

__all__ = [
    "Cron",
    "Job",
    "JobBuilder",
    "JobFailed",
    "JobTimeout",
    "RemoteFunction",
    "Schedule",
    "ScheduleSkipped",
    "command",
    "distributed",
    "function",
    "launch",
    "remote",
    "schedule",
]

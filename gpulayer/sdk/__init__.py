"""The Python SDK: builders, launch(), @remote and the Job handle."""

from gpulayer.sdk.builders import JobBuilder, command, distributed, function
from gpulayer.sdk.job import Job, JobFailed, JobTimeout
from gpulayer.sdk.launch import launch
from gpulayer.sdk.remote import RemoteFunction, remote

__all__ = [
    "Job",
    "JobBuilder",
    "JobFailed",
    "JobTimeout",
    "RemoteFunction",
    "command",
    "distributed",
    "function",
    "launch",
    "remote",
]

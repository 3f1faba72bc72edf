"""The Python SDK: builders, launch(), @remote and the Job handle."""

from gpulayer.sdk import train
from gpulayer.sdk.builders import JobBuilder, command, distributed, function
from gpulayer.sdk.job import Job, JobFailed, JobTimeout
from gpulayer.sdk.launch import launch
from gpulayer.sdk.remote import RemoteFunction, remote
from gpulayer.sdk.trainer import Trainer, TrainResult

__all__ = [
    "Job",
    "JobBuilder",
    "JobFailed",
    "JobTimeout",
    "RemoteFunction",
    "TrainResult",
    "Trainer",
    "command",
    "distributed",
    "function",
    "launch",
    "remote",
    "train",
]

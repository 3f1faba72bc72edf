"""The JobSpec contract. Pure: models, profiles and validation, no I/O but reading files."""

from gpulayer.spec.models import (
    API_VERSION,
    CommandWorkload,
    DistributedWorkload,
    FunctionWorkload,
    InputRef,
    JobSpec,
    PlacementPolicy,
    Provisioning,
    Rendezvous,
    ResourceRequest,
    RetryPolicy,
    SecretRef,
)
from gpulayer.spec.profiles import PROFILES, Profile

__all__ = [
    "API_VERSION",
    "PROFILES",
    "CommandWorkload",
    "DistributedWorkload",
    "FunctionWorkload",
    "InputRef",
    "JobSpec",
    "PlacementPolicy",
    "Profile",
    "Provisioning",
    "Rendezvous",
    "ResourceRequest",
    "RetryPolicy",
    "SecretRef",
]

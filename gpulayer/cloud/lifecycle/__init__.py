"""Rented instances as records with a state table, driven by one reconciler loop.

``attach_lifecycle`` gives a control plane its cloud side; see :mod:`.reconciler`.
"""

from __future__ import annotations

from gpulayer.cloud.lifecycle.attach import attach_lifecycle, owner_id
from gpulayer.cloud.lifecycle.reconciler import Reconciler
from gpulayer.cloud.lifecycle.states import GONE, STATES, TRANSITIONS, check_transition

__all__ = [
    "GONE",
    "STATES",
    "TRANSITIONS",
    "Reconciler",
    "attach_lifecycle",
    "check_transition",
    "owner_id",
]

"""Rented instances as records with a state table, driven by one reconciler loop.

The control plane attaches it (``gpulayer.control.cloud_attach``) through the interface of
:mod:`.ports`; see :mod:`.reconciler`.
"""

from __future__ import annotations

from gpulayer.cloud.lifecycle.reconciler import Reconciler
from gpulayer.cloud.lifecycle.states import GONE, STATES, TRANSITIONS, check_transition

__all__ = [
    "GONE",
    "STATES",
    "TRANSITIONS",
    "Reconciler",
    "check_transition",
]

"""Rented instances as records with a state table, driven by one reconciler loop.

The control plane attaches it (``gpulayer.control.cloud_attach``) through the interface of
:mod:`.ports`; see :mod:`.reconciler`. Nothing is imported here: the store reads the instance
record's shape (:mod:`.records`) without loading the reconciler.
"""

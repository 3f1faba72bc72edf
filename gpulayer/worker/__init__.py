"""The worker: takes assignments from a control plane over the worker protocol and runs them.

Its one entry is run_worker(WorkerOptions) (a remote or cloud worker, as `gpulayer worker
start` runs it) and start_local_worker (the embedded control plane's own worker); the rest of
the package is how it does that.
"""

from gpulayer.worker.entry import WorkerOptions, run_worker, start_local_worker

__all__ = ["WorkerOptions", "run_worker", "start_local_worker"]

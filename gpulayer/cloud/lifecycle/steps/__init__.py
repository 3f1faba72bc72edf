"""The lifecycle's steps, one module each: launch, prepare (wait for SSH, bootstrap), reconnect,
check, drain, terminate, reap, and the plan that records a waiting job's next offer. Each does
its I/O through a :class:`~.context.StepContext` and returns a
:class:`~gpulayer.cloud.lifecycle.step_result.StepResult`: what it found, as data, read into
moves by the pure functions of :mod:`gpulayer.cloud.lifecycle.results`. The reconciler starts
them (its pass decides which), stores each result with its instance, and never waits on one.
"""

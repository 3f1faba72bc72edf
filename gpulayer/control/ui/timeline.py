"""A job's life in phases (queued, provisioning, running, teardown), from its records. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpulayer.cloud.lifecycle.phases import Transition
from gpulayer.cloud.lifecycle.phases import phases as history_phases
from gpulayer.control.store import AttemptRecord, InstanceRecord, JobRecord


def job_segments(
    job: JobRecord,
    attempts: Sequence[AttemptRecord],
    instances: Sequence[InstanceRecord],
    now: float,
    setup_spans: Mapping[int, tuple[float, float]] | None = None,
) -> list[tuple[str, float, float]]:
    """(phase, start, end) in time order; open phases end now. ``setup_spans`` (attempt
    number -> first and last setup line) splits an attempt's run into setup, then running."""
    finished = job.finished_at if job.finished_at is not None else now
    starts = [i.created_at for i in instances] + [a.started_at or a.created_at for a in attempts]
    queued_until = min([*starts, finished])
    segments: list[tuple[str, float, float]] = []
    if queued_until > job.created_at:
        segments.append(("queued", job.created_at, queued_until))
    for instance in instances:
        ready = instance.ready_at or instance.ended_at or finished
        segments.append(("provisioning", instance.created_at, max(ready, instance.created_at)))
    for attempt in attempts:
        if attempt.started_at is None:
            continue
        stop = attempt.finished_at or (finished if job.terminal else now)
        begin = attempt.started_at
        span = (setup_spans or {}).get(attempt.number)
        if span is not None:
            setup_end = min(max(span[1], begin), max(stop, begin))
            segments.append(("setup", begin, setup_end))
            begin = setup_end
        segments.append(("running", begin, max(stop, begin)))
    last_run = max([finished, *(a.finished_at or 0.0 for a in attempts)])
    for instance in instances:
        if instance.ready_at is None:
            continue
        gone = instance.ended_at
        if gone is None and job.terminal:
            gone = now
        if gone is not None and gone > last_run:
            segments.append(("teardown", last_run, gone))
    return sorted(segments, key=lambda s: (s[1], s[2]))


def cloud_phases(
    instance: InstanceRecord, now: float, history: Sequence[Transition] = ()
) -> list[dict[str, Any]]:
    """An instance's phases with their durations: from its transition history (provision,
    ssh, bootstrap, dispatch, run, teardown) where it tells them, else from its ledger
    times."""
    from_history = [
        {
            "phase": phase.name,
            "start": phase.started_at,
            "seconds": phase.seconds(now),
            "open": phase.ended_at is None,
        }
        for phase in history_phases(history)
    ]
    if from_history:
        return from_history
    marks = [
        ("requested", instance.created_at, instance.launched_at),
        ("booting", instance.launched_at, instance.ready_at),
        ("in use", instance.ready_at, instance.ended_at),
    ]
    phases = []
    for name, start, stop in marks:
        if start is None:
            continue
        end = stop if stop is not None else (instance.ended_at or now)
        phases.append(
            {"phase": name, "start": start, "seconds": max(0.0, end - start), "open": stop is None}
        )
    return phases

"""The firing pass against a real SQLite store, in process, with the clock passed in: catch-up
after an outage, two deciders racing for the same ticks, and budget accounting from the cost
ledger's instance rows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gpulayer.control.paths import HomeLayout
from gpulayer.control.schedule_firing import ScheduleFiring
from gpulayer.control.schedule_service import Loaded, ScheduleService
from gpulayer.control.service import ControlService
from gpulayer.control.store import Store

JOB = {
    "workload": {"kind": "command", "command": ["true"]},
    "placement": {"target": "remote", "on_unschedulable": "fail"},
}


def plane(path: Path) -> ScheduleService:
    layout = HomeLayout(path.parent / f"home-{path.stem}").ensure()
    service = ControlService(Store(f"sqlite:///{path}"), layout)
    schedules = ScheduleService(service)
    return schedules


def ten_seconds_ago_tick() -> float:
    return (int(time.time()) // 10) * 10 - 60.0


def outcomes(schedules: ScheduleService, name: str) -> list[tuple[float, str]]:
    record = schedules.store.find_schedule(name)
    return sorted((r.tick, r.outcome) for r in schedules.store.schedule_runs(record.id))


@pytest.mark.parametrize("catch_up", ["latest", "none"])
def test_ticks_missed_before_the_loop_started(tmp_path: Path, catch_up: str) -> None:
    schedules = plane(tmp_path / "state.db")
    record, _ = schedules.apply(
        {"name": "c", "cron": "*/10 * * * * *", "job": JOB, "catch_up": catch_up}
    )
    start = ten_seconds_ago_tick()
    schedules.store.update_schedule(record.id, watermark=start)
    firing = ScheduleFiring(schedules)
    firing.started_at = time.time()
    upcoming = firing.run_pass(time.time())
    found = outcomes(schedules, "c")
    assert [tick for tick, _ in found] == [start + 10 * i for i in range(1, len(found) + 1)]
    assert len(found) >= 6
    expected_last = "created" if catch_up == "latest" else "catch_up"
    assert [o for _, o in found] == ["catch_up"] * (len(found) - 1) + [expected_last]
    assert upcoming == found[-1][0] + 10
    # A second decider over the same store finds nothing left to decide.
    other = ScheduleFiring(schedules)
    other.run_pass(time.time())
    assert outcomes(schedules, "c") == found


def test_two_deciders_with_the_same_view_make_one_job_per_tick(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    first, second = plane(path), plane(path)  # two services (as two servers) on one database
    record, _ = first.apply({"name": "race", "cron": "*/10 * * * * *", "job": JOB})
    start = ten_seconds_ago_tick()
    first.store.update_schedule(record.id, watermark=start)
    stale = first.load("race")  # both read the watermark before either decides
    now = time.time()
    made = [
        service.fire_due(Loaded(stale.record, stale.schedule), now, start)[1]
        for service in (first, second)
    ]
    assert made[0] >= 6 and made[1] == 0
    jobs = first.store.list_jobs(limit=1000)
    ticks = [j.labels["gpulayer.dev/tick"] for j in jobs]
    assert len(ticks) == len(set(ticks)) == made[0]


def _cloud_job(hourly: float, timeout: float) -> dict[str, Any]:
    return {
        "workload": {"kind": "command", "command": ["true"]},
        "placement": {
            "target": "cloud",
            "max_hourly_cost": hourly,
            "provisioning": {"provisioning_timeout_seconds": 60},
        },
        "timeout_seconds": timeout,
    }


def test_budget_counts_the_ledger_and_skips_with_budget_exhausted(tmp_path: Path) -> None:
    schedules = plane(tmp_path / "state.db")
    document = {
        "name": "b",
        "cron": "*/10 * * * * *",
        "job": _cloud_job(36.0, 30.0),  # worst case 36 x 90 / 3600 = 0.9
        "budget": {"max_cost": 1.0, "period": "day"},
        "concurrency": "allow",
    }
    record, _ = schedules.apply(document)
    job_id = schedules.trigger("b")  # no provider here: the job ends at once, costing nothing
    loaded = schedules.load("b")
    state = schedules.budget_state(loaded, time.time())
    assert state is not None and state.spent == 0.0 and state.fits
    # Its rented machine, as the ledger has it: 20 s at 36 per hour cost 0.2.
    now = time.time()
    schedules.store.record_instance(
        request_id="r-1",
        job_id=job_id,
        owner="test",
        provider="ssh",
        state="terminated",
        hourly_price=36.0,
        launched_at=now - 30,
        ended_at=now - 10,
    )
    state = schedules.budget_state(loaded, time.time())
    assert state is not None and state.spent == pytest.approx(0.2) and not state.fits
    with pytest.raises(Exception, match="budget_exhausted"):
        schedules.trigger("b")
    runs = schedules.store.schedule_runs(record.id)
    assert [r.outcome for r in runs] == ["budget_exhausted", "created"]


def test_resuming_by_apply_or_resume_does_not_catch_up(tmp_path: Path) -> None:
    schedules = plane(tmp_path / "state.db")
    document = {"name": "p", "cron": "*/10 * * * * *", "job": JOB, "suspend": True}
    record, _ = schedules.apply(document)
    for resume in (
        lambda: schedules.apply({**document, "suspend": False}),
        lambda: schedules.resume("p"),
    ):
        schedules.store.update_schedule(record.id, watermark=ten_seconds_ago_tick(), suspend=True)
        resume()
        firing = ScheduleFiring(schedules)
        firing.started_at = time.time()
        firing.run_pass(time.time())
        assert [o for _, o in outcomes(schedules, "p") if o == "created"] == []
    assert schedules.store.get_schedule(record.id).watermark >= time.time() - 5


def test_a_catch_up_later_than_its_starting_deadline_is_skipped(tmp_path: Path) -> None:
    schedules = plane(tmp_path / "state.db")
    document = {"name": "d", "cron": "*/10 * * * * *", "job": JOB, "starting_deadline_seconds": 0.5}
    record, _ = schedules.apply(document)
    if time.time() % 10 < 1:
        time.sleep(1)  # the newest missed tick is over the deadline by at least half a second
    schedules.store.update_schedule(record.id, watermark=ten_seconds_ago_tick())
    firing = ScheduleFiring(schedules)
    firing.started_at = time.time()
    firing.run_pass(time.time())
    found = [o for _, o in outcomes(schedules, "d")]
    assert found[-1] == "deadline" and set(found[:-1]) == {"catch_up"}


def _kept_bundle(schedules: ScheduleService, folder: Path) -> str:
    from gpulayer.protocol.bundle import create_bundle

    folder.mkdir()
    (folder / "eval.py").write_text("print('eval')\n")
    upload = schedules.layout.root / "incoming" / "up.tar.gz"
    create_bundle(folder, upload)
    digest: str = schedules.service.bundles.keep(upload)
    return digest


def test_a_kept_bundle_outlives_the_apply_and_every_run_names_it(tmp_path: Path) -> None:
    schedules = plane(tmp_path / "state.db")
    service, bundles = schedules.service, schedules.service.bundles
    digest = _kept_bundle(schedules, tmp_path / "project")
    kept = bundles.path(digest)
    schedules.apply({"name": "k", "cron": "0 0 1 1 *", "job": JOB}, bundle_digest=digest)
    assert kept.is_file()  # others may still link it: the schedule copies, never takes
    first = schedules.trigger("k")
    assert service.store.get_job(first).bundle_digest == digest
    assert service.jobs.bundle_path(first) == kept
    service.jobs.delete_jobs([first])  # no worker: unschedulable, so already finished
    assert not kept.exists()  # its last job went, and the kept file with it
    second = schedules.trigger("k")  # the schedule's own copy is kept again
    assert kept.is_file() and service.store.get_job(second).bundle_digest == digest
    assert service.jobs.bundle_path(second) == kept


def test_a_one_shot_upload_is_used_up_and_a_missing_digest_refused(tmp_path: Path) -> None:
    from gpulayer.errors import UsageError
    from gpulayer.protocol.bundle import create_bundle

    schedules = plane(tmp_path / "state.db")
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "eval.py").write_text("print('eval')\n")
    upload = schedules.layout.root / "incoming" / "one-shot.tar.gz"
    upload.parent.mkdir(parents=True, exist_ok=True)
    create_bundle(folder, upload)
    schedules.apply({"name": "u", "cron": "0 0 1 1 *", "job": JOB}, bundle=upload)
    assert not upload.exists()
    job_id = schedules.trigger("u")
    digest = schedules.service.store.get_job(job_id).bundle_digest
    assert digest is not None and schedules.service.bundles.has(digest)
    missing = "f" * 64
    with pytest.raises(UsageError, match=f"bundle_id: sha256:{missing}"):
        schedules.apply({"name": "m", "cron": "0 0 1 1 *", "job": JOB}, bundle_digest=missing)
    assert [loaded.record.name for loaded in schedules.all()] == ["u"]

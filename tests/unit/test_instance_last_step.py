"""An instance's last lifecycle step, as `gpulayer status` and `instances --json` show it: read
from the result the step stored with the instance."""

from __future__ import annotations

from gpulayer.cli.render import last_step_line
from gpulayer.cloud.lifecycle.records import InstanceRecord
from gpulayer.cloud.lifecycle.step_result import StepError, done, failed
from gpulayer.control.views import lifecycle_view


def _record(**values: object) -> InstanceRecord:
    base: dict[str, object] = dict(
        request_id="r-1",
        job_id="j-1",
        owner="o-1",
        provider="aws",
        region="us-east-1",
        zone=None,
        instance_type="g5.xlarge",
        instance_id="i-0abc",
        state="bootstrapping",
        ssh_host=None,
        key_path=None,
        hourly_price=1.0,
        currency="USD",
        spot=False,
        tags={},
        created_at=100.0,
        launched_at=110.0,
        ready_at=None,
        ended_at=None,
        note=None,
    )
    base.update(values)
    return InstanceRecord(**base)  # type: ignore[arg-type]


def test_a_failed_step_is_shown_with_its_error_and_backoff() -> None:
    result = failed(
        "prepare",
        200.0,
        StepError("TimeoutError", "ssh did not answer in 30 s"),
        not_before=260.0,
    )
    view = lifecycle_view(_record(**result.columns()), [], now=210.0)
    assert view["last_step"] == {
        "step": "prepare",
        "at": "1970-01-01T00:03:20.000+00:00",
        "outcome": "failed",
        "note": "ssh did not answer in 30 s",
        "error": "TimeoutError",
        "moved_to": None,
        "not_before": "1970-01-01T00:04:20.000+00:00",
    }
    assert last_step_line(view) == "last step: prepare failed: ssh did not answer in 30 s"


def test_no_step_or_an_unreadable_result_shows_none() -> None:
    assert lifecycle_view(_record(), [], now=210.0)["last_step"] is None
    unreadable = _record(last_step="check", last_step_result='{"shape": "newer"}')
    assert lifecycle_view(unreadable, [], now=210.0)["last_step"] is None
    launched = done("launch", 105.0, "launched i-0abc", move_to="booting")
    assert lifecycle_view(_record(**launched.columns()), [], 210.0)["last_step"]["moved_to"] == (
        "booting"
    )

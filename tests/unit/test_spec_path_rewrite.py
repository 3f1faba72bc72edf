"""Making a job file's local paths absolute (what `submit`, `schedule apply` and the SDK do
before the data leaves the process) never changes whether it is valid: the control plane then
judges what `gpulayer validate` judged. An empty artifact once became the file's folder."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer.errors import SpecError
from gpulayer.sdk.paths import absolutize_paths
from gpulayer.spec.validate import validate_spec
from tests.support.spec_strategies import EDITS, edge_specs


def _verdict(data: dict[str, Any]) -> list[str]:
    try:
        validate_spec(copy.deepcopy(data))
    except SpecError as exc:
        return [line.split(":", 1)[0] for line in exc.lines]
    return []


def test_an_empty_artifact_stays_empty() -> None:
    data = {
        "workload": {"kind": "command", "command": ["true"]},
        "inputs": [{"artifact": "", "path": "data"}, {"artifact": "d.csv", "path": "d"}],
    }
    absolutize_paths(data, "/home/me/project")
    assert [i["artifact"] for i in data["inputs"]] == ["", "/home/me/project/d.csv"]


@pytest.mark.parametrize("field", ["input-artifact", "input-path", "distributed-script", "name"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(draws=st.data())
def test_making_paths_absolute_keeps_the_verdict(field: str, draws: st.DataObject) -> None:
    assert field in EDITS
    data = draws.draw(edge_specs(field), label=field)
    rewritten = absolutize_paths(copy.deepcopy(data), "/home/me/project")
    assert _verdict(rewritten) == _verdict(data)

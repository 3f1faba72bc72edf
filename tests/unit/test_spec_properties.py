"""Properties: valid specs survive a dump/validate round trip; junk raises only ValidationError."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulayer.spec import JobSpec
from tests.support.spec_strategies import json_scalars, specs


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_valid_specs_round_trip(data: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(data)
    dumped = spec.model_dump(mode="json")
    again = JobSpec.model_validate(json.loads(json.dumps(dumped)))
    assert again.model_dump(mode="json") == dumped


fuzz_json = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "workload",
                    "kind",
                    "command",
                    "resources",
                    "placement",
                    "env",
                    "secrets",
                    "inputs",
                    "retry",
                    "gpu_count",
                    "accelerator",
                    "profile",
                    "entrypoint",
                    "function",
                    "target",
                    "path",
                    "artifact",
                    "x",
                ]
            )
            | st.text(max_size=5),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(fuzz_json)
def test_fuzzed_json_raises_only_validation_error(data: Any) -> None:
    with contextlib.suppress(ValidationError):
        JobSpec.model_validate(data)


@settings(max_examples=100, deadline=None)
@given(
    specs(),
    st.sampled_from(["workload", "resources", "placement", "retry"]),
    st.text(min_size=1, max_size=6),
)
def test_unknown_field_anywhere_is_rejected(data: dict[str, Any], section: str, key: str) -> None:
    section_data = data.setdefault(section, {"max_attempts": 1} if section == "retry" else {})
    if key in section_data or key in {"kind"}:
        return
    section_data[key] = 1
    try:
        JobSpec.model_validate(data)
    except ValidationError as exc:
        assert any(e["type"] == "extra_forbidden" or e["loc"][-1] == key for e in exc.errors())
    else:
        raise AssertionError(f"{section}.{key} was accepted")

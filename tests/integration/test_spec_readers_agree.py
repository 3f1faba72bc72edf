"""Three readers of the JobSpec contract agree on every generated spec: the published JSON
Schema read by Python's jsonschema and by ajv (JavaScript, through one node process), and
`gpulayer validate` itself.

The specs come from tests/support/spec_strategies.py, their strings and numbers at the edges
where readers differ (a trailing newline, Unicode digits, empty strings, length and number
bounds, almost-relative paths). A disagreement is a bug in the schema's generation
(gpulayer/spec/schema.py) or in a pattern, never something to excuse here.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpulayer.errors import SpecError
from gpulayer.schedules.validate import schedule_json_schema, validate_schedule
from gpulayer.spec.schema import jobspec_schema
from gpulayer.spec.validate import validate_spec
from tests.support.ajv import INSTALL_HINT, Ajv, node_binary
from tests.support.spec_strategies import EDITS, edge_specs

_COMMAND = {"kind": "command", "command": ["true"]}


def _node() -> str:
    node = node_binary()
    if node is None:
        pytest.skip(
            "node is not installed, so the JavaScript reading of the schema cannot be checked "
            f"(CI has node 20; then {INSTALL_HINT})"
        )
    return node


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    document = jobspec_schema()
    jsonschema.Draft202012Validator.check_schema(document)
    return document


@pytest.fixture(scope="module")
def python_reader(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return jsonschema.Draft202012Validator(schema, format_checker=checker)


@pytest.fixture(scope="module")
def ajv(schema: dict[str, Any]) -> Iterator[Ajv]:
    reader = Ajv(schema, _node())
    yield reader
    reader.close()


def _validate_errors(data: Any) -> list[str]:
    try:
        validate_spec(copy.deepcopy(data))
    except SpecError as exc:
        return list(exc.lines)
    return []


def _readings(
    data: Any, python_reader: jsonschema.Draft202012Validator, ajv: Ajv
) -> dict[str, list[str]]:
    # Every reader reads the same JSON text, as a file on disk would give it to them.
    text = json.dumps(data)
    return {
        "jsonschema": [e.message for e in python_reader.iter_errors(json.loads(text))],
        "ajv": ajv.errors(json.loads(text)),
        "validate": _validate_errors(json.loads(text)),
    }


def _agree(readings: dict[str, list[str]], data: Any) -> None:
    verdicts = {reader: not errors for reader, errors in readings.items()}
    assert len(set(verdicts.values())) == 1, (
        f"readers disagree on {json.dumps(data)}: "
        + "; ".join(
            f"{reader} {'accepts' if ok else 'refuses: ' + ' | '.join(readings[reader])[:300]}"
            for reader, ok in verdicts.items()
        )
    )


# Each of these was read differently by two of the three before the patterns were exact.
KNOWN: list[dict[str, Any]] = [
    {"name": "job\n", "workload": _COMMAND},
    {
        "workload": _COMMAND,
        "resources": {"accelerator": "cuda", "min_cuda_compute_capability": "\u0668.\u0660"},
    },
    {"workload": _COMMAND, "resources": {"accelerator": "cuda", "gpu_models": ["A100\n"]}},
    {"workload": _COMMAND, "inputs": [{"artifact": "", "path": "d"}]},
    {"workload": _COMMAND, "inputs": [{"artifact": "s3://b/k", "path": "a/..\n"}]},
    {"workload": _COMMAND, "inputs": [{"artifact": "s3://b/k", "path": "\xe9:x"}]},
    {"workload": _COMMAND, "inputs": [{"artifact": "s3://b/k", "path": ".\x1c"}]},
    {"workload": _COMMAND, "env": {"A\n": "x"}},
    {"workload": {"kind": "function", "entrypoint": "m:f\n"}},
    {"workload": _COMMAND, "setup": {"requirements_file": "/etc/shadow"}},
    {"workload": _COMMAND, "setup": {"find_links": ["../wheels"]}},
    {"workload": _COMMAND, "setup": {"index_url": "https://pypi.org/simple\n"}},
    {"workload": _COMMAND, "resources": {"os": ["LINUX\n"]}},
    {"workload": _COMMAND, "resources": {"frameworks": {"torch\n": ""}}},
]


@pytest.mark.parametrize("data", KNOWN, ids=[json.dumps(k)[:60] for k in KNOWN])
def test_readers_agree_on_known_lookalikes(
    data: dict[str, Any], python_reader: jsonschema.Draft202012Validator, ajv: Ajv
) -> None:
    _agree(_readings(data, python_reader, ajv), data)


@pytest.mark.parametrize("field", sorted(EDITS))
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(draws=st.data())
def test_readers_agree_on_generated_specs(
    field: str,
    draws: st.DataObject,
    python_reader: jsonschema.Draft202012Validator,
    ajv: Ajv,
) -> None:
    """Specs with ``field`` at an edge (a trailing newline, other scripts' digits, empty,
    bounds, almost-relative paths: tests/support/spec_strategies.py)."""
    data = draws.draw(edge_specs(field), label=field)
    _agree(_readings(data, python_reader, ajv), data)


def test_the_schedule_schema_reads_its_job_as_the_jobspec_schema_does() -> None:
    """The Schedule's published schema holds the JobSpec's rules for its job, and ajv
    compiles it as strictly as the JobSpec's."""
    document = schedule_json_schema()
    jsonschema.Draft202012Validator.check_schema(document)
    python_reader = jsonschema.Draft202012Validator(document)
    reader = Ajv(document, _node())
    try:
        for job_name, schedule_name, valid in (
            ("nightly", "nightly", True),
            ("job\n", "nightly", False),
            ("nightly", "nightly\n", False),
            ("n\u0668", "nightly", False),
        ):
            schedule = {"name": schedule_name, "cron": "0 4 * * *"}
            schedule["job"] = {"name": job_name, "workload": _COMMAND}
            try:
                validate_schedule(copy.deepcopy(schedule))
                validated = True
            except SpecError:
                validated = False
            python_ok = not list(python_reader.iter_errors(schedule))
            ajv_ok = not reader.errors(schedule)
            assert (validated, python_ok, ajv_ok) == (valid, valid, valid), schedule
    finally:
        reader.close()

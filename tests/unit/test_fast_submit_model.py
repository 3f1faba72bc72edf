"""The fast `gpulayer submit` path is held to typer's model of the command, the one source:
its flag tables name exactly typer's flags, and over generated flag lists it either leaves the
line to typer or reads it exactly as typer does."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpulayer.cli import fast_submit, submit_run
from gpulayer.cli.app import app


def _submit_options() -> dict[str, Any]:
    command = typer.main.get_command(app).commands["submit"]  # type: ignore[attr-defined]
    return {
        opt: param
        for param in command.params
        if param.param_type_name == "option"
        for opt in param.opts
    }


def test_the_fast_tables_name_exactly_typers_flags() -> None:
    options = _submit_options()
    fast = set(fast_submit._VALUES) | set(fast_submit._LISTS) | set(fast_submit._DETACH)
    assert fast | (fast_submit.LEFT_TO_TYPER - {"--help"}) == set(options)
    assert not fast & fast_submit.LEFT_TO_TYPER
    for flag in fast_submit._LISTS:
        assert options[flag].multiple, f"{flag} is a list here and a single value in typer"
    for flag in fast_submit._VALUES:
        assert not options[flag].multiple and not options[flag].is_flag, flag
    for flag in fast_submit._DETACH:
        assert options[flag].is_flag, flag


_VALUE_FLAGS = sorted(set(fast_submit._VALUES) | set(fast_submit._LISTS))
_SWITCHES = sorted(set(fast_submit._DETACH) | (fast_submit.LEFT_TO_TYPER - {"--help"}))
_NUMBERS = st.sampled_from(
    ["2", "0", "-1", "1e400", "inf", "nan", "0.5", "1_000", " 3", "\u0663", "3.0", "0x10"]
)
_words = st.sampled_from(
    [
        "x",
        "A=1",
        "a=",
        "=b",
        "local",
        "cloud",
        "remote",
        "0-3%2",
        "1,3",
        "http://h:1",
        "job.yaml",
        "\u00e9",
        "a b",
        "",
        "-x",
        "--",
    ]
)
_NUMERIC_FLAGS = {"--gpus", "--timeout", "--max-hourly-cost"}


@st.composite
def _flag_lines(draw: st.DrawFn) -> list[str]:
    line = ["submit"]
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.integers(0, 5)) == 0:
            line.append(draw(st.sampled_from(_SWITCHES)))
            continue
        flag = draw(st.sampled_from(_VALUE_FLAGS))
        value = draw(_NUMBERS if flag in _NUMERIC_FLAGS and draw(st.integers(0, 3)) else _words)
        line += [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]
    if draw(st.integers(0, 5)):
        line += ["--", *draw(st.lists(_words, min_size=1, max_size=3))]
    return line


def _reading_of(args: list[str], monkeypatch: pytest.MonkeyPatch, fast: bool) -> Any:
    """What run_submit is called with, or how the command ended without calling it."""
    seen: list[dict[str, Any]] = []

    def record(**kwargs: Any) -> int:
        seen.append(kwargs)
        return 0

    with monkeypatch.context() as patched:
        patched.setattr(submit_run, "run_submit", record)
        if fast:
            found = fast_submit.parse(args)
            assert found is not None
            if fast_submit.run(found) is None:
                return "left to typer"
        else:
            result = CliRunner().invoke(app, args)
            if result.exit_code != 0:
                return ("refused", result.exit_code)
    assert len(seen) == 1
    return seen[0]


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_flag_lines())
@example(args=["submit", "--timeout", "1e400", "--", "x"])
@example(args=["submit", "--gpus=-1", "--max-hourly-cost", "nan", "--", "x"])
@example(args=["submit", "--gpus", "\u0663", "-d", "--", "x"])
def test_a_line_the_fast_path_reads_is_read_as_typer_reads_it(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    if fast_submit.parse(args) is None:
        return  # typer reads it, the one reading there is
    fast = _reading_of(args, monkeypatch, fast=True)
    if fast == "left to typer":
        return
    assert fast == _reading_of(args, monkeypatch, fast=False), args

"""The SDK's builders, @remote and the Trainer take a job's setup (pure: specs only)."""

from __future__ import annotations

import pytest

import gpulayer as gl
from gpulayer.errors import SpecError
from gpulayer.sdk.builders import command

SETUP = {"pip": ["torch==2.13.0"], "index_url": "https://pypi.example.org/simple"}


def _train(config: dict[str, int]) -> None:
    return None


def test_a_builder_takes_setup_field_by_field() -> None:
    spec = command(["python", "train.py"]).setup(pip=["numpy>=2"]).setup(timeout_seconds=600)
    assert spec.spec().setup.pip == ["numpy>=2"]
    assert spec.spec().setup.timeout_seconds == 600


def test_remote_functions_and_the_trainer_carry_setup() -> None:
    fn = gl.remote(_train, setup=SETUP)
    assert fn.builder({}).spec().setup.index_url == SETUP["index_url"]
    trainer = gl.Trainer(_train, num_workers=2, setup=SETUP)
    assert trainer.builder({"epochs": 1}).spec().setup.pip == ["torch==2.13.0"]


def test_a_bad_setup_names_its_field() -> None:
    with pytest.raises(SpecError, match=r"setup\.pip"):
        command(["true"]).setup(pip="numpy").spec()

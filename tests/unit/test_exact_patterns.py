"""Each JobSpec pattern means one thing: gpulayer's whole-value ASCII match, and its published
form searched as Python's jsonschema searches it, give the same answer on any string."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpulayer.cloud.offer import OfferQuery
from gpulayer.spec import models
from gpulayer.spec.patterns import ExactPattern
from tests.support.spec_strategies import ODD

PATTERNS = {name: value for name, value in vars(models).items() if isinstance(value, ExactPattern)}
texts = st.lists(
    st.sampled_from(ODD) | st.characters(codec="ascii") | st.sampled_from(["8", "a", "A", "_"]),
    max_size=8,
).map("".join)


def test_the_models_patterns_are_all_here() -> None:
    assert {"NAME", "ENV_NAME", "ENTRYPOINT", "CAPABILITY", "GPU_MODEL", "INDEX_URL"} <= set(
        PATTERNS
    )


@pytest.mark.parametrize("name", sorted(PATTERNS))
@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_the_published_pattern_reads_as_the_validator_does(name: str, text: str) -> None:
    pattern = PATTERNS[name]
    published = re.search(pattern.json_pattern, text) is not None
    assert published == pattern.matches(text), (name, text)


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        (models.NAME, "job\n"),
        (models.NAME, "job\r\n"),
        (models.NAME, "j\u0661"),
        (models.CAPABILITY, "\u0668.\u0660"),
        (models.CAPABILITY, "\uff18.0"),
        (models.CAPABILITY, "8.0\n"),
        (models.CAPABILITY, " 8.0"),
        (models.ENV_NAME, "A\n"),
        (models.ENTRYPOINT, "m:f\n"),
        (models.GPU_MODEL, "A100\n"),
        (models.INDEX_URL, "https://x\n"),
    ],
)
def test_lookalikes_do_not_match(pattern: ExactPattern, value: str) -> None:
    assert not pattern.matches(value)
    assert re.search(pattern.json_pattern, value) is None


@pytest.mark.parametrize("body", [r"\d+", r"[a-z]+$", r"\w", r"(?i)abc", r"(?P<x>a)", r"a\Z"])
def test_syntax_the_two_engines_read_differently_is_refused(body: str) -> None:
    with pytest.raises(ValueError, match="not read alike"):
        ExactPattern(body, "anything")


def test_an_offer_query_reads_capabilities_as_the_jobspec_does() -> None:
    for value in ("\u0668.\u0660", "8.0\n"):
        with pytest.raises(ValidationError):
            OfferQuery.model_validate({"min_cuda_compute_capability": value})
